"""Every tolerance of the gate, declared and justified in one place.

A tolerance is relative to the scale of the values compared: a difference passes when
`|a - b| <= tol * max(1, max |reference|)`, so a model with large logits is not failed for
rounding and a model with tiny logits is not waved through. The printed tolerance of each check
is the `tol` below.

Invariance checks (causal, prefix, batch independence) run on a float64 copy of the model where
the model allows it. float64 has machine epsilon 2.2e-16; a forward pass of depth L over width D
accumulates rounding of order sqrt(D * L) * eps, far below 1e-12 for every preset (GPT-2 XL:
sqrt(1600 * 48) * 2.2e-16 = 6e-14). `INVARIANCE_FP64 = 1e-9` keeps a margin of 10^3 over that
and still sits 10^3 below a leak of 1e-6, which is therefore caught. A model that cannot run in
float64 is audited in float32 (eps 1.2e-7) with `INVARIANCE_FP32 = 1e-4`: the same margin over
fp32 rounding, at the price of missing leaks smaller than 1e-4 (the report says which dtype ran).
"""

from __future__ import annotations

import torch

INVARIANCE_FP64 = 1e-9
"""Causal, prefix and batch-independence comparisons in float64 (see the module docstring)."""

INVARIANCE_FP32 = 1e-4
"""The same comparisons when the model only runs in float32 (or lower; see `invariance`)."""

SHAPE_CHANGE_FP64 = 1e-6
"""Comparisons across different shapes (a prefix run alone vs the full run, a row alone vs in a
batch) in float64. Another (B, T) may select other kernel blocking, and common implementations
run the softmax in float32 even inside a float64 model (Hugging Face's eager attention calls
softmax(dtype=float32)), so rounding of order fp32 eps (1.2e-7) times a few layers appears; a
float64 Hugging Face Llama differs by 1.5e-8 between a prefix and the full run. The defects
these checks target move rows by O(1/T) (normalising by T, length-indexed tables), 10^4 above.
Same-shape interventions (causal cuts, other rows changed) keep INVARIANCE_FP64."""

INVARIANCE_LOW = 2e-2
"""float16/bfloat16 (eps 1e-3 / 8e-3): only when a model refuses both float64 and float32."""

SELF_DEPENDENCE_FACTOR = 10.0
"""Row c must move by more than 10x the invariance tolerance when token c changes: the model must
read its own position (a model whose row t only reads inputs < t predicts two tokens ahead).
Changing a token changes the residual stream at its own position by O(1), so a correct model
moves row c by many orders of magnitude more than this."""

DETERMINISM = 0.0
"""The same input twice in eval mode must give bitwise identical logits: CPU kernels are
deterministic for a fixed input shape, so any difference is dropout or noise left on."""

FUTURE_PROBABILITY = 0.0
"""Post-softmax probability on a future key must be exactly 0. A -inf mask gives exp(-inf) = 0
exactly; a finite "large negative" constant (-1e4) gives 0 only until scores grow past it, which
the stressed run (`STRESS_SCORE`) forces."""

STRESS_SCORE = 1e6
"""The stressed attention run scales the query and key projections so that the largest attention
score reaches about 1e6, far beyond any finite mask constant in use (-1e4, -1e9 is still caught
at the rows whose visible scores sit below it). float64 softmax subtracts the row maximum, so
correct rows stay exact."""


def row_sum(dtype: torch.dtype, seq_len: int) -> float:
    """|sum of an attention row - 1|: a sum of T rounded terms errs by at most about T * eps;
    4x margin, never below 16 terms' worth, and never below float32's eps even for a float64
    pattern (softmax is often computed in float32 and cast up). Wrong normalisation (a row
    summing to 0.5, 2, or 0) is caught either way."""
    eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
    return 4.0 * max(seq_len, 16) * eps


def invariance(dtype: torch.dtype) -> float:
    """The invariance tolerance for the dtype the checks actually ran in."""
    if dtype == torch.float64:
        return INVARIANCE_FP64
    if dtype == torch.float32:
        return INVARIANCE_FP32
    return INVARIANCE_LOW


def shape_change(dtype: torch.dtype) -> float:
    """Tolerance for comparing runs of different shapes (see SHAPE_CHANGE_FP64)."""
    return SHAPE_CHANGE_FP64 if dtype == torch.float64 else invariance(dtype)


def oracle(dtype: torch.dtype) -> float:
    """Fast forward vs the float64 slow oracle. Both in float64: the two differ only by
    summation order (fused attention vs per-row loops), rounding far below 1e-9, so
    the invariance tolerance applies; in float32 the fast side rounds at fp32."""
    return invariance(dtype)


def oracle_grad(dtype: torch.dtype) -> float:
    """Gradients vs the oracle's gradients, relative to the largest gradient entry: backward
    sums over B*T rows more terms than forward, so 10x the forward tolerance."""
    return 10.0 * invariance(dtype)


def tying_grad(dtype: torch.dtype) -> float:
    """The shared weight's gradient vs lookup-path + readout-path gradients computed separately
    from the same activations, relative to the largest entry. Both are sums of the same terms in
    a different order: a few eps of the dtype; 1e3 eps leaves margin while a missing path
    (an error of order 1) is caught."""
    return 1e3 * torch.finfo(dtype).eps


LOSS_ALIGNMENT = 1e-9
"""Flattened cross-entropy vs an explicit per-(b, t) loop, computed in float64 from the same
logits: identical terms, different summation order."""

NORMALISED_SUM = 1e-3
"""Logit rows are flagged as probabilities when every entry lies in [0, 1] and every row sums to
1 within 1e-3, and as log-probabilities when every entry is <= 0 and every row's logsumexp is 0
within 1e-3. Raw logits of any real model miss these by orders of magnitude (a random model's
logsumexp is about ln V)."""


HF_ROTARY_FP32 = 1e-5
"""A float64 Hugging Face Llama against the float64 oracle: transformers computes the rotary
angles (and RMSNorm) in float32 even inside a float64 model, so its logits carry fp32 rounding of
the angles (eps 1.2e-7 times positions up to the oracle's 12 and a few layers); measured 4e-7
on O(1) random weights. 1e-5 keeps a 25x margin; a wrong architecture (missing norm, RoPE layout,
GQA order) moves logits by O(1)."""


def hf_oracle(dtype: torch.dtype, cfg) -> float:
    """Tolerance of a Hugging Face model against the oracle fed its converted weights."""
    if dtype == torch.float64 and cfg.pos == "rope":
        return HF_ROTARY_FP32
    return oracle(dtype)
