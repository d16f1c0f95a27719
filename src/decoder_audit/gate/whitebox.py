"""White-box checks: attention rows, the parameter ledger, tying, its gradient, the oracle.

They need to see inside the model: a `DecoderConfig` and our weight layout (DESIGN.md's names:
`token_embeddings`, `layers.{i}.attn.q_proj`, `lm_head`, ...). `attention_rows` also works on a
black-box model that returns its attention patterns (Hugging Face `output_attentions=True`), and
`oracle` on a Hugging Face GPT-2 or Llama model, whose weights the converter can read.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ledger import measured_ledger, parameter_ledger, reconcile
from ..oracle import oracle_logits
from . import tolerances
from .result import CheckResult, skipped
from .subject import Subject, batch_not_equal, logits_of, scaled_excess

# Attention pictures keep at most this many positions per side.
PICTURE_LEN = 16


def _get(module: nn.Module, dotted: str):
    """module.<dotted> or None (e.g. "lm_head.weight")."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# ---- attention rows ---------------------------------------------------------------------------

def _patterns(s: Subject, module: nn.Module,
              ids: torch.Tensor) -> tuple[list[torch.Tensor] | None, list[float] | None]:
    """Attention patterns (B, H, T, T) per layer, from our trace or a Hugging Face model's
    `output_attentions` (None when the model exposes none), and the largest |score| per layer
    (trace only)."""
    if s.has_trace:
        _, trace = module.run_with_trace(ids.to(s.device))
        s.count(ids)
        layers = sorted({int(n.split(".")[1]) for n in trace if n.endswith(".attn.pattern")})
        scores = [float(trace[f"layers.{i}.attn.scores"].abs().max())
                  if f"layers.{i}.attn.scores" in trace else None for i in layers]
        return [trace[f"layers.{i}.attn.pattern"] for i in layers], scores
    try:
        with torch.no_grad():
            out = module(ids.to(s.device), output_attentions=True)
    except Exception:
        return None, None
    s.count(ids)
    attentions = getattr(out, "attentions", None)
    if not attentions or not all(isinstance(a, torch.Tensor) and a.dim() == 4 for a in attentions):
        return None, None
    return list(attentions), None


def _judge_patterns(patterns: list[torch.Tensor], seq_len: int) -> tuple[list[dict], list[str]]:
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    records, problems = [], []
    for layer, pattern in enumerate(patterns):
        pattern = pattern.detach().cpu()
        tol = tolerances.row_sum(pattern.dtype, seq_len)
        for head in range(pattern.shape[1]):
            p = pattern[:, head].double()  # (B, T, T)
            finite = bool(torch.isfinite(p).all())
            row_err = (p.sum(-1) - 1).abs().nan_to_num(float("inf"))  # (B, T)
            on_future = p.masked_select(future.expand_as(p))
            future_max = float(on_future.abs().nan_to_num(float("inf")).max()) if on_future.numel() else 0.0
            rec = {"layer": layer, "head": head, "finite": finite,
                   "max_row_sum_error": float(row_err.max()),
                   "max_future_probability": future_max, "row_sum_tolerance": tol}
            records.append(rec)
            if not finite:
                rows = sorted({int(t) for t in (~torch.isfinite(p)).any(-1).nonzero()[:, 1]})
                problems.append(f"layer {layer} head {head}: non-finite probabilities in rows "
                                f"{rows[:8]} (a row with every key masked?)")
            elif future_max > tolerances.FUTURE_PROBABILITY:
                bad = (p * future).amax(0).nonzero()[0].tolist()
                problems.append(f"layer {layer} head {head}: probability {future_max:.3g} on a "
                                f"future key (row {bad[0]}, key {bad[1]}); masked keys must get "
                                "exactly 0")
            elif float(row_err.max()) > tol:
                problems.append(f"layer {layer} head {head}: a row sums to 1 +- "
                                f"{float(row_err.max()):.3g} (allowed {tol:.1e})")
    return records, problems


