"""`Subject`: the model under audit, as every check sees it.

The gate audits the model itself, in its own dtype and on its own device: no copy is made, so
the largest model a machine can hold can be audited on it (the gate's peak stays near 2x the
weights: see `runner.py`). The user's model is never modified: `prepare` puts it in eval mode and
turns requires_grad off for every parameter, a check that needs gradients turns them on for the
parameters it asks for (`gradients_for`), and `release` restores every module's train/eval flag
and every parameter's requires_grad and .grad exactly (the same tensor objects).

Tolerances come from the dtype the model computes in (`dtype`: the least precise floating dtype
among its parameters) and from noise floors the checks measure; see tolerances.py.

What the gate knows about the model before any check (V, the input vocabulary, max_seq_len,
the pad id, white-box or not, the call convention) is its `ModelFacts` (facts.py), decided once;
the Subject reads them and never decides them again. Black-box is any module mapping ids (B, T)
to logits (B, T, V), or to an object with `.logits` (Hugging Face), or to a tuple whose first
item is the logits.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from contextlib import contextmanager

import torch
from torch import nn

from ..config import DecoderConfig
from ..generation.convention import Convention, call
from ..objective import OutputError, logits_of
from . import tolerances
from .facts import ModelFacts, input_embedding
from .measure import all_finite, value_scale
from .probes import ProbeIds
from .oom import Exhausted, out_of_memory
from .sharding import agree_on_failure, is_sharded, new_audit_key, several_ranks, whole
from .state import ModelState, ProcessSettings
from .wrappers import is_fsdp, resharded_between_calls, unwrapped

# Cost normaliser of the report when no length is known (report.forward_equivalents).
DEFAULT_PROBE_LEN = 16
# Sequences longer than this are sampled rather than enumerated (lengths, cuts, prefixes).
SHORT_CONTEXT = 32


def _mode_flags(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    return [(m, m.training) for m in model.modules()]


def _restore_modes(flags: list[tuple[nn.Module, bool]]) -> None:
    for module, training in flags:
        module.training = training


class Subject:
    def __init__(self, model: nn.Module, facts: ModelFacts, *, seed: int) -> None:
        model, _ = unwrapped(model)  # the module inside DDP or torch.compile (wrappers.py)
        self.model = model
        self.facts = facts
        self.seed = seed
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.dtype = compute_dtype(model)
        self.work: nn.Module = model  # the model itself: the gate makes no copy
        self.has_trace = facts.whitebox and callable(getattr(model, "run_with_trace", None))
        # The probes are drawn from the content ids: [0, min(V, input vocabulary)), never the pad.
        self.probe_ids = ProbeIds(min(facts.vocab_size, facts.input_vocab_size),
                                  facts.pad_token_id)
        self.notes: list[str] = list(facts.notes)
        self.tokens = 0  # token positions pushed through the model, for the cost line
        self.calls = 0
        self.longest = 0  # the longest input (T) the model ran: the cost line's unit
        self.progress: Callable[[str], None] = lambda what: None  # the runner's progress line
        # Verdicts of the checks run so far, by name (the runner fills it): a check may cite an
        # earlier one (attention_rows says what `causal` found on the plain forward).
        self.results: dict = {}
        self._rounding_floor: float | None = None
        # Measured in eval mode by `causal` and reused by train_mode: the index noise of the
        # copies of clean_batch's row 0 (invariance.cut_changes), and the probe at the training
        # shape (trainshape.probe: its verdict, noise floor and the bits of its batches)
        self.copies_noise: float | None = None
        self.training_shape_eval: dict | None = None
        self._clean: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, logits): clean_logits
        self._saved_modes: list[tuple[nn.Module, bool]] | None = None
        self._saved_params: list[tuple[nn.Parameter, bool, torch.Tensor | None]] | None = None
        # The model's state as the audit found it (state.py), taken by `prepare`: put back
        # before every fresh call (`run`, `trace`), after every probe and check, and at `release`.
        self.state: ModelState | None = None
        self._eval_modes: list[tuple[nn.Module, bool]] = []
        self.state_moved: dict[str, list[str]] = {}  # probe or check -> what its calls changed
        self.state_lost: list[str] = []  # what could not be put back (too large to copy)
        # The process-wide settings (state.SETTINGS: default dtype, deterministic algorithms,
        # threads, anomaly mode, matmul precision) as the audit found them, taken by `prepare`
        # and put back wherever the model's state is; what the model's calls changed, by the
        # probe or check they ran in (`determinism` fails on it: see invariance.py).
        self.settings: ProcessSettings | None = None
        self.settings_moved: dict[str, list[str]] = {}
        # Sharded with FSDP2 (`verify --shard`): each rank holds 1/N of every weight as a
        # DTensor and gathers a block's weights as it runs; see `whole` and `gradients_by_share`.
        self.sharded = is_fsdp(model) or (first is not None and is_sharded(first))
        self._sharding = contextlib.ExitStack()  # FSDP2's settings for the audit (`prepare`)
        # Over several ranks a model's exception is evidence only when every rank raised it
        # (sharding.agree_on_failure): the key names this audit alike on every rank.
        self.ranks_agree = several_ranks(self.sharded)
        self.audit_key = new_audit_key() if self.ranks_agree else ""
        self.running = "the probes"  # the check running now (the runner sets it), for messages

    # ---- the facts, as the checks read them --------------------------------------------------
    @property
    def cfg(self) -> DecoderConfig | None:
        return self.facts.config

    @property
    def whitebox(self) -> bool:
        return self.facts.whitebox

    @property
    def vocab_size(self) -> int:
        return self.facts.vocab_size

    @property
    def input_vocab_size(self) -> int:
        return self.facts.input_vocab_size

    @property
    def max_seq_len(self) -> int | None:
        return self.facts.max_seq_len

    @property
    def convention(self) -> Convention:
        """How the model is called for cached steps and padded batches (generation.convention)."""
        return self.facts.convention

    @property
    def has_cache(self) -> bool:
        return self.facts.has_cache

    @property
    def input_embedding(self) -> nn.Module | None:
        return input_embedding(self.work)

    # ---- borrowing the model ----------------------------------------------------------------
    def prepare(self) -> None:
        """Borrow the model for the audit: eval mode, and requires_grad off for every parameter
        (forward-only checks build no graph; `gradients_for` turns on what a check needs). The
        flags and every .grad are saved for `release`."""
        # FSDP2: every module's weights sharded between calls (wrappers.py), so each check finds
        # the Parameters it asks gradients for; its own setting put back at `release`
        self._sharding.enter_context(resharded_between_calls(self.model))
        self._saved_modes = _mode_flags(self.model)
        self._saved_params = [(p, p.requires_grad, p.grad) for p in self.parameters()]
        self.model.eval()
        for param in self.parameters():
            param.requires_grad_(False)
        self._eval_modes = _mode_flags(self.model)
        self.state = ModelState(self.work, keep_parameters=not self.sharded)
        self.settings = ProcessSettings()

    def put_back(self, after: str) -> None:
        """The model as the audit found it again after the probe or check named `after`: its
        state (what changed is kept in `state_moved`, what could not be put back in
        `state_lost`) and the eval-mode flags every check starts from."""
        if self.state is None:
            return
        moved = self.state.changes(additions=False)  # additions: lazily built, not news
        if moved:
            self.state_moved[after] = moved
        self._restore_state(full=True, after=after)
        _restore_modes(self._eval_modes)

    def _restore_state(self, *, full: bool = False, after: str | None = None) -> None:
        if self.state is not None:
            self.state_lost += [lost for lost in self.state.restore(full=full)
                                if lost not in self.state_lost]
        if self.settings is not None:  # every call meets the process as the audit found it
            changed = self.settings.restore()
            if changed:
                seen = self.settings_moved.setdefault(after or self.running, [])
                seen += [change for change in changed if change not in seen]

    def settings_changed(self) -> list[str]:
        """The process-wide settings the model's calls changed so far (each put back), and any
        a call changed since the last was put back: "torch.set_num_threads: 2 -> 1"."""
        found = [change for moved in self.settings_moved.values() for change in moved]
        if self.settings is not None:
            found += self.settings.changes()
        return list(dict.fromkeys(found))

    def release(self) -> None:
        """Give the model back as it came: its state (state.py), train/eval flags, requires_grad
        and .grad (the same tensor objects) of every parameter restored; and the process's
        settings its calls changed (state.SETTINGS) as the audit found them."""
        self.forget_clean()
        self._restore_state(full=True, after="the audit's end")
        self.state = self.settings = None
        if self._saved_modes is not None:
            _restore_modes(self._saved_modes)
            self._saved_modes = None
        if self._saved_params is not None:
            _restore_params(self._saved_params)
            self._saved_params = None
        self._sharding.close()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters that required grad when the audit began (the user's trainable ones)."""
        if self._saved_params is None:
            return [p for p in self.parameters() if p.requires_grad]
        return [param for param, requires_grad, _ in self._saved_params if requires_grad]

    def parameters(self) -> list[nn.Parameter]:
        """The model's parameters, each once (a tied weight is one)."""
        return list(self.work.parameters())

    def gradients_by_share(self, shares: list[list[nn.Parameter]],
                           objective: Callable[[], torch.Tensor | None]
                           ) -> Iterator[list[nn.Parameter]]:
        """Each share of the parameters in turn, its gradients of `objective()` (a scalar, or
        None when no weight reaches it) in .grad while the caller reads them, cleared after: so
        no more than one share of gradients exists beside the weights. One process runs the
        objective once and walks its retained graph into one share at a time (at the gate's
        short probes the graph holds a dozen rows of activations, and a short call of a big
        model costs a fifteenth of a full-length forward: GPT-2 XL, 2 s a pass saved). A
        sharded model runs it again for every share with only that share requiring grad:
        FSDP2 reshards a block once its backward is over, so a graph is walked once (tried:
        every gradient of a second backward(inputs=..., retain_graph=True) is None); the
        gradients, and so every figure a check draws from them, are the same."""
        with self.gradients_for([param for share in shares for param in share]):
            shared = None if self.sharded else objective()
            for share in shares:
                with self.gradients_for(share) if self.sharded else contextlib.nullcontext():
                    value = objective() if self.sharded else shared
                    if value is not None and share:
                        value.backward(inputs=None if self.sharded else share,
                                       retain_graph=not self.sharded)
                    del value
                    yield share
                for param in share:
                    param.grad = None  # read: freed before the next share's gradients

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

    # ---- running the model ----------------------------------------------------------------
    def run(self, ids: torch.Tensor, *, finite: bool = True, as_found: bool = True
            ) -> torch.Tensor:
        """Logits of the model for ids (B, T), without gradients. Raises NonFiniteLogits when
        they hold NaN or inf: no comparison of them means anything (a NaN differs from
        everything, itself included), so no check reports a leak or a mismatch it never saw.
        `finite=False` hands them back as they are, for the checks that look at that itself
        (inputs, raw_logits).

        Every call meets the model in the state the audit found it in (`as_found`): what an
        earlier call changed (a position counter, a cache in buffers) is put back first, so the
        calls a check compares differ only in what the check changed. `determinism` alone calls
        with `as_found=False`, to see whether the model's own state moves its answers. A gate
        context that changes the model on purpose (an attention implementation, checkpointing)
        calls `self.work` directly: here it would be put back."""
        ids = ids.to(self.device)
        if as_found:
            self._restore_state()
        self.count(ids)
        with torch.no_grad(), model_failures_carried(self):
            logits = logits_of(self.forward(ids))  # the plain call: ids positionally
        if isinstance(logits, torch.Tensor) and logits.device.type == "meta":
            raise MetaLogits(f"the model returned logits {tuple(logits.shape)} on the meta "
                             "device: shapes without values (weights never materialised, or "
                             "a forward that makes its output there), so nothing was compared")
        if finite and isinstance(logits, torch.Tensor) and logits.is_floating_point() and \
                not all_finite(logits):
            raise NonFiniteLogits(non_finite_message(logits, self.dtype))
        return logits

    def forward(self, ids: torch.Tensor, **kwargs) -> Any:
        """The working model called on ids (B, T) positionally with `kwargs`, and the all-ones
        attention_mask its forward requires where it has no default (facts.convention): the
        plain call every check makes, with nothing restored or counted (see `run`)."""
        if self.convention.mask_required and kwargs.get("attention_mask") is None:
            kwargs["attention_mask"] = torch.ones_like(ids)
        return self.work(ids, **kwargs)

    def call(self, ids: torch.Tensor, **kwargs) -> Any:
        """The model's raw output for ids (B, T) and `kwargs` (labels=, position_ids=, ...), the
        ids passed the way its call convention takes them with keywords (facts.convention: as
        input_ids= where the forward names them, as generate passes them, else positionally).
        Every check that passes more than the ids calls the model through here. Counts
        nothing: the caller books its calls (`count`). Like `run`, it meets the model in the
        state the audit found it in."""
        self._restore_state()
        with model_failures_carried(self):
            return call(self.work, self.convention, ids, **kwargs)

    def logits(self, ids: torch.Tensor, *, as_found: bool = True) -> torch.Tensor:
        """`run`, then the shape: logits of ids (B, T) must be (B, T, V) before any comparison
        reads them (a (B, B, V) answer to (B, 1) ids would otherwise be compared row by row and
        misreported as a leak). Raises WrongShape naming both shapes."""
        logits = self.run(ids, as_found=as_found)
        want = (*ids.shape, self.vocab_size)
        if tuple(logits.shape) != want:
            raise WrongShape(f"the model returned logits of shape {tuple(logits.shape)} for ids of "
                             f"shape {tuple(ids.shape)}; expected (B, T, V) = {want}, so nothing "
                             "was compared")
        return logits

    def trace(self, ids: torch.Tensor):
        """(logits, trace) of `run_with_trace` on ids (B, T), without gradients; white-box."""
        ids = ids.to(self.device)
        self._restore_state()
        self.count(ids)
        with torch.no_grad(), model_failures_carried(self):
            return self.work.run_with_trace(ids)

    @contextmanager
    def scaled_scores(self, score_max: list[float | None] | None, target: float
                      ) -> Iterator[bool]:
        """Within the block, layer i's queries and keys come out multiplied by
        a_i = sqrt(target / score_max[i]) (forward hooks on `layers.i.attn.q_proj` and `k_proj`,
        or on its q_norm and k_norm where it has them:
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
                # after a q/k norm where there is one: a norm would undo a scaled projection
                pair = ((attn.q_norm, attn.k_norm) if getattr(attn, "q_norm", None) is not None
                        else (attn.q_proj, attn.k_proj))
                for proj in pair:
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
            from ..references.oracle import StreamedOracle

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
        # an overlength probe (T + 1 ids, to be rejected) is no forward pass of the model's
        self.longest = max(self.longest, min(ids.shape[-1] if ids.dim() else 1, self.probe_max))

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
        if self.max_seq_len is not None:
            return self.max_seq_len
        limit = self.facts.length_limit  # an undeclared hard limit the facts found
        return min(self.facts.intervention_len, limit or self.facts.intervention_len)

    def intervention_len(self) -> int:
        return self.short_len(self.facts.intervention_len)

    def short_len(self, cap: int) -> int:
        return max(1, min(self.probe_max, cap))


@contextmanager
def model_failures_carried(s: "Subject") -> Iterator[None]:
    """Within the block (a call of the model) an allocation failure leaves as `Exhausted` (see
    there), and on a model sharded over several ranks any other exception only once every rank
    raised it at this call (else RankFailed: sharding.agree_on_failure)."""
    try:
        yield
    except Exhausted:
        raise
    except Exception as exc:
        if out_of_memory(exc):
            raise Exhausted(exc) from exc
        if s.ranks_agree:
            agree_on_failure(s.audit_key, f"{s.running} (model call {s.calls})", exc)
        raise


class WrongShape(OutputError):
    """The model ran but its logits are not (B, T, V) for ids (B, T)."""


class MetaLogits(OutputError):
    """The model ran but its logits lie on the meta device: no values to read (reading one
    would fail inside torch with "Tensor.item() cannot be called on meta tensors")."""


class NonFiniteLogits(OutputError):
    """The model ran but its logits hold NaN or inf: what happened, not a leak (an OutputError:
    never counted as the model rejecting its input)."""


def non_finite_message(logits: torch.Tensor, dtype: torch.dtype) -> str:
    """Where the logits are not finite, what they hold, and the likely cause in a 16-bit
    dtype (an overflow: float16 ends at 65504)."""
    bad = ~torch.isfinite(logits.detach())
    where = bad.reshape(-1, logits.shape[-1]).any(-1).nonzero().flatten()
    positions = [[int(i) // logits.shape[-2], int(i) % logits.shape[-2]] for i in where[:6]] \
        if logits.dim() >= 3 else where[:6].tolist()
    kinds = [name for name, found in (("NaN", bool(torch.isnan(logits).any())),
                                      ("inf", bool(torch.isinf(logits).any()))) if found]
    cause = (f"; in {str(dtype).removeprefix('torch.')} an overflow (scores or activations past "
             f"{torch.finfo(dtype).max:.0f}) gives inf, and inf - inf NaN"
             if dtype in tolerances.LOW_PRECISION else "")
    return (f"non-finite logits ({' and '.join(kinds)}) at (batch, position) {positions}{cause}: "
            "nothing was compared, so nothing is called a leak")


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
    """The model's own weight, detached (no copy; gathered whole on a sharded model): the
    oracle converts what it reads, one stage at a time."""
    param = named.get(name)
    return None if param is None else whole(param.detach())


def get_attr(module: nn.Module, dotted: str):
    """module.<dotted> or None (e.g. "lm_head.weight")."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
