"""What reading a peer library's model gives (`peer_configs`, `peer_xtransformers`): its spec,
or the options no DecoderConfig expresses, each named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import DecoderConfig
from ..errors import ConfigError
from .layouts import Placement


@dataclass(frozen=True)
class PeerSpec:
    """A peer library's model read: its spec, or the options that cannot be one."""

    library: str
    """"TransformerLens", "litgpt", "nanoGPT", "torchtune" or "x-transformers"."""
    spec: DecoderConfig | None
    """The architecture the config declares; None when an option is refused."""
    refused: tuple[str, ...] = ()
    """Each option no DecoderConfig expresses, named with its value and why."""
    placement: Placement | None = None
    """Where the weights lie, for a library whose names no detected layout has (x-transformers);
    None: `layouts.place` finds them."""
    vocab_size: int | None = None
    """V as the config says it, also where an option is refused (the audit then needs no
    vocab_size= to fail closed)."""

    @property
    def reason(self) -> str:
        """Why params and oracle fail: the refused options, named."""
        return (f"{self.library}'s config was read, but {len(self.refused)} of its options no "
                f"DecoderConfig expresses: " + "; ".join(self.refused))


def read_spec(library: str, fields: dict[str, Any], refused: list[str]) -> PeerSpec:
    """The PeerSpec of `fields` (DecoderConfig keyword arguments), or of the refused options; a
    combination DecoderConfig rejects is refused with its ConfigError."""
    vocab = fields.get("vocab_size")
    if refused:
        return PeerSpec(library, None, tuple(refused), vocab_size=vocab)
    try:
        return PeerSpec(library, DecoderConfig(**fields), vocab_size=vocab)
    except ConfigError as exc:
        return PeerSpec(library, None, (f"the config reads as no valid DecoderConfig: {exc}",),
                        vocab_size=vocab)
