"""White-box weight checks: the parameter ledger, tying by identity, and the tied weight's
gradient as the sum of its two paths. They need a `DecoderConfig` and the Decoder's weight names
(`token_embeddings`, `lm_head`, ...); the registry skips them on a black box.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..accounting.ledger import measured_ledger, parameter_ledger, reconcile
from ..objective import logits_of
from . import tolerances
from .measure import batch_not_equal, largest
from .result import CheckResult
from .subject import Subject, get_attr


def check_params(s: Subject) -> CheckResult:
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
    emb, head = get_attr(s.model, "token_embeddings.weight"), get_attr(s.model, "lm_head.weight")
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
    through the readout, each computed separately (in float64) from the recorded activations:
        lookup[v]  = sum of dL/d(embedding output) over the positions whose id is v
        readout    = (dL/dlogits)^T @ h, h the input of the readout (B*T, D).
    It runs on the model itself with only the shared weight requiring grad (one V x D gradient
    beside the weights, no copy); flags and .grad are restored afterwards."""
    model = s.work
    emb_module, head_module = get_attr(model, "token_embeddings"), get_attr(model, "lm_head")
    emb = get_attr(model, "token_embeddings.weight")
    if emb_module is None or head_module is None or emb is None:
        return CheckResult("tying_grad", False, "no token_embeddings / lm_head modules to observe",
                           {})
    with s.gradients_for([emb]):
        ids, seen = _backward_recording_both_paths(s, model, emb_module, head_module)
        if "lookup_out" not in seen or "readout_out" not in seen or seen["readout_out"].grad is None:
            return CheckResult("tying_grad", False, "the lookup or readout path was never run "
                               "through token_embeddings / lm_head", {})
        sums = _compare_path_sums(emb, ids, seen, s.vocab_size)
    batch, seq_len = ids.shape
    tol = tolerances.tying_grad(emb.dtype)
    worst, missing_readout = sums["error"], sums["shared_minus_lookup"]
    allowed = tol * sums["expected_max"]
    evidence = {"batch": batch, "seq_len": seq_len, "dtype": str(emb.dtype),
                "max_abs_error": worst, "allowed": allowed,
                "lookup_grad_max": sums["lookup_max"], "readout_grad_max": sums["readout_max"],
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


# Vocabulary rows of the shared weight compared at a time (float64 blocks, not V x D at once).
ROW_BLOCK = 2048


def _compare_path_sums(emb: torch.Tensor, ids: torch.Tensor, seen: dict[str, torch.Tensor],
                       vocab_size: int) -> dict[str, float]:
    """The shared weight's gradient (emb.grad) against lookup + readout, block by block of rows:
    largest |error|, largest |grad - lookup| (what a missing readout path would leave), and the
    largest |expected|, |lookup|, |readout|. The lookup path is nonzero only at the rows the ids
    look up, so it is added there alone; each block is one float64 buffer, updated in place."""
    dim = emb.shape[1]
    flat_ids = ids.reshape(-1)
    d_lookup = seen["lookup_out"].grad.reshape(-1, dim).double()  # (B*T, D)
    d_logits = seen["readout_out"].grad.reshape(-1, vocab_size).double()  # (B*T, V)
    h = seen["readout_in"].reshape(-1, dim).double()  # (B*T, D)
    rows, where = torch.unique(flat_ids, return_inverse=True)
    lookup = torch.zeros(len(rows), dim, dtype=torch.float64,
                         device=d_lookup.device).index_add_(0, where, d_lookup)  # (U, D)
    out = {"error": 0.0, "shared_minus_lookup": 0.0, "lookup_max": largest(lookup),
           "expected_max": 0.0, "readout_max": 0.0}
    for start in range(0, emb.shape[0], ROW_BLOCK):
        stop = min(start + ROW_BLOCK, emb.shape[0])
        inside = (rows >= start) & (rows < stop)
        here, looked = rows[inside] - start, lookup[inside]  # the looked-up rows of this block
        readout = d_logits[:, start:stop].T @ h  # (rows, D)
        out["readout_max"] = max(out["readout_max"], largest(readout))
        out["expected_max"] = max(out["expected_max"], largest(readout),
                                  largest(readout[here] + looked))
        diff = (torch.zeros_like(readout) if emb.grad is None
                else emb.grad[start:stop].to(torch.float64, copy=True))
        diff -= readout  # grad - readout
        diff[here] -= looked  # grad - readout - lookup
        out["error"] = max(out["error"], largest(diff))
        diff += readout  # grad - lookup
        out["shared_minus_lookup"] = max(out["shared_minus_lookup"], largest(diff))
    return out




def _backward_recording_both_paths(s: Subject, model, emb_module, head_module
                                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One loss.backward() on random ids and targets, with the lookup's output (B, T, D) and
    the readout's input (B, T, D) and output (B, T, V) kept, each with its gradient."""
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
        del logits, loss
    finally:
        for hook in hooks:
            hook.remove()
    s.count(ids)
    return ids, seen
