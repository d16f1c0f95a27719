"""Token datasets: `prepare_dataset` writes one, `TokenDataset` streams training windows from it.

A prepared dataset is a folder (`decoder-audit prepare --text FILES --tokenizer T --out DIR`):

    DIR/dataset.json      the header: format, dtype, token count, the two splits, the tokenizer
                          (name, kind, SHA-256, vocab_size, eos_id), every source file (name,
                          path as given, SHA-256, bytes, tokens, first token's offset) and the
                          SHA-256 of tokens.bin (`tokens_sha256`)
    DIR/tokens.bin        every token id back to back, little-endian uint16 when the tokenizer's
                          vocab_size <= 65536, else uint32; no header inside, so it opens with
                          np.memmap(dtype, shape=(tokens,)) as it is
    DIR/<tokenizer files> the tokenizer's own files and its manifest (tokenizer.py), so the
                          dataset, and every checkpoint trained on it, carries its tokenizer

The token stream is each source file encoded whole, in the order given, each followed by the
tokenizer's end-of-sequence id when it has one (documents stay separated, as GPT-2 did with
<|endoftext|>). Whole, because cutting a file into chunks could change how BPE splits the text
at the cuts; so preparing holds one file's text and ids in memory at a time (split a corpus
larger than memory into several files). The held-out split is a declared range: the last
ceil(val_fraction * N) tokens.

    tokens.bin   [ train: 0 .. n_train )[ val: n_train .. N )

`TokenDataset` draws a training window of T + 1 tokens at a uniform start in
[0, n_train - (T + 1)], so every training window lies inside [0, n_train) and none touches a
held-out token; validation windows are evenly spaced over [n_train, N). The tokens are never read
into memory: each batch gathers its B * (T + 1) ids from the memory map.

Integrity. Reading a dataset checks tokens.bin's size against the header (free); its content is
checked against `tokens_sha256` only where it matters and once: when a run resumes
(`check_tokens`, one pass over the file), not every time a dataset is opened, since hashing a
corpus of many GB would cost seconds to minutes per start.

A folder is written atomically (a temporary sibling, then renames, as checkpoints are:
`checkpoint.write_folder_atomically`), and only over an earlier dataset whose every file is
written again: a folder holding anything else is refused before a token is encoded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..objective import next_token_batch
from ..storage.folder import write_folder_atomically
from .tasks import describe_ids
from .tokenizer import Tokenizer

HEADER_FILE = "dataset.json"
TOKENS_FILE = "tokens.bin"
DATASET_FORMAT = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def token_dtype(vocab_size: int) -> str:
    """uint16 while every id fits in 16 bits (V <= 65536), else uint32."""
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


# ----------------------------------------------------------------------------------------------
# Writing a dataset
# ----------------------------------------------------------------------------------------------

def prepare_dataset(texts: Sequence[str | os.PathLike], tokenizer: Tokenizer | str,
                    out: str | os.PathLike, *, val_fraction: float = 0.1) -> dict[str, Any]:
    """Encode `texts` (UTF-8 files) with `tokenizer` (a Tokenizer or a --tokenizer spec) into
    the dataset folder `out` (see the module docstring); returns the header it wrote.

    Raises ConfigError naming the file or value (a missing or non-UTF-8 source, a bad
    val_fraction, too few tokens for both splits); CheckpointError for an `out` that is not an
    earlier dataset or holds files this one would not write again."""
    if not texts:
        raise ConfigError("prepare needs at least one text file (--text FILES)")
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction} must lie strictly between 0 and 1")
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.from_spec(tokenizer)
    paths = [Path(t) for t in texts]
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"--text file {str(path)!r} does not exist")
    dtype = token_dtype(tok.vocab_size)
    header: dict[str, Any] = {}

    def write(folder: Path) -> None:
        sources, count = [], 0
        digest = hashlib.sha256()  # of tokens.bin, taken as it is written: no second pass
        with open(folder / TOKENS_FILE, "wb") as handle:
            for path in paths:
                source = _encode_source(path, tok, DTYPES[dtype], handle, digest, start=count)
                sources.append(source)
                count += source["tokens"]
        header.update(_header(tok, dtype, sources, count, val_fraction))
        header["tokens_sha256"] = digest.hexdigest()
        (folder / HEADER_FILE).write_text(json.dumps(header, indent=2) + "\n")
        tok.save(folder)

    # Refused before a token is encoded: an `out` that is not an earlier dataset, or one holding
    # an entry this write would not make again (it would be lost).
    write_folder_atomically(out, write, same_kind=is_dataset_folder, what="token dataset",
                            names=(HEADER_FILE, TOKENS_FILE, *tok.folder_files()))
    return header


def is_dataset_folder(path: Path) -> bool:
    """A folder `prepare_dataset` wrote (it holds dataset.json)."""
    return (path / HEADER_FILE).is_file()


def _encode_source(path: Path, tok: Tokenizer, dtype: np.dtype, handle: Any, digest: Any, *,
                   start: int) -> dict[str, Any]:
    """Encode one file whole, append its ids (and eos) to `handle` and to `digest` (a hashlib
    object); its header entry."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--text file {str(path)!r} is not UTF-8 text ({exc})") from None
    ids = tok.encode(text)
    # Whether the ids spell the text again (False: the tokenizer drops or normalises something).
    round_trip = tok.decode(ids) == text
    if tok.eos_id is not None and (not ids or ids[-1] != tok.eos_id):
        ids.append(tok.eos_id)
    array = np.asarray(ids, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= tok.vocab_size):
        raise ConfigError(f"tokenizer {tok.name} produced ids outside [0, {tok.vocab_size}) "
                          f"for {str(path)!r}")
    raw_ids = array.astype(dtype).tobytes()
    handle.write(raw_ids)
    digest.update(raw_ids)
    return {"file": path.name, "path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw), "tokens": int(array.size), "start": start,
            "round_trip": round_trip}


