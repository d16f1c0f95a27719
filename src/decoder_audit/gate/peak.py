"""The gate's peak memory, predicted from the config and dtype before anything is built.

`decoder-audit verify` runs every check on the model itself (gate/runner.py: no copy; what a check
allocates is freed before the next one starts), so the process peaks at

    baseline + weights + the largest check's own allocations + what the allocator keeps

and `gate_peak(cfg, dtype)` adds these up check by check, from the code of each check:

  build        the Decoder built directly in the dtype (sources.py): the weights alone.
  inputs       the longest probe: one forward at T = max_seq_len (B = 1 past 4 x 32 tokens,
               gate/checks/inputs.py), no grad: its logits B x T x V plus the widest activations of one
               block (the MLP's w1 and w3 outputs and their product, q, k, v, the stream).
  invariance   determinism, batch_independence, causal, prefix, train_mode at the intervention
               length Ti = min(max_seq_len, 64): a few (B, Ti, V) logits alive at once (the two
               clean runs the Subject keeps, the intervention, its difference).
  tying_grad   (tied only) one backward into the shared V x D weight: the readout's gradient, the
               lookup's dense gradient and their sum, each V x D in the dtype.
  oracle       the fast model's gradients for one pass (gate/checks/reference.py: consecutive stages,
               readout first, within GRAD_SHARE of the parameters or one stage if larger; grouped
               here as the check groups them, from the parameter ledger), alive while the float64
               oracle recomputes a stage of that pass: a layer's weights and their gradients in
               float64 and copies of its largest matrix (autograd lays a gradient out as its
               weight, the comparison takes a difference); in the pass that reaches the
               embedding, its extra V x D copies instead (tying_grad's, or an untied lookup's
               temporary and the unread rows gathered).
  dead_parameters  the gradients of one share of the weights (DEAD_SHARE, in parameter order:
               the first share holds the embedding and its extra copies), from one forward at
               (3, 16) whose graph is kept: its saved activations (analytic.py's estimate).

The other checks (shapes, kv_cache at 16 positions, padding at 12, grad_causal at 12, the 16-bit
rounding floor: one layer in float64 without gradients) allocate less than these. Beside each
check's terms: the process baseline (measured), an allocator slack of SLACK_SHARE, and the kernel
buffers the first real-sized products leave resident (measured, capped).

Sharded (`world_size` N > 1, FSDP2, `verify --shard`): each rank holds 1/N of the weights and of
the gradients, taken in the same shares as one process (Subject.gradients_by_share), plus the
largest unit gathered whole at a time (one block, or the root group: embeddings, final norm and
readout) with its gradient, and what a check gathers whole to read (gate/sharding.whole: a
stage's weights, a weight's gradient); every rank runs the same probes, so the activations,
logits, a tied weight's summed gradients and the float64 oracle stage are a process's.

Calibrated against peak RSS (VmHWM) of fresh `decoder-audit verify` processes on the 2-core
machine (benchmarks/gate_peak.py): an upper bound within 25% of the measured peak from tiny-368
to Llama 2 7B in bfloat16. Outside the model: training paths declared to the gate
(checkpointing keeps three full sets of gradients), black-box and Hugging Face models, GPUs
(the baseline and the kernel buffers are host memory), and the sharded figure, which follows
the code but was not measured here.

Shape letters: B batch, T sequence length, D d_model, H query heads, Hkv KV heads, Dh head width,
F FFN width, V vocabulary, L layers, P parameters.
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from ..accounting.analytic import _activation_rows
from ..accounting.ledger import BLOCK_PARTS, parameter_ledger
from ..accounting.memory import _gb, available_bytes
from ..config import DecoderConfig
from ..errors import ConfigError
from .facts import DEFAULT_INTERVENTION_LEN
from .checks.inputs import _plan
from .measure import batch_not_equal
from .checks.reference import GRAD_SHARE
from .checks.weights import DEAD_SHARE

# VmHWM of `decoder-audit verify --preset tiny-368 --json` (368 weights: the interpreter, torch,
# decoder-audit and its CLI imports, a gate of tiny tensors): 251.7 MiB in three runs, measured on
# this machine (Linux, torch 2.13 CPU) on 2026-12-01, after the gate stopped importing sympy
# (gate/sharding.is_sharded; 291.8 MiB before). Every verify process holds it before its model;
# torch's import alone is 219 MiB of it.
PROCESS_BASELINE = 260 * 2**20  # rounded up from 251.7 MiB: the run-to-run spread
# What the allocator keeps resident beside the tensors alive at the peak: freed pieces under
# glibc's 32 MiB mmap threshold stay in its heap (a check frees and allocates many), and pages
# a tensor no longer uses are returned only between checks. Counted as this share of the
# weights and the check's own terms, enough to bound every measured case
# (benchmarks/gate_peak.py; the closest, a 156M-parameter Llama-style model: 5% above).
SLACK_SHARE = 0.1
# Logits (B, Ti, V) alive at once in the invariance checks (train_mode: the eval run, its copies,
# the seeded run, the intervention and the difference).
INVARIANCE_COPIES = 6
# V x D gradients beside the embedding's own at the peak of a backward into it. The lookup's
# gradient is built dense in a temporary before it lands; a tied weight's two paths are summed
# into a third tensor; the oracle's embedding stage gathers the rows no id looked up (nearly all
# V of them) to check that their gradient is 0.
TIED_EXTRA_COPIES = 2
ORACLE_EMBEDDING_EXTRA_COPIES = 2
# Memory the first real-sized products leave resident for the rest of the process (BLAS packing
# buffers, per-thread scratch, autograd's worker): before the first check the resident set was
# 15 MB above the built model for tiny-368, 35 MB for llama-debug (a 2 MB V x D), 45-110 MB for
# a V=40000, D=96 model (15 MB), 110 MB for GPT-2 small (154 MB) and 115-140 MB for a
# 156M-parameter Llama-style model (131 MB), and it did not grow with the model past that.
# Counted as RUNTIME_FLOOR + RUNTIME_FACTOR x the largest weight, at most RUNTIME_CAP.
RUNTIME_FLOOR = 32 * 2**20
RUNTIME_FACTOR = 6
RUNTIME_CAP = 192 * 2**20
# Copies of a layer's largest matrix beside its float64 weights and gradients in the oracle's
# stage: autograd lays the gradient of W (computed for W.T) out as W, and the comparison takes
# |oracle - fast| of a whole gradient.
F64_MATRIX_COPIES = 2
# The dead_parameters probe: one forward at (3, 16) (gate/checks/weights.py).
DEAD_BATCH, DEAD_LEN = 3, 16


@dataclass(frozen=True)
class GateTerm:
    """One named part of a check's peak: its bytes and how they were counted."""

    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class GatePeak:
    """The predicted peak of a verify process: `total` bytes, set by `check`, as `rows`; every
    modelled check's own total in `checks` (check -> bytes)."""

    total: int
    check: str
    rows: tuple[GateTerm, ...]
    checks: tuple[tuple[str, int], ...]
    dtype: str
    world_size: int

    def to_dict(self) -> dict:
        return {"total_bytes": self.total, "total_gb": round(self.total / 1e9, 3),
                "check": self.check, "dtype": self.dtype, "world_size": self.world_size,
                "rows": [{"name": r.name, "bytes": r.bytes, "formula": r.formula}
                         for r in self.rows],
                "checks": dict(self.checks)}