def _stressed_copy(s: Subject, score_max: list[float | None] | None) -> nn.Module | None:
    """A copy of the working model whose query and key projections (weights and biases) are
    each scaled by a = sqrt(STRESS_SCORE / max |score|), so every layer's largest attention score
    grows by a^2 to about STRESS_SCORE. A finite mask constant is then beaten; -inf is not
    (DEFECTS.md #10)."""
    if s.cfg is None or s.in_place or not score_max or any(m is None for m in score_max):
        return None
    stressed = copy.deepcopy(s.work)
    with torch.no_grad():
        for i, largest in enumerate(score_max):
            q, k = _get(stressed, f"layers.{i}.attn.q_proj"), _get(stressed, f"layers.{i}.attn.k_proj")
            if not isinstance(q, nn.Module) or not isinstance(k, nn.Module):
                return None
            factor = math.sqrt(tolerances.STRESS_SCORE / max(largest, 1e-12))
            for proj in (q, k):
                for param in proj.parameters(recurse=False):
                    param.mul_(factor)
    return stressed


def check_attention_rows(s: Subject) -> CheckResult:
    seq_len = s.short_len(PICTURE_LEN)
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(9))
    patterns, score_max = _patterns(s, s.work, ids)
    if patterns is None:
        return skipped("attention_rows", "black-box model exposes no attention patterns "
                       "(neither our trace nor output_attentions)")
    records, problems = _judge_patterns(patterns, seq_len)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(patterns[0].dtype),
                      "heads": records}
    arrays = {"patterns": [p[0].detach().cpu().double().numpy() for p in patterns], "ids": ids[0].tolist()}
    stressed = _stressed_copy(s, score_max) if not problems else None
    if stressed is not None:
        stressed_patterns, _ = _patterns(s, stressed, ids)
        stress_records, stress_problems = _judge_patterns(stressed_patterns, seq_len)
        evidence["stressed"] = {
            "how": f"q_proj and k_proj scaled so attention scores reach ~{tolerances.STRESS_SCORE:.0e}",
            "max_future_probability": max(r["max_future_probability"] for r in stress_records),
            "all_finite": all(r["finite"] for r in stress_records),
        }
        problems += [f"under scaled-up Q/K: {p}" for p in stress_problems]
        del stressed
    n_heads = len(records)
    if problems:
        result = CheckResult("attention_rows", False, problems[0], evidence,
                             tolerances.FUTURE_PROBABILITY)
    else:
        stress = " (also under Q/K scaled to scores ~1e6)" if "stressed" in evidence else ""
        worst = max(r["max_row_sum_error"] for r in records)
        result = CheckResult("attention_rows", True, f"{n_heads} layer-heads: finite, rows sum to 1 "
                             f"(worst error {worst:.1e}), exactly 0 on future keys{stress}",
                             evidence, tolerances.FUTURE_PROBABILITY)
    result.arrays = arrays
    return result


# ---- parameter ledger and tying -------------------------------------------------------------

def check_params(s: Subject) -> CheckResult:
    if s.cfg is None:
        return skipped("params", "black-box: no DecoderConfig to derive the analytic ledger from")
    analytic, measured = parameter_ledger(s.cfg), measured_ledger(s.model)
    problems = reconcile(analytic, measured)
    evidence = {
        "analytic": analytic.as_dict(), "measured": measured.as_dict(),
        "analytic_total": analytic.total, "measured_total": measured.total,
        "rows": [list(row) for row in analytic.grouped()],
        "measured_rows": [list(row) for row in measured.grouped()],
        "differences": problems, "notes": measured.notes,
    }
    if problems:
        return CheckResult("params", False, problems[0] if len(problems) == 1 else
                           f"{problems[0]}; {problems[-1]}", evidence)
    return CheckResult("params", True, f"measured {measured.total:,} unique parameters = analytic "
                       f"{analytic.total:,}", evidence)


