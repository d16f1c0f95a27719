"""Every tolerance of the gate, declared and justified in one place.

The checks run in the model's own dtype (no float64 copy of the model), so every tolerance is a
function of that dtype. A tolerance is relative: a difference passes when
`|a - b| <= tol * max |reference|`, because floating point rounds every value relative to its
magnitude and the largest logit bounds the magnitudes a logit row is built from. The printed
tolerance of each check is that `tol`.

There are three kinds, from the tightest:

1. **Measured noise floor (same shape, same batch index).** Causal interventions and batch
   independence compare each row with the same row computed at the same batch index of a batch
   of the same shape (an intervention batch against a batch of copies of the base sequence). For
   a correct model the rows compared come out of identical arithmetic, so they agree bitwise in
   any dtype. The allowance is `NOISE_MARGIN` times a noise floor measured in the same run: the
   spread of identical rows at different batch indices. That spread is 0 on most kernels
   (measured: 0 in float32 and bfloat16 for GPT-2 small, tiny-368, cs336-test, llama-debug and
   nineteen of the twenty grid configs); vectorised elementwise kernels (tanh-GELU) finish a
   tensor's tail with other code, which gave 3.7e-9 (0.07 eps of float32 at the logit scale) in
   one grid config. A floor of 0 makes the comparison exact: any leak that survives the model's
   own rounding is caught, in float32 the 1e-6 leak of the zoo.
2. **Shape change.** A prefix run alone, a row alone (B = 1), the same row at another batch
   index, a cached or padded run: other shapes pick other kernel blocking, so rows round
   differently. In float32 every element carries accumulated rounding, and one flipped last bit
   at one element of layer 0 moves GPT-2 small's logits by up to 5.4 eps at the logit scale
   (measured); a prefix run differs by up to 1.4e-6 = 12 eps (GPT-2 small), 6e-7 (llama-debug).
   In bfloat16 and float16 every result is an fp32 accumulation rounded once, so differences are
   sparse one-ulp flips: one flip moves GPT-2 small's bf16 logits by at most 1.6 eps, a prefix
   run by up to 1.42e-2 = 1.8 eps (llama-debug 7.7e-3 = 1.0 eps). Hence `SHAPE_CHANGE_ULPS`:
   256 eps in float32 (3e-5: 20x the measurement), 8 eps in the 16-bit types (bfloat16 6.3e-2:
   4x). float64 keeps 1e-6 (Hugging Face runs its softmax in float32 even in float64).
3. **Against the float64 oracle.** The fast model in its dtype against exact arithmetic on the
   same weights: measured 7.3e-7 = 6 eps (GPT-2 small, float32), 9.8e-3 = 1.3 eps (GPT-2 small,
   bfloat16), up to 6.5e-3 on the small configs; the same multiples as a shape change apply.

In bfloat16 an effect smaller than its rounding is out of reach: the zoo's leak of 1e-6 rounds
away before it reaches a logit (the report says which dtype ran).
"""

from __future__ import annotations

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


def eps(dtype: torch.dtype) -> float:
    """The dtype's machine epsilon: float64 2.2e-16, float32 1.2e-7, float16 9.8e-4,
    bfloat16 7.8e-3."""
    return torch.finfo(dtype).eps


NOISE_MARGIN = 4.0
"""Same-shape, same-index comparisons allow 4x the noise floor measured in the same run (kind 1
above): the floor samples some of the positions where vectorised tails fall, the margin covers
the others. A floor of 0 gives an exact comparison."""


TRAIN_REPEATS = 2
"""Seeded train-mode calls repeated when identical calls differ (the model reseeds its RNG, or
draws from one the gate cannot seed; one repeat shows any difference, and a steady model gets
no more): two make the spread of identical calls, which bounds the leak test of such a model, a
maximum over twice the samples (every position and logit of the batch, each call)."""


def same_shape(noise_floor: float) -> float:
    """Relative tolerance of a same-shape comparison at the same batch index, from the noise
    floor measured beside it (relative to the logit scale)."""
    return NOISE_MARGIN * noise_floor