def _header(tok: Tokenizer, dtype: str, sources: list[dict[str, Any]], count: int,
            val_fraction: float) -> dict[str, Any]:
    n_val = math.ceil(val_fraction * count)
    n_train = count - n_val
    if n_train < 2 or n_val < 2:
        raise ConfigError(
            f"{[s['path'] for s in sources]} hold {count} tokens: with val_fraction="
            f"{val_fraction} the training split has {n_train} and the held-out split {n_val}; "
            "each needs at least 2 (and max_seq_len + 1 to train)")
    return {
        "format": DATASET_FORMAT,
        "dtype": dtype,
        "byte_order": "little",
        "tokens": count,
        "splits": {"train": [0, n_train], "val": [n_train, count]},
        "val_fraction": val_fraction,
        "tokenizer": {k: tok.manifest()[k] for k in ("name", "kind", "sha256", "vocab_size",
                                                     "eos_id")},
        "eos_between_sources": tok.eos_id is not None,
        "sources": sources,
    }


# ----------------------------------------------------------------------------------------------
# Reading a dataset
# ----------------------------------------------------------------------------------------------

def read_header(folder: str | os.PathLike) -> dict[str, Any]:
    """The header of a prepared dataset, checked against tokens.bin's size; ConfigError naming
    the file on any problem."""
    folder = Path(folder)
    path = folder / HEADER_FILE
    if not path.is_file():
        raise ConfigError(f"--data {str(folder)!r} has no {HEADER_FILE}; write a dataset with "
                          "`decoder-audit prepare --text FILES --tokenizer T --out DIR`")
    try:
        header = json.loads(path.read_text())
        count, dtype = int(header["tokens"]), header["dtype"]
        (a, b), (c, d) = header["splits"]["train"], header["splits"]["val"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r} is not a dataset header ({exc!r})") from None
    if header.get("format") != DATASET_FORMAT or dtype not in DTYPES:
        raise ConfigError(f"{str(path)!r}: format {header.get('format')!r} / dtype {dtype!r}; "
                          f"this version reads format {DATASET_FORMAT} with {sorted(DTYPES)}")
    if not (a == 0 and a < b == c < d == count):
        raise ConfigError(f"{str(path)!r}: splits train [{a}, {b}) and val [{c}, {d}) do not "
                          f"tile the {count} tokens")
    tokens = folder / TOKENS_FILE
    size = tokens.stat().st_size if tokens.is_file() else None
    if size != count * DTYPES[dtype].itemsize:
        raise ConfigError(f"{str(tokens)!r} holds {size} bytes; {HEADER_FILE} declares {count} "
                          f"{dtype} tokens ({count * DTYPES[dtype].itemsize} bytes)")
    return header


def check_tokens(folder: str | os.PathLike, header: dict[str, Any] | None = None) -> None:
    """ConfigError naming tokens.bin when its SHA-256 is not the one `prepare` recorded in
    dataset.json: a token file rewritten with the same size, which read_header's size check
    cannot see. It reads the whole file (about a second per GB), so opening a dataset does not
    call it; resuming a run does (training/prepare.py), since a resumed run on other tokens
    would not continue the run. A dataset prepared before the digest was recorded has none to
    check against and passes."""
    folder = Path(folder)
    header = header or read_header(folder)
    recorded = header.get("tokens_sha256")
    if recorded is None:
        return
    path = folder / TOKENS_FILE
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != recorded:
        raise ConfigError(f"{str(path)!r} is not the token file {HEADER_FILE} was prepared with: "
                          f"its SHA-256 differs from the one recorded there (rewritten or "
                          "damaged); prepare the dataset again")