def check_tying(s: Subject) -> CheckResult:
    if s.cfg is None:
        return skipped("tying", "black-box: tying is not declared by a DecoderConfig")
    emb, head = _get(s.model, "token_embeddings.weight"), _get(s.model, "lm_head.weight")
    if emb is None or head is None:
        return CheckResult("tying", False, "no token_embeddings.weight / lm_head.weight to compare",
                           {"found": {"token_embeddings.weight": emb is not None,
                                      "lm_head.weight": head is not None}})
    same_object = head is emb
    same_storage = head.data_ptr() == emb.data_ptr()
    same_values = head.shape == emb.shape and bool(torch.equal(head.detach(), emb.detach()))
    listed = len(list(s.model.named_parameters(remove_duplicate=False)))
    unique = len(list(s.model.parameters()))
    evidence = {"declared_tied": s.cfg.tie_embeddings, "same_object": same_object,
                "same_storage": same_storage, "same_values": same_values,
                "parameters_listed": listed, "parameters_unique": unique}
    if s.cfg.tie_embeddings:
        if same_object:
            return CheckResult("tying", True, "lm_head.weight is token_embeddings.weight "
                               "(one Parameter object)", evidence)
        if same_storage:
            why = "two Parameter objects share one storage: the optimizer keeps two states"
        elif same_values:
            why = "same values copied into a separate Parameter: false tying, they drift apart"
        else:
            why = "lm_head.weight is a separate Parameter with different values: the tie was lost"
        return CheckResult("tying", False, f"declared tied, but {why}", evidence)
    if same_object or same_storage:
        return CheckResult("tying", False, "declared untied (tie_embeddings=False), but lm_head "
                           "uses the token-embedding weight", evidence)
    return CheckResult("tying", True, "declared untied: lm_head.weight is its own Parameter",
                       evidence)


def check_tying_grad(s: Subject) -> CheckResult:
    """The shared weight's gradient equals the gradient through the lookup plus the gradient
    through the readout, each computed separately from the recorded activations:
        lookup[v]  = sum of dL/d(embedding output) over the positions whose id is v
        readout    = (dL/dlogits)^T @ h, h the input of the readout (B*T, D)."""
    if s.cfg is None:
        return skipped("tying_grad", "black-box: no declared tie")
    if not s.cfg.tie_embeddings:
        return skipped("tying_grad", "declared untied: no shared weight")
    try:
        model = copy.deepcopy(s.model)  # its own dtype: a dtype move could re-tie our Decoder
    except Exception as exc:
        return skipped("tying_grad", f"the model cannot be copied ({type(exc).__name__}); "
                       "gradients would touch the user's model")
    model.eval()
    emb_module, head_module = _get(model, "token_embeddings"), _get(model, "lm_head")
    emb = _get(model, "token_embeddings.weight")
    if emb_module is None or head_module is None or emb is None:
        return CheckResult("tying_grad", False, "no token_embeddings / lm_head modules to observe",
                           {})
    seen: dict[str, torch.Tensor] = {}

    def keep_lookup(_module, _inputs, output):
        output.retain_grad()
        seen["lookup_out"] = output

    def keep_readout(_module, inputs, output):
        output.retain_grad()
        seen["readout_in"], seen["readout_out"] = inputs[0].detach(), output

    hooks = [emb_module.register_forward_hook(keep_lookup),
             head_module.register_forward_hook(keep_readout)]
    seq_len = s.short_len(8)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(10)
    ids = s.random_ids(batch, seq_len, gen).to(s.device)
    targets = s.random_ids(batch, seq_len, gen).to(s.device)
    try:
        logits = logits_of(model(ids))
        loss = F.cross_entropy(logits.reshape(-1, s.vocab_size).float(), targets.reshape(-1))
        loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    s.count(ids)
    if "lookup_out" not in seen or "readout_out" not in seen or seen["readout_out"].grad is None:
        return CheckResult("tying_grad", False, "the lookup or readout path was never run "
                           "through token_embeddings / lm_head", {})
    dim = emb.shape[1]
    d_lookup = seen["lookup_out"].grad.reshape(-1, dim)  # (B*T, D)
    lookup = torch.zeros_like(emb).index_add_(0, ids.reshape(-1), d_lookup.to(emb.dtype))  # (V, D)
    d_logits = seen["readout_out"].grad.reshape(-1, s.vocab_size)  # (B*T, V)
    readout = (d_logits.T @ seen["readout_in"].reshape(-1, dim)).to(emb.dtype)  # (V, D)
    expected = lookup + readout
    got = emb.grad if emb.grad is not None else torch.zeros_like(emb)
    tol = tolerances.tying_grad(emb.dtype)
    worst = float((got - expected).abs().max())
    allowed = tol * float(expected.abs().max())
    missing_readout = float((got - lookup).abs().max())
    evidence = {"batch": batch, "seq_len": seq_len, "dtype": str(emb.dtype),
                "max_abs_error": worst, "allowed": allowed,
                "lookup_grad_max": float(lookup.abs().max()),
                "readout_grad_max": float(readout.abs().max()),
                "shared_minus_lookup_max": missing_readout}
    if worst <= allowed:
        return CheckResult("tying_grad", True, "shared weight gradient = lookup path + readout "
                           f"path (max error {worst:.1e}, allowed {allowed:.1e})", evidence, tol)
    if missing_readout <= allowed:
        why = ("the embedding's gradient holds only the lookup path: the readout's gradient goes "
               "elsewhere")
    else:
        why = "the embedding's gradient is not the sum of the two paths"
    return CheckResult("tying_grad", False, f"{why} (max error {worst:.3g}, allowed {allowed:.1e})",
                       evidence, tol)