SHAPE_CHANGE_ULPS = {torch.float32: 256.0, torch.bfloat16: 8.0, torch.float16: 8.0}
"""Shape-change tolerances in eps of the dtype (kind 2 above), for float32, and for a 16-bit
model whose rounding floor cannot be measured (a black box)."""

SHAPE_CHANGE_FP64 = 1e-6
"""float64 runs of different shapes. Common implementations run the softmax in float32 even
inside a float64 model (Hugging Face's eager attention calls softmax(dtype=float32)), so rounding
of order fp32 eps (1.2e-7) times a few layers appears; a float64 Hugging Face Llama differs by
1.5e-8 between a prefix and the full run. The defects these checks target move rows by O(1/T)
(normalising by T, length-indexed tables), 10^4 above."""

ROUNDING_FLOOR_MIN_ULPS = 0.5
"""A measured rounding floor is never taken below half an eps: two different computations of the
same bfloat16 logit differ by a whole ulp whenever they differ at all."""


def shape_change(dtype: torch.dtype, rounding_floor: float | None = None) -> float:
    """Tolerance for comparing runs of different shapes (see the module docstring). In a 16-bit
    dtype with a measured `rounding_floor` (the slow oracle run in the model's dtype against
    float64, relative to the logit scale; `Subject.rounding_floor`): NOISE_MARGIN times it.
    Measured in bfloat16, the floor is 0.4-1.0 eps on the small configs and 1.8 eps on GPT-2
    small, and the fast model's own error against float64 and its prefix runs stay within
    1.4x of it on every one of them (24 configs): so 4x the floor, 2-7 eps, where a fixed
    allowance would need 8 eps for the deepest model."""
    if dtype == torch.float64:
        return SHAPE_CHANGE_FP64
    if rounding_floor is not None and dtype in LOW_PRECISION:
        return NOISE_MARGIN * max(rounding_floor, ROUNDING_FLOOR_MIN_ULPS * eps(dtype))
    return SHAPE_CHANGE_ULPS.get(dtype, SHAPE_CHANGE_ULPS[torch.float32]) * eps(dtype)


ROUNDING_JITTER_ULPS = 64.0
"""Earlier rows that move by at most this many eps of the logit scale when later tokens change
may be rounding, not a dependence: a kernel that groups the tokens of a row by what it computes
(routed experts batch the tokens an expert receives, and which tokens those are depends on the
whole row) rounds an earlier token's arithmetic differently when a later token changes, by an
ulp or a few (measured: 2^-26 and 2^-24 on two routed-expert models). Such a movement is
confirmed in float64 before it is called a leak (invariance.check_causal); a dependence keeps its
size in float64, rounding shrinks by 2^-29."""

FLOAT64_CONFIRM = 1e-9
"""Relative movement of earlier rows allowed when the same cuts are rerun on a float64 copy of
the model: 10^7 above float64 rounding (a few eps of 2.2e-16 through a few layers), 10^3 below
the smallest leak the float32 checks must catch (1e-6)."""

FLOAT64_CONFIRM_MAX_BYTES = 2 * 2**30
"""A float64 copy larger than this is not made (the confirmation is skipped and the movement
stays a failure): it doubles a float32 model's memory."""

SELF_DEPENDENCE_FACTOR = 10.0
"""Row c must move by more than 10x the causal allowance when token c changes (by more than 0
when the comparison is exact): the model must read its own position (a model whose row t only
reads inputs < t predicts two tokens ahead, and its row c does not move at all). Changing a token
changes the residual stream at its own position by O(1); measured, row c moves by 5% (tiny-368)
to 86% (cs336-test) of the logit scale, in float32 and bfloat16 alike."""

DETERMINISM = 0.0
"""The same input twice in eval mode must give bitwise identical logits: kernels are
deterministic for a fixed input shape, so any difference is dropout or noise left on."""

