"""Moved: the next-token helpers live in `decoder_audit.objective`, the check in
`gate/alignment.py` (kept so old imports keep working)."""

from ..objective import flatten_for_loss, next_token_batch  # noqa: F401