# ---- the slow oracle --------------------------------------------------------------------------

def check_oracle(s: Subject) -> CheckResult:
    """Fast forward (the working copy) against `oracle_logits` fed the same weights, on a short
    sequence (the oracle loops over heads and rows in Python). Values, the eager trace path, and
    the gradients of a fixed random projection of the logits with respect to every weight."""
    if s.cfg is None:
        return _check_hf_against_oracle(s)
    cfg = s.cfg
    big = sum(p.numel() for p in s.model.parameters()) > 10_000_000
    seq_len = s.short_len(6 if big else 12)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(11)
    ids = s.random_ids(batch, seq_len, gen)
    model = s.work
    tol, grad_tol = tolerances.oracle(s.dtype), tolerances.oracle_grad(s.dtype)
    with_grads = not s.in_place
    named = list(model.named_parameters(remove_duplicate=False))
    # One oracle leaf per Parameter object, so a tied weight is one leaf under both names. The
    # oracle runs on the CPU in float64 whatever device the model is on.
    leaves: dict[int, torch.Tensor] = {}
    for _, param in named:
        if id(param) not in leaves:
            # detach() shares storage with the (float64, CPU) working copy: nothing is copied,
            # and neither side writes to it.
            leaves[id(param)] = (param.detach().to("cpu", torch.float64)
                                 .requires_grad_(with_grads))
    state = {name: leaves[id(param)] for name, param in named}
    state.update({name: buf.cpu() for name, buf in model.named_buffers()})
    weights = torch.randn(batch, seq_len, s.vocab_size, generator=gen, dtype=torch.float64)

    if with_grads:
        for _, param in named:
            param.requires_grad_(True)
            param.grad = None
    try:
        with torch.enable_grad():
            fast = logits_of(model(ids.to(s.device)))
            s.count(ids)
            if with_grads:
                (fast.double() * weights.to(fast.device)).sum().backward()
        reference = oracle_logits(state, cfg, ids)
        if with_grads:
            (reference * weights).sum().backward()
    finally:
        grads = {name: (None if p.grad is None else p.grad.detach().double().cpu())
                 for name, p in model.named_parameters()}
        if with_grads:
            for _, param in named:
                param.grad = None
                param.requires_grad_(False)
    fast = fast.detach().double().cpu()
    worst, allowed = scaled_excess(fast - reference.detach(), reference, tol)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype),
                      "max_abs_logit_error": worst, "allowed": allowed}
    problems = []
    if not worst <= allowed:
        rows = (fast - reference.detach()).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        problems.append(f"fast logits differ from the slow oracle by up to {worst:.3g} (allowed "
                        f"{allowed:.1e}); first differing position "
                        f"{int((rows > allowed).nonzero()[0])}")
    if s.has_trace:
        eager, _ = model.run_with_trace(ids.to(s.device))
        s.count(ids)
        e_worst, e_allowed = scaled_excess(eager.double().cpu() - fast, fast, tol)
        evidence["eager_vs_fast_max_abs"] = e_worst
        if not e_worst <= e_allowed:
            problems.append(f"the eager (traced) path differs from the fast path by {e_worst:.3g}")
    if with_grads and not problems:
        by_object = {id(p): name for name, p in model.named_parameters()}
        scale = max((float(leaf.grad.abs().max()) for leaf in leaves.values()
                     if leaf.grad is not None), default=0.0)
        g_allowed = grad_tol * max(scale, 1e-30)
        grad_worst, grad_name = 0.0, None
        for pid, leaf in leaves.items():
            name = by_object.get(pid)
            want = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            have = grads.get(name)
            have = torch.zeros_like(want) if have is None else have
            err = float((have - want).abs().max()) if want.numel() else 0.0
            if err > grad_worst:
                grad_worst, grad_name = err, name
        evidence.update(max_abs_grad_error=grad_worst, worst_grad_parameter=grad_name,
                        grad_allowed=g_allowed)
        if not grad_worst <= g_allowed:
            problems.append(f"gradient of {grad_name} differs from the oracle's by {grad_worst:.3g} "
                            f"(allowed {g_allowed:.1e})")
    if problems:
        return CheckResult("oracle", False, problems[0], evidence, tol)
    grads_note = f"; gradients of {len(leaves)} weights agree" if with_grads else ""
    return CheckResult("oracle", True, f"fast logits = oracle on ({batch}, {seq_len}) ids (max error "
                       f"{worst:.1e}){grads_note}", evidence, tol)