FUTURE_PROBABILITY = 0.0
"""Post-softmax probability on a future key must be exactly 0. A -inf mask gives exp(-inf) = 0
exactly; a finite "large negative" constant (-1e4) gives 0 only until scores grow past it, which
the stressed run (`stress_score`) forces."""

STRESS_SCORE = 1e6
"""The stressed attention run scales the query and key projections so that the largest attention
score reaches about 1e6, far beyond any finite mask constant in use (-1e4; -1e9 is still caught
at the rows whose visible scores sit below it). Softmax subtracts the row maximum, so correct
rows stay exact. bfloat16 has float32's exponent range, so 1e6 is representable."""


def stress_score(dtype: torch.dtype) -> float:
    """STRESS_SCORE, or for float16 (largest value 65504) 1/64 of its range, about 1e3, so that
    q.k before the 1/sqrt(Dh) scaling stays finite for head widths up to 4096. In float16 a finite
    mask constant below about -1e3 (the -1e4 of the zoo) is therefore out of reach."""
    return min(STRESS_SCORE, torch.finfo(dtype).max / 64)


def row_sum(dtype: torch.dtype, seq_len: int) -> float:
    """|sum of an attention row - 1|, summed in float64. Softmax is usually computed in float32
    (a sum of T rounded terms errs by about T * eps32) and its probabilities are then rounded to
    the pattern's dtype, each by at most eps/2 of itself, so the row's sum moves by at most eps/2
    of the dtype (the weights sum to 1). 4x margin over the larger of the two, never below 16
    terms' worth: bfloat16 3.1e-2, float32 7.6e-6 at T = 16. Wrong normalisation (a row summing to
    0.5, 2, or 0) is caught either way."""
    return 4.0 * max(eps(dtype), max(seq_len, 16) * eps(torch.float32))


def oracle(dtype: torch.dtype, rounding_floor: float | None = None) -> float:
    """Fast forward vs the float64 slow oracle (kind 3 above): the shape-change tolerance, from
    the measured rounding floor in a 16-bit dtype. A model in float64 differs from the oracle
    only by summation order (fused attention vs per-row loops): far below 1e-9 (measured 1e-14
    on GPT-2 small), so 1e-9."""
    if dtype == torch.float64:
        return ORACLE_FP64
    return shape_change(dtype, rounding_floor)


ORACLE_FP64 = 1e-9
"""The oracle tolerance of a float64 model (see `oracle`)."""


def oracle_grad(dtype: torch.dtype, rounding_floor: float | None = None) -> float:
    """Gradients vs the oracle's gradients, relative to the largest oracle gradient: backward
    sums over B*T rows more terms than forward, so 10x the forward tolerance in float32 and
    float64. In the 16-bit types every gradient is again one rounding of an fp32 accumulation
    per op, but the backward chains twice as many ops: 2x."""
    return (2.0 if dtype in LOW_PRECISION else 10.0) * oracle(dtype, rounding_floor)


def tying_grad(dtype: torch.dtype) -> float:
    """The shared weight's gradient vs lookup-path + readout-path gradients computed separately
    in float64 from the same recorded activations and gradients, relative to the largest entry.
    The shared gradient is the two paths' sums rounded to the dtype and added once more (one
    rounding each, plus the accumulation of repeated ids): a few eps. float32/float64 keep 1e3
    eps (their accumulations run over B*T terms in the dtype itself); the 16-bit types, whose
    accumulations run in float32, 8 eps (bfloat16 6.3e-2). A missing path is an error of order 1."""
    return (8.0 if dtype in LOW_PRECISION else 1e3) * eps(dtype)


LOSS_ALIGNMENT = 1e-9
"""Flattened cross-entropy vs an explicit per-(b, t) loop, computed in float64 from the same
logits: identical terms, different summation order."""

