"""Training data: the tiny model's counting task and byte-level text (token files prepared with a
real tokenizer: `text.datasets.TokenDataset`).

Both sources hand out *global* batches drawn from one seeded `torch.Generator`. Under
DistributedDataParallel every rank draws the same global batch and keeps its own contiguous slice
of rows (`training.distributed.shard`), so the union of the ranks' batches is exactly the batch
a single process would train on; that is what lets N processes reproduce single-process training.

The counting task (default for the 8-token vocabulary)
-------------------------------------------------------
Every sequence is five tokens, `<bos> x y z <eos>`:

    x ~ uniform over {A, B, C, D}
    y = next(x), z = next(y)        with next: A -> B -> C -> D -> A (cyclic)

e.g. `<bos> C D A <eos>`. Inputs are the first four ids, targets the last four:

    input:  <bos> x y z
    target: x     y z <eos>

Entropy floor: the best possible predictor is uncertain only about x (4 equally likely letters,
ln 4 nats); y, z and <eos> are determined by the prefix (0 nats). The mean cross-entropy per target
token of the optimal predictor is therefore (ln 4 + 0 + 0 + 0) / 4 = ln(4)/4 = 0.34657 nats.
A fresh model predicts about uniformly over V = 8 tokens: ln 8 = 2.0794 nats.

Byte-level text (and tokenized text)
------------------------------------
A text file's bytes are the ids (V >= 256); `TokenText` encodes it with a real tokenizer
instead (V >= the tokenizer's ids) and windows its ids the same way. The first
`1 - val_fraction` of the bytes train, the rest validate; a batch is B random windows of `T + 1`
consecutive bytes (T = max_seq_len), split into inputs `w[:T]` and targets `w[1:]`.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch

from ..console import literal
from ..errors import ConfigError
from ..objective import next_token_batch  # the shift the gate's loss_alignment check proves
from . import tokenizer as vocab

LETTERS = ("A", "B", "C", "D")
SEQUENCE_LENGTH = 5  # <bos> x y z <eos>


def _next_letter(letter: str) -> str:
    return LETTERS[(LETTERS.index(letter) + 1) % len(LETTERS)]


class CountingTask:
    """`<bos> x next(x) next(next(x)) <eos>` with x uniform over A-D (see the module docstring)."""

    name = "counting"
    held_out = False  # evaluated on every sequence it has: no held-out split
    tokenizer = "tiny-vocab"
    seq_len = SEQUENCE_LENGTH - 1  # T = 4 input positions
    vocab_size = len(vocab.TINY_VOCAB)
    eval_label = "loss (exact, over the 4 sequences)"

    def __init__(self) -> None:
        # Every sequence the task can produce, one per first letter, each with probability 1/4.
        rows = []
        for x in LETTERS:
            y = _next_letter(x)
            z = _next_letter(y)
            rows.append(vocab.encode(f"<bos> {x} {y} {z} <eos>"))
        self.sequences = torch.tensor(rows, dtype=torch.long)  # (4, 5)

    @staticmethod
    def entropy_floor() -> float:
        """Mean per-target cross-entropy of the optimal predictor: (ln 4 + 0 + 0 + 0) / 4."""
        return math.log(len(LETTERS)) / (SEQUENCE_LENGTH - 1)

    def check_model(self, vocab_size: int, max_seq_len: int) -> None:
        if vocab_size < self.vocab_size or max_seq_len < self.seq_len:
            raise ConfigError(
                f"the counting task needs vocab_size >= {self.vocab_size} and max_seq_len >= "
                f"{self.seq_len}; the model has vocab_size={vocab_size}, max_seq_len={max_seq_len}")

    def batch(self, generator: torch.Generator, batch_size: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """A global batch: inputs and targets, each (B, 4)."""
        which = torch.randint(len(self.sequences), (batch_size,), generator=generator)  # (B,)
        return next_token_batch(self.sequences[which])  # (B, 5) -> (B, 4), (B, 4)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every sequence once with its probability: the exact expected loss, no sampling noise."""
        weights = torch.full((len(self.sequences),), 1.0 / len(self.sequences))
        return (*next_token_batch(self.sequences), weights)

    def describe_pair(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[str]:
        """One aligned input/target pair, decoded token by token in columns."""
        ins = [vocab.decode([i]) for i in inputs.tolist()]
        outs = [vocab.decode([t]) for t in targets.tolist()]
        width = max(len(s) for s in ins + outs)
        return ["input:  " + " ".join(s.ljust(width) for s in ins).rstrip(),
                "target: " + " ".join(s.ljust(width) for s in outs).rstrip()]

    def state(self) -> dict:
        return {"task": self.name, "tokenizer": self.tokenizer}

    def checkpoint_files(self) -> dict[str, bytes]:
        """The tokenizer's manifest, to be saved beside the weights."""
        return vocab.Tokenizer(self.tokenizer).folder_files()


class ByteText:
    """Random windows of T + 1 bytes from a text file, split into train and validation."""

    name = "bytes"
    tokenizer = "bytes"
    unit = "bytes"
    held_out = True  # evaluated on the file's last val_fraction: a validation loss
    vocab_size = 256
    eval_windows = 64
    eval_label = "validation loss"

    def __init__(self, path: str | Path, seq_len: int, *, val_fraction: float = 0.1,
                 seed: int = 0) -> None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"--text file {str(path)!r} does not exist"
                              + (" (it is a folder)" if path.is_dir() else ""))
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"val_fraction={val_fraction} must lie strictly between 0 and 1")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"--text file {str(path)!r} cannot be read: {exc.strerror}") from None
        if not raw:
            raise ConfigError(f"--text file {str(path)!r} is empty (0 bytes); training needs at "
                              f"least one window of max_seq_len + 1 = {seq_len + 1} "
                              f"{self.unit} for training and one for validation")
        self.sha256 = hashlib.sha256(raw).hexdigest()  # a resumed run must see the same text
        data = self._ids(raw, path)  # (N,) int64
        self.path, self.seq_len = path, seq_len
        split = int(len(data) * (1.0 - val_fraction))
        self.train, self.val = data[:split], data[split:]
        need = seq_len + 1
        for part, tensor in (("training", self.train), ("validation", self.val)):
            if len(tensor) < need:
                raise ConfigError(
                    f"{str(path)!r} has {len(data)} {self.unit}: its {part} part ({len(tensor)} "
                    f"{self.unit}, val_fraction={val_fraction}) is shorter than one window of "
                    f"max_seq_len + 1 = {need} {self.unit}")
        # Fixed validation windows from their own generator: evaluating never moves the training
        # sampler, so a run with and without evaluation (or a resumed run) sees the same batches.
        val_gen = torch.Generator().manual_seed(seed + 1)
        starts = torch.randint(len(self.val) - need + 1, (self.eval_windows,), generator=val_gen)
        windows = self.val[starts[:, None] + torch.arange(need)]  # (W, T+1)
        self._eval = next_token_batch(windows)

    def _ids(self, raw: bytes, path: Path) -> torch.Tensor:
        """The file's ids (N,): its bytes."""
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()

    def check_model(self, vocab_size: int, max_seq_len: int) -> None:
        if vocab_size < self.vocab_size:
            raise ConfigError(
                "--text trains a byte-level model, so vocab_size must be >= 256 (one id per "
                f"byte); the model has vocab_size={vocab_size}. Use e.g. --config with "
                "vocab_size 256")

    def batch(self, generator: torch.Generator, batch_size: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        need = self.seq_len + 1
        starts = torch.randint(len(self.train) - need + 1, (batch_size,), generator=generator)
        return next_token_batch(self.train[starts[:, None] + torch.arange(need)])  # (B, T+1)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs, targets = self._eval
        return inputs, targets, torch.full((len(inputs),), 1.0 / len(inputs))

    @staticmethod
    def entropy_floor() -> None:
        return None  # unknown for natural text

    def describe_pair(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[str]:
        """The pair as two console lines (the text escaped: `literal`)."""
        show = lambda ids: repr(bytes(ids.tolist()).decode("utf-8", errors="replace"))  # noqa: E731
        return [literal(f"input:  {show(inputs)}"), literal(f"target: {show(targets)}")]

    def state(self) -> dict:
        return {"task": self.name, "tokenizer": self.tokenizer, "text": str(self.path),
                "text_sha256": self.sha256}

    def checkpoint_files(self) -> dict[str, bytes]:
        """The tokenizer's manifest, to be saved beside the weights."""
        return vocab.Tokenizer(self.tokenizer).folder_files()


class TokenText(ByteText):
    """A text file encoded whole with a real tokenizer (a tokenizer.json, GPT-2's vocab.json +
    merges.txt), then split and windowed as ByteText does, in tokens instead of bytes: the first
    `1 - val_fraction` of the ids train, the rest validate. The tokenizer goes into every
    checkpoint, so `sample` reads the model's ids as they were trained.

    The ids are held in memory (one int64 per token); for a corpus larger than memory,
    `decoder-audit prepare` writes a memory-mapped dataset (`--data`)."""

    name = "tokens"
    unit = "tokens"

    def __init__(self, path: str | Path, seq_len: int, tokenizer: vocab.Tokenizer, *,
                 val_fraction: float = 0.1, seed: int = 0) -> None:
        self.vocab = tokenizer
        self.tokenizer, self.vocab_size = tokenizer.name, tokenizer.vocab_size
        super().__init__(path, seq_len, val_fraction=val_fraction, seed=seed)

    def _ids(self, raw: bytes, path: Path) -> torch.Tensor:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--text file {str(path)!r} is not UTF-8 text ({exc}); a "
                              "tokenizer encodes text") from None
        return torch.tensor(self.vocab.encode(text), dtype=torch.long)  # (N,)

    def check_model(self, vocab_size: int, max_seq_len: int) -> None:
        self.vocab.check_fits(vocab_size, f"the model trained on --text {str(self.path)!r}")

    def describe_pair(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[str]:
        return describe_ids(self.vocab, inputs, targets)

    def state(self) -> dict:
        return {**super().state(), "tokenizer_sha256": self.vocab.sha256}

    def checkpoint_files(self) -> dict[str, bytes]:
        """The tokenizer's own files and manifest, saved beside the weights."""
        return self.vocab.folder_files()


def describe_ids(tokenizer: vocab.Tokenizer, inputs: torch.Tensor, targets: torch.Tensor,
                 shown: int = 8) -> list[str]:
    """The first `shown` positions of an input/target pair (T,), each id decoded on its own,
    input over target in columns: two console lines, the decoded text escaped (`literal`) after
    the columns are padded, so brackets in it print as they are and keep their width."""
    ins = [repr(tokenizer.decode([i])) for i in inputs[:shown].tolist()]
    outs = [repr(tokenizer.decode([t])) for t in targets[:shown].tolist()]
    widths = [max(len(a), len(b)) for a, b in zip(ins, outs)]
    more = f" ... ({len(inputs)} positions)" if len(inputs) > shown else ""

    def line(label: str, cells: list[str]) -> str:
        return literal(label + " ".join(s.ljust(w) for s, w in zip(cells, widths)).rstrip() + more)

    return [line("input:  ", ins), line("target: ", outs)]