def _check_hf_against_oracle(s: Subject) -> CheckResult:
    """A Hugging Face GPT-2 or Llama model (a black box to the rest of the gate) against the slow
    oracle fed its weights, read through our converter (`references.hf`): the HF forward must
    compute the architecture its config declares. Other black boxes are skipped."""
    family = type(s.model).__name__
    if family not in ("GPT2LMHeadModel", "LlamaForCausalLM"):
        return skipped("oracle", "black-box: the oracle needs a DecoderConfig and our weight names "
                                 "(or a Hugging Face GPT-2 / Llama model to convert)")
    from ..errors import ConfigError
    from ..references.hf import from_hf

    try:
        converted = from_hf(s.model)
    except (ConfigError, ImportError) as exc:
        return skipped("oracle", f"{family} could not be converted for the oracle: {exc}")
    cfg = converted.config
    seq_len = s.short_len(6 if converted.num_parameters() > 10_000_000 else 12)
    ids = s.random_ids(batch_not_equal(seq_len, (2, 3)), seq_len, s.generator(11))
    with torch.no_grad():
        fast = logits_of(s.work(ids.to(s.device))).double().cpu()
        s.count(ids)
        reference = oracle_logits(converted.state_dict(), cfg, ids)
    tol = tolerances.hf_oracle(s.dtype, cfg)
    worst, allowed = scaled_excess(fast - reference, reference, tol)
    evidence = {"batch": ids.shape[0], "seq_len": seq_len, "dtype": str(s.dtype),
                "reference": f"{family} weights via references.hf.from_hf",
                "max_abs_logit_error": worst, "allowed": allowed}
    if not worst <= allowed:
        rows = (fast - reference).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        return CheckResult("oracle", False, f"{family} logits differ from the slow oracle fed its "
                           f"weights by up to {worst:.3g} (allowed {allowed:.1e})", evidence, tol)
    return CheckResult("oracle", True, f"{family} logits = oracle fed its converted weights on "
                       f"({ids.shape[0]}, {seq_len}) ids (max error {worst:.1e})", evidence, tol)