def open_tokens(folder: str | os.PathLike, header: dict[str, Any] | None = None) -> np.memmap:
    """tokens.bin as a read-only memory map (N,); nothing is read until indexed."""
    header = header or read_header(folder)
    return np.memmap(Path(folder) / TOKENS_FILE, dtype=DTYPES[header["dtype"]], mode="r",
                     shape=(header["tokens"],))


class TokenDataset:
    """Random windows of T + 1 tokens from a prepared dataset's training split, fixed windows
    from its held-out split (see the module docstring). The task interface of the trainer:
    check_model, batch, eval_batch, describe_pair, state, entropy_floor, checkpoint_files."""

    name = "tokens"
    held_out = True  # evaluated on the declared held-out split: a validation loss
    eval_windows = 64
    eval_label = "validation loss"

    def __init__(self, folder: str | os.PathLike, seq_len: int) -> None:
        # absolute: recorded in a checkpoint, so that a resumed run finds the same folder from
        # any working directory
        self.folder = Path(folder).absolute()
        self.header = read_header(self.folder)
        self.vocab = Tokenizer.from_folder(self.folder)
        declared = self.header["tokenizer"]
        if self.vocab is None or self.vocab.sha256 != declared["sha256"]:
            raise ConfigError(f"--data {str(self.folder)!r}: its tokenizer files are missing or "
                              f"are not the {declared['name']} its tokens were written with "
                              "(SHA-256 differs)")
        self.tokenizer, self.vocab_size, self.seq_len = self.vocab.name, self.vocab.vocab_size, \
            seq_len
        self.sha256 = hashlib.sha256((self.folder / HEADER_FILE).read_bytes()).hexdigest()
        self.tokens = open_tokens(self.folder, self.header)
        self.train_range = tuple(self.header["splits"]["train"])
        self.val_range = tuple(self.header["splits"]["val"])
        need = seq_len + 1
        for part, (lo, hi) in (("training", self.train_range), ("held-out", self.val_range)):
            if hi - lo < need:
                raise ConfigError(
                    f"--data {str(self.folder)!r}: its {part} split has {hi - lo} tokens, "
                    f"fewer than one window of max_seq_len + 1 = {need}")
        # Evenly spaced over the held-out split, first to last token: no generator, so
        # evaluating never moves the training sampler.
        lo, hi = self.val_range
        count = min(self.eval_windows, hi - lo - need + 1)
        starts = lo + torch.linspace(0, hi - lo - need, count).round().long()  # (W,)
        self._eval = next_token_batch(self._windows(starts))

    def _windows(self, starts: torch.Tensor) -> torch.Tensor:
        """(W,) start offsets -> (W, T+1) int64 ids, gathered from the memory map."""
        index = starts.numpy()[:, None] + np.arange(self.seq_len + 1)  # (W, T+1)
        return torch.from_numpy(np.asarray(self.tokens[index], dtype=np.int64))

    def check_model(self, vocab_size: int, max_seq_len: int) -> None:
        self.vocab.check_fits(vocab_size, f"the model trained on --data {str(self.folder)!r}")

    def batch(self, generator: torch.Generator, batch_size: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """A global batch of training windows: inputs and targets, each (B, T)."""
        lo, hi = self.train_range
        starts = lo + torch.randint(hi - lo - self.seq_len, (batch_size,), generator=generator)
        return next_token_batch(self._windows(starts))  # (B, T+1) -> (B, T), (B, T)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs, targets = self._eval
        return inputs, targets, torch.full((len(inputs),), 1.0 / len(inputs))

    @staticmethod
    def entropy_floor() -> None:
        return None  # unknown for natural text

    def describe_pair(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[str]:
        return describe_ids(self.vocab, inputs, targets)

    def state(self) -> dict:
        return {"task": self.name, "tokenizer": self.tokenizer,
                "tokenizer_sha256": self.vocab.sha256, "data": str(self.folder),
                "data_sha256": self.sha256, "tokens_sha256": self.header.get("tokens_sha256")}

    def checkpoint_files(self) -> dict[str, bytes]:
        """The tokenizer, to be saved beside the weights."""
        return self.vocab.folder_files()
