"""`Subject`: the model under audit, as every check sees it.

The gate audits the model itself, in its own dtype and on its own device: no copy is made, so
the largest model a machine can hold can be audited on it (the gate's peak stays near 2x the
weights: see `runner.py`). The user's model is never modified: `prepare` puts it in eval mode and
turns requires_grad off for every parameter, a check that needs gradients turns them on for the
parameters it asks for (`gradients_for`), and `release` restores every module's train/eval flag
and every parameter's requires_grad and .grad exactly (the same tensor objects).

Tolerances come from the dtype the model computes in (`dtype`: the least precise floating dtype
among its parameters) and from noise floors the checks measure; see tolerances.py.

White-box means the model carries a `DecoderConfig` as `.config` and every weight name a
`Decoder` of that config has (our `Decoder`, or a module built to its layout). A module with a
`DecoderConfig` but other names (the torch.nn twin, say) is audited as a black box whose V and
max_seq_len come from its config; black-box is any module mapping ids (B, T) to logits (B, T, V), or to an object
with `.logits` (Hugging Face), or to a tuple whose first item is the logits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..config import DecoderConfig
from ..errors import ConfigError
from ..generate import Convention, convention
from ..objective import OutputError, logits_of
from . import tolerances
from .measure import value_scale
from .probes import ProbeIds

# Cost normaliser of the report when no length is known (report.forward_equivalents).
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


class _NoDraws(TorchFunctionMode):
    """Skips `normal_` (the initial draws) while a Decoder is built on the meta device for its
    names. On meta it runs a Python decomposition that imports torch._dynamo: 2 s, and 120 000
    objects that every later gc.collect walks (0.15 s -> 0.4 s per collection; the runner
    collects between checks)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.normal_:
            return args[0]
        return func(*args, **(kwargs or {}))


def _has_decoder_layout(model: nn.Module, cfg: DecoderConfig) -> bool:
    """Whether `model` has every parameter name a Decoder built from `cfg` has (extra ones are
    allowed: the params check reports them)."""
    from ..model import Decoder

    with torch.device("meta"), _NoDraws():
        expected = {name for name, _ in Decoder(cfg).named_parameters(remove_duplicate=False)}
    present = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return expected <= present


