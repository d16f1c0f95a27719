"""How ids read as text: the tiny teaching vocabulary, and raw bytes.

The tiny teaching vocabulary: 8 tokens, one per id of the tiny-368 model (V = 8).

    id:     0      1      2      3  4  5  6  7
    token:  <pad>  <bos>  <eos>  A  B  C  D  E

`<bos>` opens a sequence and `<eos>` closes it, so the seeds' aligned example

    sequence: <bos> A B C <eos>   (length T + 1 = 5)
    input:    <bos> A B C         (the first T ids)
    target:   A B C <eos>         (the last T ids)

encodes to [1, 3, 4, 5, 2]. `<pad>` is id 0 so a zero-filled tensor is padding, never a letter;
`E` is the eighth symbol that fills the vocabulary. Training data for the tiny model (the
letters A..E between <bos> and <eos>) is written in these tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ConfigError

TINY_VOCAB: list[str] = ["<pad>", "<bos>", "<eos>", "A", "B", "C", "D", "E"]
PAD, BOS, EOS = 0, 1, 2
_ID_OF = {token: i for i, token in enumerate(TINY_VOCAB)}


def encode(text: str) -> list[int]:
    """Whitespace-separated tokens -> ids, e.g. "<bos> A B" -> [1, 3, 4]."""
    ids = []
    for token in text.split():
        if token not in _ID_OF:
            raise ValueError(f"token {token!r} is not in the tiny vocabulary {TINY_VOCAB}")
        ids.append(_ID_OF[token])
    return ids


def decode(ids: Iterable[int]) -> str:
    """Ids -> whitespace-separated tokens, e.g. [1, 3, 4] -> "<bos> A B"."""
    tokens = []
    for i in ids:
        i = int(i)
        if not 0 <= i < len(TINY_VOCAB):
            raise ValueError(f"id {i} is outside the tiny vocabulary [0, {len(TINY_VOCAB)})")
        tokens.append(TINY_VOCAB[i])
    return " ".join(tokens)


class Tokenizer:
    """How a model's ids read as text: the tiny 8-token vocabulary or raw bytes."""

    def __init__(self, kind: str) -> None:
        if kind not in ("tiny-vocab", "bytes"):
            raise ConfigError(f"unknown tokenizer {kind!r}; known: 'tiny-vocab', 'bytes'")
        self.kind = kind

    @classmethod
    def for_vocab_size(cls, vocab_size: int, declared: str | None = None) -> "Tokenizer":
        """The tokenizer a checkpoint declares, else the one its vocabulary size implies."""
        if declared is not None:
            return cls(declared)
        if vocab_size == len(TINY_VOCAB):
            return cls("tiny-vocab")
        if vocab_size >= 256:
            return cls("bytes")
        raise ConfigError(f"no tokenizer for vocab_size={vocab_size}: sampling knows the "
                          f"{len(TINY_VOCAB)}-token vocabulary and bytes (V >= 256)")

    @property
    def eos_id(self) -> int | None:
        return None if self.kind == "bytes" else EOS  # raw bytes have no end token

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8")) if self.kind == "bytes" else encode(text)

    def decode(self, ids: list[int]) -> str:
        if self.kind == "bytes":
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return decode(ids)