def gate_peak(cfg: DecoderConfig, dtype: torch.dtype = torch.float32, *,
              world_size: int = 1) -> GatePeak:
    """The predicted peak resident memory of `decoder-audit verify` on a Decoder with this config
    in `dtype` (see the module docstring); per rank under FSDP2 over `world_size` ranks. Nothing
    is allocated: every term is a formula of the config and the parameter ledger."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size={world_size!r} must be an integer >= 1")
    shape = _Shape(cfg, dtype, world_size)
    checks = {name: build(shape) for name, build in _CHECKS.items()}
    totals = {name: _with_base(shape, terms) for name, terms in checks.items()}
    check = max(totals, key=lambda name: sum(t.bytes for t in totals[name]))
    rows = tuple(totals[check])
    return GatePeak(total=sum(r.bytes for r in rows), check=check, rows=rows,
                    checks=tuple((name, sum(t.bytes for t in terms))
                                 for name, terms in totals.items()),
                    dtype=str(dtype).removeprefix("torch."), world_size=world_size)


# The measured peaks lie within [prediction / PREDICTION_MARGIN, prediction] (benchmarks/
# gate_peak.py: ratios 1.05-1.22 over twelve models). A refusal must be sure: the gate is refused
# only when even the lowest peak the prediction allows exceeds the memory available, so a model
# that fits (llama2-7b in bfloat16: 20.8 GB measured, 23.4 GB predicted) is never turned away.
PREDICTION_MARGIN = 1.25


def check_gate_fits(cfg: DecoderConfig, dtype: torch.dtype = torch.float32, *,
                    device: str | torch.device = "cpu", available: int | None = None,
                    world_size: int = 1, local_ranks: int = 1) -> GatePeak:
    """ConfigError naming the predicted peak, the check that sets it and the bytes available on
    `device` when the gate cannot fit (even its peak / PREDICTION_MARGIN is more than is
    available); the prediction otherwise. `available` overrides what
    the machine reports (memory.available_bytes); when neither is known the check passes.
    Sharded over `world_size` ranks, `local_ranks` of them share this memory (all the ranks of
    `torchrun --nproc-per-node N` on one host's CPU; 1 where each rank has its own GPU)."""
    peak = gate_peak(cfg, dtype, world_size=world_size)
    have, where = memory_available(device) if available is None else (available, "")
    need = peak.total * local_ranks
    if have is None or need / PREDICTION_MARGIN <= have:
        return peak
    largest = ", ".join(f"{r.name.split(' (')[0]} {_gb(r.bytes)}" for r in
                        sorted(peak.rows, key=lambda r: -r.bytes)[:3])
    halve = "; a 16-bit dtype halves the weights" if dtype.itemsize > 2 else ""
    per_rank = f" per rank of {world_size}" if world_size > 1 else ""
    ranks = f" x {local_ranks} ranks here = {_gb(need)}" if local_ranks > 1 else ""
    raise ConfigError(
        f"the gate would not fit in memory: verify in {peak.dtype} peaks at about "
        f"{_gb(peak.total)}{per_rank} in its {peak.check} check ({largest}){ranks}, and at "
        f"least {_gb(need / PREDICTION_MARGIN)}, but only "
        f"{_gb(have)} is available on {torch.device(device).type}{where}; nothing was built "
        f"(vocab_size={cfg.vocab_size}, d_model={cfg.d_model}, n_layers={cfg.n_layers}; "
        f"`decoder-audit account --dtype` shows every term{halve})")


def memory_available(device: str | torch.device = "cpu") -> tuple[int | None, str]:
    """(bytes the gate may still allocate on `device`, "" or where a tighter limit comes from):
    the memory the machine reports (accounting.memory: MemAvailable, the cgroup, the GPU), and
    on the CPU also this process's address-space limit (RLIMIT_AS, `ulimit -v`), under which an
    allocation fails however much memory the machine has free."""
    have = available_bytes(device)
    left = address_space_left() if torch.device(device).type == "cpu" else None
    if left is None or (have is not None and have <= left):
        return have, ""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return left, (f" under this process's address-space limit (ulimit -v: {_gb(limit)}, of which "
                  f"{_gb(left - PROCESS_BASELINE)} is not yet mapped)")


def address_space_left() -> int | None:
    """Bytes this process may still map under RLIMIT_AS, plus PROCESS_BASELINE (the prediction
    counts the process's own baseline, which is mapped already); None without a limit."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        status = Path("/proc/self/status").read_text()
        mapped = int(re.search(r"^VmSize:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024
    except (OSError, AttributeError, ValueError):
        return None
    return max(limit - mapped, 0) + PROCESS_BASELINE


def check_probes_fit(vocab_size: int, length: int, dtype: torch.dtype,
                     device: str | torch.device, *, what: str) -> None:
    """ConfigError when the logits the invariance checks keep at once at probe length `length`
    (INVARIANCE_COPIES x B x T x V) cannot fit in the memory available, even by the margin of
    the prediction: `what` names the setting that asked for that length (intervention_len=...).
    The model's own activations come on top: this refuses only what surely cannot run."""
    batch = batch_not_equal(length)
    need = INVARIANCE_COPIES * batch * length * vocab_size * dtype.itemsize
    have, where = memory_available(device)
    if have is None or need / PREDICTION_MARGIN <= have:
        return
    per_position = INVARIANCE_COPIES * 3 * vocab_size * dtype.itemsize
    fits = max(1, int(have * PREDICTION_MARGIN // per_position))
    raise ConfigError(
        f"{what}: the checks' logits at T={length} alone take {_gb(need)} ({INVARIANCE_COPIES} x "
        f"B={batch} x T={length} x V={vocab_size} x {dtype.itemsize} bytes), but only "
        f"{_gb(have)} is available on {torch.device(device).type}{where}; at most about {fits} "
        "positions fit; nothing was run")


class _Shape:
    """What the terms are made of: the config's letters, the dtype's bytes per element, and the
    parameter ledger's rows (no model is built: on the meta device a Decoder's initialisation
    would import torch._dynamo, 12 s on a loaded machine)."""

    def __init__(self, cfg: DecoderConfig, dtype: torch.dtype, world_size: int) -> None:
        self.cfg, self.world_size = cfg, world_size
        self.e = dtype.itemsize
        rows = parameter_ledger(cfg).as_dict()
        self.P = sum(rows.values())
        self.layer_numel = [sum(rows[f"layers.{i}.{part}"] for part in BLOCK_PARTS)
                            for i in range(cfg.n_layers)]
        D, Dh = cfg.d_model, cfg.head_dim
        self.vocab_rows = cfg.vocab_size * D  # the embedding, and an untied readout: V x D
        self.largest_matrix = max(D * cfg.d_ff, D * cfg.n_heads * Dh)  # w1 (D x F) or q (D x H*Dh)
        self.largest_weight = max(self.vocab_rows, self.largest_matrix,
                                  rows["position_embeddings"])
        # the oracle's stages in backward order: (name, new weights), a tied embedding counted
        # in the readout that reads it first
        readout = self.vocab_rows if cfg.tie_embeddings else rows["lm_head"]
        self.stages = [("final", readout + rows["ln_final"])]
        self.stages += [(f"layers.{i}", self.layer_numel[i]) for i in reversed(range(cfg.n_layers))]
        self.stages += [("embed", rows["position_embeddings"] + rows.get("embedding_norm", 0)
                         + (0 if cfg.tie_embeddings else rows["token_embeddings"]))]
        self.root_numel = self.P - sum(self.layer_numel)

    def sharded(self, numel: int) -> int:
        """Elements of `numel` that one rank holds: all of them unsharded, 1/N under FSDP2."""
        return -(-numel // self.world_size)

    @property
    def gathered(self) -> int:
        """Elements gathered whole at a time under FSDP2: the largest block or the root group."""
        return 0 if self.world_size == 1 else max(max(self.layer_numel, default=0),
                                                  self.root_numel)


def _with_base(s: _Shape, terms: list[GateTerm]) -> list[GateTerm]:
    """A check's own terms with what every check sits on: the process, the weights (a rank's
    share and, sharded, the unit gathered whole), and the allocator's slack."""
    e, N = s.e, s.world_size
    own = sum(t.bytes for t in terms)
    weights = [GateTerm("weights", s.sharded(s.P) * e,
                        f"P x {e}" if N == 1 else f"P / {N} x {e}")]
    if N > 1:
        weights.append(GateTerm("gathered unit (FSDP2)", s.gathered * e,
                                f"max(largest block, embeddings + final norm + readout) x {e}"))
    slack = int(SLACK_SHARE * (own + sum(t.bytes for t in weights)))
    runtime = min(RUNTIME_CAP, RUNTIME_FLOOR + RUNTIME_FACTOR * s.largest_weight * e)
    return [GateTerm("process baseline (interpreter, torch, decoder-audit)", PROCESS_BASELINE,
                     "measured: verify --preset tiny-368"),
            *weights, *terms,
            GateTerm("allocator slack", slack,
                     f"{SLACK_SHARE:g} x (the weights + the check's own terms)"),
            GateTerm("kernel buffers kept (BLAS packing, thread pools)", runtime,
                     f"min({RUNTIME_CAP / 2**20:g} MiB, {RUNTIME_FLOOR / 2**20:g} MiB + "
                     f"{RUNTIME_FACTOR} x the largest weight)")]


def _build(s: _Shape) -> list[GateTerm]:
    """Building: the Decoder is made directly in the dtype, so nothing beside the base terms."""
    return []


def _inputs(s: _Shape) -> list[GateTerm]:

    cfg, e = s.cfg, s.e
    # the plan of check_inputs for a Decoder (max_seq_len declared: probed up to it)
    B, T = max(((b, t) for t, b in _plan(SimpleNamespace(probe_max=cfg.max_seq_len))),
               key=lambda bt: bt[0] * bt[1])
    D, F, V = cfg.d_model, _mlp_width(cfg), cfg.vocab_size
    qkv = (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim
    return [GateTerm(f"logits of the longest probe (B={B}, T={T})", B * T * V * e,
                     f"B x T x V x {e}"),
            GateTerm("activations of one block, no grad", B * T * (3 * F + 4 * D + qkv) * e,
                     f"B x T x (3F + 4D + (H + 2Hkv)Dh) x {e}")]


def _invariance(s: _Shape) -> list[GateTerm]:

    cfg, e = s.cfg, s.e
    T = min(cfg.max_seq_len, DEFAULT_INTERVENTION_LEN)  # within the hard limit
    B = batch_not_equal(T)
    return [GateTerm(f"{INVARIANCE_COPIES} logits of the intervention batch (B={B}, Ti={T})",
                     INVARIANCE_COPIES * B * T * cfg.vocab_size * e,
                     f"{INVARIANCE_COPIES} x B x Ti x V x {e}")]


def _embedding_extra(s: _Shape, copies: int) -> GateTerm:
    """`copies` V x D gradients beside the embedding's own, at the peak of a backward into it
    (whole on every rank when sharded: FSDP2 sums the gathered root's gradients before it
    reduce-scatters them)."""
    return GateTerm(f"{copies} more V x D gradient{'s' if copies > 1 else ''} of the embedding",
                    copies * s.vocab_rows * s.e, f"{copies} x V x D x {s.e}")


def _gathered_whole(s: _Shape, numel: int, what: str) -> list[GateTerm]:
    """Sharded only: what a check gathers whole on every rank to read it (gate/sharding.whole)."""
    if s.world_size == 1:
        return []
    return [GateTerm(f"{what}, gathered whole to be read", numel * s.e, f"{what} x {s.e}")]


def _tying_grad(s: _Shape) -> list[GateTerm]:
    if not s.cfg.tie_embeddings:
        return []
    return [GateTerm("gradient of the tied V x D weight", s.sharded(s.vocab_rows) * s.e
                     + _gathered_grad(s), f"V x D x {s.e}" + _per_rank(s)),
            _embedding_extra(s, TIED_EXTRA_COPIES),
            *_gathered_whole(s, s.vocab_rows, "the tied gradient V x D")]


def _oracle(s: _Shape) -> list[GateTerm]:

    cfg, e = s.cfg, s.e
    f64 = GateTerm("float64 oracle stage: a layer's weights and gradients, matrix copies",
                   8 * (2 * max(s.layer_numel, default=0) + F64_MATRIX_COPIES * s.largest_matrix),
                   f"8 x (2 x one layer's P + {F64_MATRIX_COPIES} x its largest matrix)")

    def stage_extra(stage: str) -> GateTerm | None:
        if stage.startswith("layers."):
            return f64
        # the embedding's gradient comes in the pass of its first stage: the readout if tied
        if stage == ("final" if cfg.tie_embeddings else "embed"):
            return _embedding_extra(s, TIED_EXTRA_COPIES if cfg.tie_embeddings
                                    else ORACLE_EMBEDDING_EXTRA_COPIES)
        return None

    passes = []
    for numel, stages in _oracle_chunks(s, GRAD_SHARE):
        extras = [t for t in map(stage_extra, stages) if t is not None]
        extra = max(extras, key=lambda t: t.bytes, default=None)
        grads = GateTerm(f"fast gradients of one pass ({numel:,} weights: {stages[0]}"
                         + (f" .. {stages[-1]}" if len(stages) > 1 else "")
                         + f"; a share of {GRAD_SHARE:g})",
                         s.sharded(numel) * e + _gathered_grad(s),
                         f"max(GRAD_SHARE x P, one stage) x {e}" + _per_rank(s))
        passes.append([grads] + ([extra] if extra is not None else []))
    # the check's fast forward: (2, 6) ids past 10M parameters, (2, 12) below
    graph = _graph(s, 2, 6 if s.P > 10_000_000 else 12)
    # sharded: a stage's weights and each gradient compared are gathered whole
    whole = _gathered_whole(s, max(s.layer_numel, default=0) + s.largest_weight,
                            "one layer's weights and the largest gradient")
    return max(passes, key=lambda terms: sum(t.bytes for t in terms)) + [graph, *whole]


def _dead_parameters(s: _Shape) -> list[GateTerm]:

    cfg, e = s.cfg, s.e
    # gate/checks/weights.py's _shares: consecutive weights, at most DEAD_SHARE of P (a bigger one
    # alone); the first share holds the embedding (registered first), with its extra copies.
    share = max(int(DEAD_SHARE * s.P), s.largest_weight)
    return [GateTerm(f"gradients of one share of the weights (DEAD_SHARE={DEAD_SHARE:g})",
                     s.sharded(share) * e + _gathered_grad(s),
                     f"max(DEAD_SHARE x P, V x D, D x F) x {e}" + _per_rank(s)),
            _embedding_extra(s, TIED_EXTRA_COPIES if cfg.tie_embeddings else 1),
            *_gathered_whole(s, s.largest_weight, "the largest gradient"),
            _graph(s, DEAD_BATCH, DEAD_LEN)]


def _mlp_width(cfg: DecoderConfig) -> int:
    """F of the widest MLP a token passes through: d_ff, or a routed layer's k experts and its
    shared ones side by side (k x Fe + Fs: OLMoE's 8 x 1024 against its d_ff of 1024)."""
    routed = cfg.experts_per_token * cfg.expert_dim + cfg.shared_dim if cfg.routed else 0
    dense = any(not cfg.routes(i) for i in range(cfg.n_layers))
    return max(routed, cfg.d_ff if dense else 0)


def _graph(s: _Shape, batch: int, seq_len: int) -> GateTerm:
    """What one forward with grad keeps for backward at (B, T): analytic.py's activation estimate
    (float32 whatever the dtype, the eager attention pattern, logits and their log-softmax: an
    upper bound for the fused path and for 16-bit models)."""
    T = min(seq_len, s.cfg.max_seq_len)
    saved = sum(row.bytes for row in _activation_rows(s.cfg, batch, T))
    return GateTerm(f"activations saved for backward (B={batch}, T={T})", saved,
                    "analytic activation estimate at (B, T), float32")


def _oracle_chunks(s: _Shape, share: float) -> list[tuple[int, list[str]]]:
    """(new weights, stages) of each backward pass of the oracle check, grouped as
    gate/checks/reference.py's _chunks groups the stages: consecutive stages in backward order while
    their new weights stay within `share` of the parameters (a bigger stage alone)."""
    budget = share * s.P
    chunks: list[tuple[int, list[str]]] = [(0, [])]
    for stage, numel in s.stages:
        size, members = chunks[-1]
        if members and numel and size + numel > budget:
            chunks.append((0, []))
            size, members = chunks[-1]
        chunks[-1] = (size + numel, [*members, stage])
    return chunks


def _gathered_grad(s: _Shape) -> int:
    """Under FSDP2 the gathered unit's gradient exists whole until it is reduce-scattered."""
    return s.gathered * s.e


def _per_rank(s: _Shape) -> str:
    return "" if s.world_size == 1 else f" / {s.world_size}"


_CHECKS = {"build": _build, "inputs": _inputs, "invariance": _invariance,
           "tying_grad": _tying_grad, "oracle": _oracle, "dead_parameters": _dead_parameters}


__all__ = ["GatePeak", "GateTerm", "PROCESS_BASELINE", "check_gate_fits", "check_probes_fit",
           "gate_peak", "memory_available"]