class Subject:
    def __init__(self, model: nn.Module, *, vocab_size: int | None, max_seq_len: int | None,
                 seed: int, intervention_len: int | None = None,
                 input_vocab_size: int | None = None, pad_token_id: int | None = None) -> None:
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
        for name, value in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len),
                            ("input_vocab_size", input_vocab_size),
                            ("intervention_len", intervention_len)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        self.vocab_size: int = vocab_size
        # Ids the input embedding accepts: [0, input_vocab_size); larger than V when the model
        # reads ids it never predicts. The probes are drawn from `probes.ProbeIds`.
        self.input_vocab_size: int = vocab_size if input_vocab_size is None else input_vocab_size
        self.probe_ids = ProbeIds(min(vocab_size, self.input_vocab_size), pad_token_id)
        self.max_seq_len: int | None = max_seq_len
        self.seed = seed
        self.intervention_cap = int(DEFAULT_INTERVENTION_LEN if intervention_len is None
                                    else intervention_len)
        self.has_trace = self.whitebox and callable(getattr(model, "run_with_trace", None))
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.dtype = compute_dtype(model)
        self.work: nn.Module = model  # the model itself: the gate makes no copy
        self.notes: list[str] = [layout_note] if layout_note else []
        self.tokens = 0  # token positions pushed through the model, for the cost line
        self.calls = 0
        self.progress: Callable[[str], None] = lambda what: None  # the runner's progress line
        # Verdicts of the checks run so far, by name (the runner fills it): a check may cite an
        # earlier one (attention_rows says what `causal` found on the plain forward).
        self.results: dict = {}
        self._rounding_floor: float | None = None
        self._clean: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, logits): clean_logits
        self._saved_modes: list[tuple[nn.Module, bool]] | None = None
        self._saved_params: list[tuple[nn.Parameter, bool, torch.Tensor | None]] | None = None

    # ---- borrowing the model ----------------------------------------------------------------
    def prepare(self) -> None:
        """Borrow the model for the audit: eval mode, and requires_grad off for every parameter
        (forward-only checks build no graph; `gradients_for` turns on what a check needs). The
        flags and every .grad are saved for `release`."""
        self._saved_modes = _mode_flags(self.model)
        self._saved_params = [(p, p.requires_grad, p.grad) for p in self.parameters()]
        self.model.eval()
        for param in self.parameters():
            param.requires_grad_(False)

    def release(self) -> None:
        """Give the model back as it came: train/eval flags, requires_grad and .grad (the same
        tensor objects) of every parameter restored."""
        self.forget_clean()
        if self._saved_modes is not None:
            _restore_modes(self._saved_modes)
            self._saved_modes = None
        if self._saved_params is not None:
            _restore_params(self._saved_params)
            self._saved_params = None

    def parameters(self) -> list[nn.Parameter]:
        """The model's parameters, each once (a tied weight is one)."""
        return list(self.work.parameters())

    @contextmanager
    def gradients_for(self, params: Iterable[nn.Parameter]) -> Iterator[None]:
        """Within the block, exactly `params` require grad and every .grad starts as None;
        afterwards the flags and .grad of every parameter are as they were. The gradients a
        check reads must be read inside the block."""
        self.forget_clean()
        wanted = {id(p) for p in params}
        saved = [(p, p.requires_grad, p.grad) for p in self.parameters()]
        try:
            for param in self.parameters():
                param.grad = None
                param.requires_grad_(id(param) in wanted)
            with torch.enable_grad():
                yield
        finally:
            _restore_params(saved)

    @property
    def whitebox(self) -> bool:
        return self.cfg is not None

    @property
    def convention(self) -> Convention:
        """How the model is called for cached steps and padded batches (generate.convention)."""
        return convention(self.model)

    @property
    def has_cache(self) -> bool:
        """The model keeps a KV cache: our Decoder, or the Hugging Face call convention."""
        return self.convention.cached

    @property
    def takes_mask(self) -> bool:
        """The model's forward takes an attention_mask."""
        return self.convention.masked

    @property
    def input_embedding(self) -> nn.Module | None:
        """The module whose output is the per-position input of the model: Hugging
        Face's get_input_embeddings(), else the first module named `token_embeddings` (our
        Decoder, also inside a wrapper), else the first nn.Embedding; None when there is none."""
        getter = getattr(self.work, "get_input_embeddings", None)
        if callable(getter):
            try:
                found = getter()
            except (NotImplementedError, AttributeError):
                found = None
            if isinstance(found, nn.Module):
                return found
        named = self.work.named_modules()
        return next((m for name, m in named if name.rsplit(".", 1)[-1] == "token_embeddings"),
                    next((m for m in self.work.modules() if isinstance(m, nn.Embedding)), None))

    @property
    def has_input_embedding(self) -> bool:
        return self.input_embedding is not None

    # ---- running the model ----------------------------------------------------------------
    def run(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the model for ids (B, T), without gradients."""
        ids = ids.to(self.device)
        self.count(ids)
        with torch.no_grad():
            return logits_of(self.work(ids))

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """`run`, then the shape: logits of ids (B, T) must be (B, T, V) before any comparison
        reads them (a (B, B, V) answer to (B, 1) ids would otherwise be compared row by row and
        misreported as a leak). Raises WrongShape naming both shapes."""
        logits = self.run(ids)
        want = (*ids.shape, self.vocab_size)
        if tuple(logits.shape) != want:
            raise WrongShape(f"the model returned logits of shape {tuple(logits.shape)} for ids of "
                             f"shape {tuple(ids.shape)}; expected (B, T, V) = {want}, so nothing "
                             "was compared")
        return logits

    def trace(self, ids: torch.Tensor):
        """(logits, trace) of `run_with_trace` on ids (B, T), without gradients; white-box."""
        ids = ids.to(self.device)
        self.count(ids)
        with torch.no_grad():
            return self.work.run_with_trace(ids)

    @contextmanager
    def scaled_scores(self, score_max: list[float | None] | None, target: float
                      ) -> Iterator[bool]:
        """Within the block, layer i's query and key projections come out multiplied by
        a_i = sqrt(target / score_max[i]) (forward hooks on `layers.i.attn.q_proj` and `k_proj`:
        exactly what scaling their weights and biases by a_i does, without touching a weight or
        copying the model), so every layer's largest attention score becomes about `target`.
        Yields False (and scales nothing) when the model has no such projections."""
        layers = [get_attr(self.work, f"layers.{i}.attn") for i in range(len(score_max or []))]
        if (self.cfg is None or not score_max or any(m is None for m in score_max)
                or not all(isinstance(get_attr(a, n), nn.Module) for a in layers if a is not None
                           for n in ("q_proj", "k_proj")) or any(a is None for a in layers)):
            yield False
            return
        hooks = []
        self.forget_clean()  # the hooks change what the model computes
        try:
            for attn, factor in zip(layers, score_factors(score_max, target)):
                for proj in (attn.q_proj, attn.k_proj):
                    hooks.append(proj.register_forward_hook(
                        lambda _module, _inputs, output, a=factor: output * a))
            yield True
        finally:
            for hook in hooks:
                hook.remove()

    def rounding_floor(self) -> float | None:
        """How far the model's own 16-bit dtype rounds its logits, measured: the slow oracle run
        in that dtype against the slow oracle in float64, on the model's weights and a short
        sequence, relative to the logit scale (tolerances.py, kind 2). It depends on the weights
        and the dtype, not on the model's code, so a defect cannot inflate it. None for a black
        box and for float32/float64, whose tolerances are fixed multiples of eps. Measured once."""
        if self.cfg is None or self.dtype not in tolerances.LOW_PRECISION:
            return None
        if self._rounding_floor is None:
            from ..oracle import StreamedOracle

            named = dict(self.work.named_parameters(remove_duplicate=False))
            ids = self.random_ids(1, self.short_len(6), self.generator(31))
            weight = functools.partial(own_weight, named)
            self.progress("rounding floor: the oracle in float64 and in "
                          f"{str(self.dtype).removeprefix('torch.')}")
            exact = StreamedOracle(weight, self.cfg, ids).logits
            rounded = StreamedOracle(weight, self.cfg, ids, dtype=self.dtype).logits
            scale = value_scale(exact)
            self._rounding_floor = (float((rounded.double() - exact).abs().max()) / scale
                                    if scale else 0.0)
        return self._rounding_floor

    def shape_tolerance(self) -> float:
        """tolerances.shape_change for this model: from its measured rounding floor when it has
        one (a white-box model in a 16-bit dtype), else from its dtype alone."""
        return tolerances.shape_change(self.dtype, self.rounding_floor())

    # Clean runs remembered: the invariance checks compare their interventions with the same few
    # clean runs (one batch, and its row 0 at every index), so each runs once per audit instead
    # of once per check (every call of a big model is a pass over all its weights).
    CLEAN_KEPT = 2

    def clean_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """`logits(ids)`, run once and remembered (the last CLEAN_KEPT ids): the caller must not
        modify the result. The runner forgets them before a check that does not share them."""
        for kept_ids, logits in self._clean:
            if kept_ids.shape == ids.shape and torch.equal(kept_ids, ids):
                return logits
        logits = self.logits(ids)
        self._clean = [*self._clean, (ids.clone(), logits)][-self.CLEAN_KEPT:]
        return logits

    def forget_clean(self) -> None:
        self._clean = []

    def count(self, ids: torch.Tensor) -> None:
        """Book one model call on `ids` for the cost line; checks that call the model themselves
        (for a trace, attention patterns or gradients) book their calls here too."""
        self.calls += 1
        self.tokens += ids.numel()

    def random_ids(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        return self.probe_ids.random(batch, seq_len, generator)

    def other_ids(self, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Probe ids that differ from `ids` at every position."""
        return self.probe_ids.other(ids, generator)

    def generator(self, salt: int = 0) -> torch.Generator:
        """A private RNG per check: the audit never touches the global torch seed, and each
        check sees the same ids whatever ran before it."""
        return torch.Generator().manual_seed(self.seed * 1000003 + salt)

    # ---- lengths ----------------------------------------------------------------------------
    @property
    def probe_max(self) -> int:
        """The longest input any check sends: max_seq_len, a hard limit; a model without one is
        probed up to the intervention length (64 unless told), so every behavioural check covers
        positions 0..N-1 and a leak that starts late is still in reach."""
        return self.max_seq_len if self.max_seq_len is not None else self.intervention_cap

    def intervention_len(self) -> int:
        return self.short_len(self.intervention_cap)

    def short_len(self, cap: int) -> int:
        return max(1, min(self.probe_max, cap))


class WrongShape(OutputError):
    """The model ran but its logits are not (B, T, V) for ids (B, T)."""


def score_factors(score_max: list[float], target: float) -> list[float]:
    """Per layer, the factor a_i on queries and keys that brings the largest attention score
    score_max[i] to `target` (scores are bilinear in q and k: a_i^2 * score_max[i])."""
    return [math.sqrt(target / max(largest, 1e-12)) for largest in score_max]


def compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype a model computes in: the least precise floating dtype among its parameters (a
    bfloat16 model with float32 norms rounds like bfloat16); float32 for a model without any."""
    floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max(floats, key=lambda d: torch.finfo(d).eps, default=torch.float32)


def _restore_params(saved: list[tuple[nn.Parameter, bool, torch.Tensor | None]]) -> None:
    for param, requires_grad, grad in saved:
        param.grad = grad
        param.requires_grad_(requires_grad)


def own_weight(named: dict[str, nn.Parameter], name: str) -> torch.Tensor | None:
    """The model's own weight, detached (no copy): the oracle converts what it reads."""
    param = named.get(name)
    return None if param is None else param.detach()


def get_attr(module: nn.Module, dotted: str):
    """module.<dotted> or None (e.g. "lm_head.weight")."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
