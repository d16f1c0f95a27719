"""How the museum's symptoms call a model: the probe ids and the logits, the way a release's
users call it (`model(input_ids=...)`, `.logits`), in torch alone (nothing here imports
decoder_audit or a release's library)."""

from __future__ import annotations

import torch
from torch import nn

SEED = 1  # the probe ids; the weights are seeded by the builders


def ids(V: int, B: int, T: int, low: int = 3) -> torch.Tensor:
    """Ids drawn away from the special ids (0, 1, 2: pad, bos, eos in the builders' configs)."""
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(low, V, (B, T), generator=g)  # (B, T)


def logits(model: nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    out = model(input_ids=ids, **kwargs) if takes_input_ids(model) else model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits  # (B, T, V)


def takes_input_ids(model: nn.Module) -> bool:
    import inspect

    return "input_ids" in inspect.signature(model.forward).parameters