NORMALISED_SUM = 1e-3
"""Logit rows are flagged as probabilities when every entry lies in [0, 1] and every row sums to
1 within `normalised_sum(dtype)`, and as log-probabilities when every entry is <= 0 and every
row's logsumexp is 0 within it. Raw logits of any real model miss these by orders of magnitude (a
random model's logsumexp is about ln V >= 2)."""


def normalised_sum(dtype: torch.dtype) -> float:
    """NORMALISED_SUM, or 4 eps of a 16-bit dtype (bfloat16 3.1e-2): probabilities rounded to
    bfloat16 sum to 1 only within eps/2, and log-probabilities rounded to it carry eps/2 of
    their size each."""
    return max(NORMALISED_SUM, 4.0 * eps(dtype))


def router_logits(dtype: torch.dtype) -> float:
    """A router's returned logits against its weight applied in float64 to the input it
    received, relative to the largest logit: one matmul of D terms rounded in the dtype (and
    transformers' routers upcast nothing before it), far inside the shape-change tolerance
    (float32 3.1e-5, a 16-bit dtype 8 eps), which it takes. A returned tensor that is not the
    router's (a softmax of it, another layer's, a temperature applied) differs by O(1) of the
    logit scale. Also the gap under which two experts' logits count as tied (`router_loss`):
    rounding may rank them either way."""
    return SHAPE_CHANGE_ULPS.get(dtype, SHAPE_CHANGE_ULPS[torch.float32]) * eps(dtype) \
        if dtype != torch.float64 else SHAPE_CHANGE_FP64


HF_ROTARY_FP32 = 1e-5
"""A float64 Hugging Face Llama against the float64 oracle: transformers computes the rotary
angles (and RMSNorm) in float32 even inside a float64 model, so its logits carry fp32 rounding of
the angles (eps 1.2e-7 times positions up to the oracle's 12 and a few layers); measured 4e-7
on O(1) random weights. 1e-5 keeps a 25x margin; a wrong architecture (missing norm, RoPE layout,
GQA order) moves logits by O(1). The same holds for the positions transformers tables in float32
whatever the model's dtype: BLOOM's and MPT's ALiBi slopes (float32 powers), XGLM's sinusoidal
table (made in float32 at construction, then cast)."""

HF_FLOAT32_POSITIONS = ("rope", "alibi", "sinusoidal")
"""The position kinds whose angles, slopes or tables transformers computes in float32."""


def hf_oracle(dtype: torch.dtype, cfg) -> float:
    """Tolerance of a Hugging Face model against the oracle fed its converted weights."""
    if dtype == torch.float64 and cfg.pos in HF_FLOAT32_POSITIONS:
        return HF_ROTARY_FP32
    return oracle(dtype)


# kv_cache and padding compare runs of other shapes with the full forward (a query block of one
# token or a chunk against the cached keys; a padded row with an explicit mask against the row
# alone), so they take the shape-change tolerance, through Subject.shape_tolerance(): in a 16-bit
# dtype 4x the measured rounding floor of a white-box model's weights (in bfloat16 a window one
# key too wide moves logits by 4 eps, inside the 8 eps of the dtype alone). Measured on our
# Decoder: 4e-16 in float64, a few eps in float32. The defects they target (a position off by
# one after the prefill, a dropped or duplicated cache entry, an ignored mask, pads counted as
# positions) move logits by 1e-3..1 of the logit scale.


GRAD_CAUSAL_FUTURE = 0.0
"""The gradient of the loss at position t with respect to the input at a later position s > t
must be exactly 0, in any dtype: row t never reads s in the forward, so every term of the chain
rule that reaches s is multiplied by an exact zero (a probability of exp(-inf) = 0 on a masked
key; a zero upstream gradient through per-position layers). A backward kernel that mixes
positions leaves a nonzero entry there, however small."""

GRAD_CAUSAL_SELF = 0.0
"""... and the gradient at s = t itself must be nonzero (> 0): the residual stream carries the
input at t straight to the logits at t, so only a model whose row t ignores its own input (it
predicts two ahead) or a backward that drops it gives exactly 0."""
