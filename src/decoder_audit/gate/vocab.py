"""Moved to `decoder_audit.tokenizer` (kept so old imports keep working)."""

from ..tokenizer import BOS, EOS, PAD, TINY_VOCAB, decode, encode  # noqa: F401
