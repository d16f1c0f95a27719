"""`Subject`: the model under audit, as every check sees it.

The gate never mutates the user's model. Forward-only checks run on a working copy
(`copy.deepcopy`, cast to float64 when the model allows it, put in eval mode); structural checks
(ledger, tying) only read the original. If the model cannot be deep-copied, checks run on the
original under `torch.no_grad()` in eval mode, and its train/eval flags are restored afterwards.

White-box means the model carries a `DecoderConfig` as `.config` and every weight name a
`Decoder` of that config has (our `Decoder`, or a module built to its layout). A module with a
`DecoderConfig` but other names (the torch.nn twin, say) is audited as a black box whose V and
max_seq_len come from its config; black-box is any module mapping ids (B, T) to logits (B, T, V), or to an object
with `.logits` (Hugging Face), or to a tuple whose first item is the logits.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..objective import logits_of
from . import tolerances

# Lengths used when a black-box model declares no max_seq_len.
DEFAULT_PROBE_LEN = 16
# Sequences longer than this are sampled rather than enumerated (lengths, cuts, prefixes).
SHORT_CONTEXT = 32
# Causal and prefix interventions run at most this long by default (batched cuts cost
# (cuts + 1) * T tokens; GPT-2 small at T=1024 would take minutes on a laptop CPU).
DEFAULT_INTERVENTION_LEN = 64


def _mode_flags(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    return [(m, m.training) for m in model.modules()]


def _restore_modes(flags: list[tuple[nn.Module, bool]]) -> None:
    for module, training in flags:
        module.training = training


def _has_decoder_layout(model: nn.Module, cfg: DecoderConfig) -> bool:
    """Whether `model` has every parameter name a Decoder built from `cfg` has (extra ones are
    allowed: the params check reports them)."""
    from ..model import Decoder

    with torch.device("meta"):
        expected = {name for name, _ in Decoder(cfg).named_parameters(remove_duplicate=False)}
    present = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return expected <= present


class Subject:
    def __init__(self, model: nn.Module, *, vocab_size: int | None, max_seq_len: int | None,
                 seed: int, intervention_len: int | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"audit() needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        config = getattr(model, "config", None)
        self.cfg: DecoderConfig | None = config if isinstance(config, DecoderConfig) else None
        if self.cfg is not None:
            for name, given in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len)):
                declared = getattr(self.cfg, name)
                if given is not None and given != declared:
                    raise ConfigError(f"{name}={given} disagrees with the model's config "
                                      f"{name}={declared}")
            vocab_size, max_seq_len = self.cfg.vocab_size, self.cfg.max_seq_len
        layout_note = None
        if self.cfg is not None and not _has_decoder_layout(model, self.cfg):
            layout_note = (f"{type(model).__name__} has a DecoderConfig but not the Decoder's "
                           "weight names: audited as a black box (V and max_seq_len from its config)")
            self.cfg = None
        if vocab_size is None:
            raise ConfigError(
                f"{type(model).__name__} has no DecoderConfig, so audit() needs vocab_size=V "
                "(and max_seq_len=T to check that longer inputs are rejected)")
        for name, value in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        self.vocab_size: int = vocab_size
        self.max_seq_len: int | None = max_seq_len
        self.seed = seed
        self.intervention_cap = int(DEFAULT_INTERVENTION_LEN if intervention_len is None
                                    else intervention_len)
        self.has_trace = self.whitebox and callable(getattr(model, "run_with_trace", None))
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
        self.dtype = floats[0] if floats else torch.float32  # the working copy's, once prepared
        self.work: nn.Module = model
        self.notes: list[str] = [layout_note] if layout_note else []
        self.tokens = 0  # token positions pushed through the model, for the cost line
        self.calls = 0
        self._saved_modes: list[tuple[nn.Module, bool]] | None = None

    # ---- the working copy -------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the working copy: float64 if the model runs in it, else float32, else in place."""
        probe = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        for dtype in (torch.float64, torch.float32):
            try:
                candidate = copy.deepcopy(self.model)
            except Exception as exc:  # some wrapped models refuse deepcopy
                self.notes.append(f"could not deep-copy the model ({type(exc).__name__})")
                break
            try:
                candidate.to(dtype).eval()
                with torch.no_grad():
                    logits_of(candidate(probe))
            except Exception as exc:
                self.notes.append(f"the model does not run in {str(dtype).removeprefix('torch.')} "
                                  f"({type(exc).__name__}: {str(exc)[:120]})")
                del candidate
                continue
            for param in candidate.parameters():
                param.requires_grad_(False)  # a forward-only copy; the oracle makes its own
            self.work, self.dtype = candidate, dtype
            return
        self.notes.append("checks ran on the model itself in its own dtype, in eval mode; its "
                          "train/eval flags were restored afterwards")
        self._saved_modes = _mode_flags(self.model)
        self.model.eval()

    def release(self) -> None:
        """Drop the working copy; restore the original's train/eval flags if it was used."""
        if self._saved_modes is not None:
            _restore_modes(self._saved_modes)
            self._saved_modes = None
        self.work = self.model

    @property
    def whitebox(self) -> bool:
        return self.cfg is not None

    @property
    def in_place(self) -> bool:
        """The checks run on the user's model itself (it could not be copied)."""
        return self.work is self.model

    @property
    def tol(self) -> float:
        return tolerances.invariance(self.dtype)

    # ---- running the model ----------------------------------------------------------------
    def run(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the working copy for ids (B, T), without gradients."""
        ids = ids.to(self.device)
        self.count(ids)
        with torch.no_grad():
            return logits_of(self.work(ids))

    def count(self, ids: torch.Tensor) -> None:
        """Book one model call on `ids` for the cost line; checks that call the model themselves
        (for a trace, attention patterns or gradients) book their calls here too."""
        self.calls += 1
        self.tokens += ids.numel()

    def random_ids(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch, seq_len), generator=generator)

    def generator(self, salt: int = 0) -> torch.Generator:
        """A private RNG per check: the audit never touches the global torch seed, and each
        check sees the same ids whatever ran before it."""
        return torch.Generator().manual_seed(self.seed * 1000003 + salt)

    # ---- lengths ----------------------------------------------------------------------------
    @property
    def probe_max(self) -> int:
        return self.max_seq_len if self.max_seq_len is not None else DEFAULT_PROBE_LEN

    def intervention_len(self) -> int:
        return self.short_len(self.intervention_cap)

    def short_len(self, cap: int) -> int:
        return max(1, min(self.probe_max, cap))


def get_attr(module: nn.Module, dotted: str):
    """module.<dotted> or None (e.g. "lm_head.weight")."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def batch_not_equal(seq_len: int, preferred: tuple[int, ...] = (3, 2, 5)) -> int:
    """A batch size different from T, so no axis can be identified by its size."""
    return next(b for b in preferred if b != seq_len)


def sample_positions(seq_len: int, count: int) -> list[int]:
    """All of 0..T-1 when T <= count, else `count` positions spread over them, always including
    0, 1 and T-1 (the ends are where off-by-one masks show)."""
    if seq_len <= count:
        return list(range(seq_len))
    picks = {0, 1, seq_len - 1}
    step = (seq_len - 1) / (count - 1)
    picks.update(round(i * step) for i in range(count))
    picks = sorted(picks)
    while len(picks) > count:  # drop interior duplicates of the spread, keep the ends
        picks.pop(len(picks) // 2)
    return picks


def scaled_excess(diff: torch.Tensor, reference: torch.Tensor, tol: float) -> tuple[float, float]:
    """(largest |diff|, the allowed bound tol * max(1, max |reference|))."""
    scale = max(1.0, float(reference.detach().abs().max())) if reference.numel() else 1.0
    return float(diff.detach().abs().max()) if diff.numel() else 0.0, tol * scale
