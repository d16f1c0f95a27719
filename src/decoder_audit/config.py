"""`DecoderConfig`: the one object that owns every dimension and policy of a decoder.

Shape letters used throughout the package:
    B batch, T sequence length, D d_model, H query heads, Hkv key/value heads,
    Dh head width (D / H unless head_width says), F FFN width, V vocabulary, L layers;
    E routed experts, k experts per token, Fe an expert's width; in latent attention Dv the
    value head width.

The config validates itself on construction, before a single weight exists, and raises
`ConfigError` listing every offending field with its value. Modules receive final integers
from it (`head_dim`, `kv_heads`, `kv_group_size`) and never rescale them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

NORMS = ("layernorm", "rmsnorm")
MLPS = ("relu", "relu2", "gelu", "gelu_tanh", "xielu", "swiglu", "geglu", "swiglu_clamped")
# Activations with parameters of their own, learned per layer (ffn.act.*)
LEARNED_ACTIVATIONS = ("xielu",)
# The gated MLPs: w2(act(w1 x) * w3 x), and GPT-OSS's clamped SwiGLU of the same three matrices.
GATED_MLPS = ("swiglu", "geglu", "swiglu_clamped")
POSITIONS = ("learned", "rope", "alibi", "sinusoidal", "none")
# Which features of a head RoPE rotates together: "interleaved" pairs (x[2j], x[2j+1]) (the
# original RoFormer / Llama / CS336 layout, torchtune) or "rotate_half" pairs (x[j], x[j + Dh/2])
# (Hugging Face Llama and its descendants, GPT-NeoX, litgpt). Pair j turns by the same angle in
# both; they differ in which weight rows make up a pair, so neither is the other renamed.
ROPE_LAYOUTS = ("interleaved", "rotate_half")
QK_NORM_SCOPES = ("head", "projection")
QK_NORM_KINDS = ("rmsnorm", "layernorm")
# Where the q/k norms act: on the projections before RoPE turns them (Qwen3, OLMo 2, Gemma 3),
# or on the rotated heads (Hunyuan's query_layernorm / key_layernorm).
QK_NORM_POSITIONS = ("before_rope", "after_rope")
# query_position_scale's keys: required, then optional with the default used.
QUERY_POSITION_SCALE = (("beta", "length"), {"offset": 0, "layers": None})
# Each RoPE scaling type's parameters: required, then optional with the default used.
ROPE_SCALING = {
    "linear": (("factor",), {}),
    "dynamic": (("factor", "original_max_seq_len"), {}),
    "llama3": (("factor", "original_max_seq_len", "low_freq_factor", "high_freq_factor"), {}),
    "yarn": (("factor", "original_max_seq_len"),
             {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "truncate": True}),
}
# "reject" raises ContextLengthError on T > max_seq_len. No other policy is implemented, so no
# other policy is accepted: a config cannot promise cropping or sliding that the model won't do.
CONTEXT_POLICIES = ("reject",)
# The projections a bias may sit on, by their weight names (DESIGN.md): attn_bias and mlp_bias
# take true, false, or a list of these (gate w1, down w2, up w3).
ATTN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "output_proj")
MLP_MATRICES = ("w1", "w2", "w3")
# How a router scores the experts: a softmax over their logits (Mixtral, Qwen-MoE, OLMoE) or
# each logit's sigmoid (DeepSeek-V3's scoring_func).
ROUTER_SCORINGS = ("softmax", "sigmoid")
# When the scores are taken: of every expert, then the top k picked ("score_topk": Hugging
# Face's Mixtral, Qwen-MoE, OLMoE, DeepSeek), or of the k largest logits only ("topk_score":
# Mistral's reference Mixtral, a softmax over the k chosen).
ROUTER_ORDERS = ("score_topk", "topk_score")
# How an expert group is ranked for group-limited routing (DeepSeek-V3, DeepSeek-V2).
GROUP_SCORES = ("top2_sum", "max")
# JSON nested deeper than this is refused before it is parsed (Python's parser recurses once per
# level and would raise RecursionError near 1000; no config is nested more than a few deep).
MAX_JSON_DEPTH = 100
# The fields JSON gives back as lists, held as tuples.
_LISTED = ("window_layers", "attn_bias", "mlp_bias", "nope_layers")


@dataclass(frozen=True)
class DecoderConfig:
    """Architecture of a pre-norm causal decoder. Frozen: a model's config never changes."""

    vocab_size: int
    """V: number of token ids; ids lie in [0, V)."""
    d_model: int
    """D: width of the residual stream."""
    n_layers: int
    """L: number of pre-norm blocks."""
    n_heads: int
    """H: query heads per attention layer."""
    d_ff: int
    """F: hidden width of the MLP (final number; SwiGLU does not rescale it)."""
    max_seq_len: int
    """Longest sequence the model accepts; longer input is rejected, never cropped."""
    n_kv_heads: int | None = None
    """Hkv: key/value heads (grouped-query attention). None means Hkv = H (plain MHA)."""
    head_width: int | None = None
    """Dh when it is not D / H (Gemma, Qwen3: q_proj is D -> H*Dh, output_proj H*Dh -> D).
    None means Dh = D / H, which must then divide."""
    norm: str = "layernorm"
    """"layernorm" (with bias) or "rmsnorm" (gain only)."""
    norm_eps: float = 1e-5
    """Epsilon added to the variance (LayerNorm) or mean square (RMSNorm)."""
    norm_offset: float = 0.0
    """Added to every norm's gain, RMSNorm or LayerNorm: the gain is offset + w (Gemma's RMSNorm,
    and the LayerNorm1P of Megatron / NeMo and Nemotron, store w around 0 and scale by 1 + w).
    A fresh model's w starts at 1 - offset, so its gain starts at 1."""
    embedding_scale: float | None = None
    """The token embedding's output multiplied by this, rounded to the model's dtype first (Gemma:
    sqrt(D)); None multiplies by nothing. The tied readout reads the unscaled weight."""
    embedding_norm: bool = False
    """A norm of the config's kind on the embedding stream (scaled tokens plus positions) before
    layer 0 (BLOOM's word_embeddings_layernorm): weights embedding_norm.weight (and .bias)."""
    norm_bias: bool = True
    """A LayerNorm's shift (False: gain only, nanoGPT's bias=False); RMSNorm has none."""
    norm_affine: bool = True
    """False: the block and final norms learn nothing, no gain and no shift (OLMo's LayerNorm)."""
    pre_norm: bool = True
    """False: each sublayer reads the stream itself, not a normalised copy (OLMo 2, whose
    sandwich norms normalise only the sublayers' outputs)."""
    post_norm: bool = False
    """Each sublayer's output added to the stream, then the sum normalised (the original
    Transformer's post-LN, GPT-1): x = N1(x + Attn(x)), then x = N2(x + MLP(x)), with weights
    ln1 and ln2. Needs pre_norm=False (the sublayers read the stream itself)."""
    final_norm: bool = True
    """A norm (ln_final) between the last block and the readout; False: the readout reads the
    last block's output itself (GPT-1, whose post-norm blocks end in a norm)."""
    mlp: str = "gelu"
    """"relu", "relu2" (ReLU squared: Nemotron, Arcee, Persimmon), "gelu" (exact erf),
    "gelu_tanh" (GPT-2's approximation), "xielu" (Apertus' xIELU, learned per layer: with
    a_p = softplus(alpha_p), a_n = 0.5 + softplus(alpha_n), x > 0 gives a_p x^2 + x / 2, else
    a_n (expm1(min(x, -1e-6)) - x) + x / 2; weights ffn.act.alpha_p and ffn.act.alpha_n, one
    number each), or a gated MLP w2(act(w1 x) * w3 x): "swiglu" (SiLU) or "geglu" (tanh GELU,
    Gemma's); or "swiglu_clamped", GPT-OSS's: with g = min(w1 x, limit) and u = clamp(w3 x,
    -limit, limit), w2((u + 1) * g * sigmoid(alpha * g)) (swiglu_alpha, swiglu_limit)."""
    swiglu_alpha: float = 1.702
    """alpha of mlp="swiglu_clamped": the gate's sigmoid reads alpha * g (GPT-OSS: 1.702)."""
    swiglu_limit: float = 7.0
    """limit of mlp="swiglu_clamped": the gate clamped above at it, the up projection to
    [-limit, limit] (GPT-OSS: 7)."""
    pos: str = "learned"
    """"learned" absolute positions, "rope" (rotary, see rope_layout), "alibi" (a linear bias
    -m_h * (t - s) on the score of query t and key s, head h's slope m_h from Press et al.'s
    schedule: BLOOM, MPT), "sinusoidal" (a fixed table added to the embeddings, XGLM's: row p is
    [sin(p f_0) .. sin(p f_{n-1}), cos(p f_0) .. cos(p f_{n-1})] with n = D // 2 frequencies
    f_i = 10000^(-i / (n - 1)), the sines then the cosines, an odd D's last column 0) or
    "none"."""
    position_offset: int = 0
    """Rows a position table keeps before position 0's, which no position reads (fairseq's 2:
    OPT's and BioGPT's learned table, XGLM's sinusoidal one): position t reads row
    position_offset + t, and a learned table is (position_offset + max_seq_len, D). 0 with
    RoPE, ALiBi or no positions."""
    rope_theta: float = 10000.0
    """RoPE base: pair j of a head rotates by pos * theta^(-2j/Dh)."""
    rope_layout: str = "interleaved"
    """Which features form RoPE's pair j: "interleaved" (x[2j], x[2j+1]) or "rotate_half"
    (x[j], x[j + R/2]), R the rotated width (rotary_dim)."""
    rotary_dim: int | None = None
    """R: RoPE rotates the first R features of each head and passes the other Dh - R through
    (partial rotary: GPT-NeoX's rotary_pct, Phi's and StableLM's partial_rotary_factor); pair j
    turns by pos * theta^(-2j/R). None rotates all Dh."""
    window_rope_theta: float | None = None
    """The RoPE base of the windowed layers (Gemma 3: 1e4 where the full layers use 1e6); their
    RoPE is then never scaled (rope_scaling is the full layers'). None: rope_theta and
    rope_scaling in every layer."""
    rope_scaling: dict | None = None
    """How RoPE's frequencies are stretched for a longer context (None: not at all), as a dict
    with "type" and that type's parameters (ROPE_SCALING lists them):
        linear   {"factor"}: positions divided by factor
        dynamic  {"factor", "original_max_seq_len"}: NTK-aware, the base grows with the
                 sequence once it passes original_max_seq_len
        llama3   {"factor", "original_max_seq_len", "low_freq_factor", "high_freq_factor"}:
                 low frequencies divided by factor, high ones kept, a smooth ramp between
        yarn     {"factor", "original_max_seq_len", "beta_fast", "beta_slow",
                 "attention_factor", "truncate"}: frequencies blended between kept and
                 divided over a ramp of pair indices, and q, k scaled by attention_factor."""
    sliding_window: int | None = None
    """W: in a windowed layer token t reads tokens t-W+1..t only (Mistral, Gemma 2's local
    layers); None: every layer reads every earlier token."""
    window_layers: tuple[int, ...] | None = None
    """The layers the window applies to (Gemma 2: 0, 2, 4, ...); None: every layer."""
    nope_layers: tuple[int, ...] | None = None
    """Layers whose attention rotates nothing although pos is "rope" (no positions: NoPE;
    SmolLM3's no_rope_layers, Cohere 2's full-attention layers); None: RoPE in every layer."""
    attn_scale: float | None = None
    """What the scores q.k are multiplied by; None: 1/sqrt(Dh). Gemma 2 scales by
    query_pre_attn_scalar^-0.5, which need not be the head width."""
    attn_sinks: bool = False
    """A learned logit per head (weight attn.sinks, (H,)) joins every softmax row's denominator
    and is then dropped: p_s = exp(score_s) / (sum_s' exp(score_s') + exp(sink_h)), so a row's
    visible keys sum to less than 1 by the sink's share (GPT-OSS, Granite SWA, Flint); in every
    layer."""
    query_position_scale: dict | None = None
    """Queries multiplied, after RoPE, by 1 + beta * ln(1 + floor((pos + offset) / length)) at
    position pos (Ministral 3's llama_4_scaling_beta over original_max_position_embeddings;
    Llama 4's temperature tuning of its NoPE layers): a dict with "beta" (> 0), "length" (> 0),
    "offset" (default 0) and "layers" (the layers it applies to; default every layer). Exactly 1
    below position length - offset. None: queries unscaled."""
    attn_softcap: float | None = None
    """c: scores become c * tanh(scores / c) before the mask and softmax (Gemma 2: 50)."""
    logit_softcap: float | None = None
    """c: the logits become c * tanh(logits / c) (Gemma 2: 30)."""
    sandwich_norm: bool = False
    """Each sublayer's output is normalised too before it joins the stream (Gemma 2):
    x + N1'(Attn(N1(x))), then + N2'(MLP(N2(.))), with weights ln1_post and ln2_post."""
    parallel_residual: bool = False
    """The block adds attention and MLP to the same input: x + Attn(N1(x)) + MLP(N2(x))
    (GPT-NeoX, Pythia), instead of the MLP reading the stream after attention."""
    shared_norm: bool = False
    """A parallel block's one norm feeds both sublayers: x + Attn(N1(x)) + MLP(N1(x)), no ln2
    (GPT-J, Phi, Cohere, Falcon's original block)."""
    residual_multiplier: float = 1.0
    """Each sublayer's output multiplied by this before it joins the stream (Granite's
    residual_multiplier): x + m * Attn(.), then + m * MLP(.)."""
    logit_scale: float = 1.0
    """The logits multiplied by this before any soft cap (Cohere's logit_scale; Granite
    divides by logits_scaling, a scale of 1 / logits_scaling)."""
    attn_bias: bool | tuple[str, ...] = False
    """Biases on the q/k/v projections, and on the output projection unless attn_output_bias
    says otherwise; or the projections that have one, any of ATTN_PROJECTIONS (["q_proj",
    "v_proj", "output_proj"]: Whisper's decoder, whose k_proj has none). A list is written back
    as the flags where they say the same: all four is true, none false, q/k/v alone true with
    attn_output_bias false, output_proj alone false with attn_output_bias true."""
    attn_output_bias: bool | None = None
    """The output projection's bias: None follows attn_bias; False with attn_bias=True is
    Qwen2's attention (q/k/v biases, none on the output). Left None when attn_bias is a list."""
    qk_norm: bool = False
    """RMSNorm (or a LayerNorm, qk_norm_kind; eps norm_eps) on the queries and keys, before
    RoPE: weights attn.q_norm and attn.k_norm, over each head (qk_norm_scope "head": a gain of
    Dh shared by the heads, Qwen3, Gemma 3) or over the whole projection ("projection": gains
    of H*Dh and Hkv*Dh, OLMo 2)."""
    qk_norm_scope: str = "head"
    """What one q/k norm normalises: "head" or "projection" (see qk_norm)."""
    qk_norm_kind: str = "rmsnorm"
    """The q/k norms' kind: "rmsnorm", or "layernorm" (Persimmon's per-head LayerNorms), whose
    shift attn.q_norm.bias, attn.k_norm.bias is there where norm_bias says."""
    qk_norm_position: str = "before_rope"
    """Where the q/k norms act: "before_rope" (Qwen3, OLMo 2, Gemma 3) or "after_rope", on each
    rotated head (Hunyuan's query_layernorm / key_layernorm; a learned gain does not commute
    with the rotation). "after_rope" needs qk_norm with qk_norm_scope "head"."""
    mlp_bias: bool | tuple[str, ...] = False
    """Biases on the MLP matrices; or the matrices that have one, any of MLP_MATRICES (w1 the
    gate, w3 the up projection: only in a gated MLP; w2 the down projection). A list naming
    every matrix the MLP has is written back as true, an empty one as false."""
    readout_bias: bool = False
    """A bias on the logits (TransformerLens' unembed.b_U): weight lm_head.bias, its own
    Parameter also when the readout matrix is tied."""
    # ---- routed experts (mixture of experts) ----
    n_experts: int | None = None
    """E: routed experts in each MoE layer, every one a MLP of the config's kind (mlp) and
    width expert_width (Mixtral's num_local_experts, Qwen-MoE's and OLMoE's num_experts,
    DeepSeek's n_routed_experts). None: every layer has one dense MLP of width d_ff."""
    experts_per_token: int | None = None
    """k: the experts each token is sent to, 1 <= k <= E (num_experts_per_tok in all four
    families). Required with n_experts."""
    expert_width: int | None = None
    """Fe: each routed expert's hidden width (Qwen-MoE's and DeepSeek's moe_intermediate_size;
    Mixtral's experts are intermediate_size wide). None: d_ff. The dense layers keep d_ff."""
    n_shared_experts: int = 0
    """Experts every token passes through besides its k routed ones, unweighted (DeepSeek's
    n_shared_experts; Qwen2-MoE has one). They run as one MLP of width n_shared_experts x
    shared_expert_width (the sum of separate ones, exactly): weights ffn.shared.*."""
    shared_expert_width: int | None = None
    """One shared expert's width (Qwen2-MoE's shared_expert_intermediate_size). None: the
    routed experts' width Fe (DeepSeek's)."""
    shared_expert_gate: bool = False
    """The shared experts' output multiplied by sigmoid(w_g . x), a learned gate (1, D) per
    layer (Qwen2-MoE's shared_expert_gate): weight ffn.shared_gate."""
    router_scoring: str = "softmax"
    """How the router turns its logits (ffn.router, E x D) into scores: "softmax" over the
    experts (Mixtral, Qwen-MoE, OLMoE) or "sigmoid" of each (DeepSeek-V3's scoring_func)."""
    router_order: str = "score_topk"
    """"score_topk": every expert scored, then the top k taken (Hugging Face's Mixtral,
    Qwen-MoE, OLMoE, DeepSeek); "topk_score": the k largest logits taken, then scored (Mistral's
    reference Mixtral: a softmax over the k, which renormalises by itself)."""
    normalize_topk: bool = True
    """The k chosen scores divided by their sum, so a token's expert weights sum to 1 (Mixtral
    always; norm_topk_prob in Qwen-MoE, OLMoE (false in both published models) and DeepSeek)."""
    router_bias: bool = False
    """A learned bias (E,) on the router's logits, which choose and weigh alike (GPT-OSS's
    router.bias): weight ffn.router.bias."""
    expert_bias: bool = False
    """Biases on every routed expert's matrices, w1 and w3 (Fe,) and w2 (D,) (GPT-OSS's
    gate_up_proj_bias and down_proj_bias); the shared experts have none."""
    router_selection_bias: bool = False
    """A learned per-expert bias (E,) added to the scores to choose the top k, not to weigh
    them (DeepSeek-V3's e_score_correction_bias, updated by a balancing rule, not by
    gradients): weight ffn.router.selection_bias, a Parameter that requires no grad."""
    expert_groups: int | None = None
    """G: the experts split into G equal groups, and a token's k chosen only within its best
    groups_per_token groups (DeepSeek's n_group, its group-limited routing). None: from all."""
    groups_per_token: int | None = None
    """The groups a token's experts come from (DeepSeek's topk_group). With expert_groups."""
    group_score: str = "top2_sum"
    """How a group is ranked, by its experts' selection scores (with the selection bias):
    "top2_sum", its two best summed (DeepSeek-V3's noaux_tc), or "max", its best (DeepSeek-V2's
    group_limited_greedy). With expert_groups."""
    routed_scaling: float = 1.0
    """The routed experts' weighted sum multiplied by this before the shared experts join it
    (DeepSeek's routed_scaling_factor: 2.5 in V3)."""
    shared_expert_scale: float = 1.0
    """The shared experts' output multiplied by this as it joins the routed sum (Cohere 2 MoE's
    "average" combination, (routed + shared) / 2: 0.5 here and in routed_scaling)."""
    first_dense_layers: int = 0
    """The first layers keep a dense MLP of width d_ff (DeepSeek's first_k_dense_replace)."""
    moe_every: int = 1
    """After them, layer i (from 0) routes when (i + 1) is a multiple of this (Qwen-MoE's
    decoder_sparse_step); the others are dense. 1: every layer past the dense ones routes."""
    capacity_factor: float | None = None
    """Where the model drops tokens: each expert takes at most ceil(capacity_factor x B x T x
    k / E) tokens of a forward, in batch-major order, and drops the rest (Switch Transformer,
    GShard). Such a model reads the other rows and later tokens: the gate reports it. None
    (the default, and every decoder named above at inference): no token is ever dropped."""
    # ---- multi-head latent attention (DeepSeek-V2/V3) ----
    kv_latent_rank: int | None = None
    """The width keys and values are compressed to (DeepSeek's kv_lora_rank): kv_a_proj maps D
    to this latent plus one rotary key shared by the heads, kv_a_norm normalises the latent,
    kv_b_proj expands it to every head's non-rotary key and value. None: q/k/v projections."""
    q_latent_rank: int | None = None
    """The queries' latent width (q_lora_rank): q_a_proj, q_a_norm, q_b_proj. None: one q_proj
    (DeepSeek-V2-Lite). Latent attention only."""
    rope_head_width: int | None = None
    """Each query and key head's rotary part, its last features (qk_rope_head_dim); RoPE turns
    its pair j by pos * theta^(-2j/this). Latent attention only."""
    nope_head_width: int | None = None
    """Each query and key head's non-rotary part, its first features (qk_nope_head_dim): the
    head width Dh is nope_head_width + rope_head_width. Latent attention only."""
    value_head_width: int | None = None
    """Dv: each value head's width (v_head_dim); output_proj reads H x Dv. Latent attention
    only."""
    latent_norm_eps: float | None = None
    """The epsilon of the latent norms (q_a_norm, kv_a_norm) where it is not norm_eps:
    transformers builds DeepSeek's, GLM-4.7-Flash's and MiniCPM3's with 1e-6 whatever their
    config's rms_norm_eps (1e-5 in the last two). None: norm_eps. Latent attention only."""
    tie_embeddings: bool = True
    """Readout uses the token-embedding Parameter itself (one object, one gradient)."""
    context_policy: str = "reject"
    """What happens to T > max_seq_len; only "reject" exists."""

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # the config's own copy: the caller's may change
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        if isinstance(self.query_position_scale, dict):  # its own copy, layers as a tuple
            scale = dict(self.query_position_scale)
            if isinstance(scale.get("layers"), list):
                scale["layers"] = tuple(scale["layers"])
            object.__setattr__(self, "query_position_scale", scale)
        for name in _LISTED:
            if isinstance(getattr(self, name), list):  # as JSON gives it back
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = _validate(self)
        if problems:
            raise ConfigError("invalid DecoderConfig: " + "; ".join(problems))
        for name, value in _bias_flags(self).items():  # one spelling per architecture
            object.__setattr__(self, name, value)

    # Derived values: computed here once so no module ever recomputes or rescales them.
    @property
    def kv_heads(self) -> int:
        """Hkv, with None resolved to H."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def gated(self) -> bool:
        """A gated MLP (w1, w3 in, w2 out): SwiGLU, GeGLU or the clamped SwiGLU."""
        return self.mlp in GATED_MLPS

    @property
    def output_bias(self) -> bool:
        """Whether the attention output projection has a bias (attn_output_bias resolved)."""
        return self.has_bias("output_proj")

    def has_bias(self, projection: str) -> bool:
        """Whether the projection (one of ATTN_PROJECTIONS or MLP_MATRICES) has a bias; w3 only
        in a gated MLP."""
        if projection in MLP_MATRICES:
            present = projection != "w3" or self.gated
            return present and (self.mlp_bias is True or (isinstance(self.mlp_bias, tuple)
                                                          and projection in self.mlp_bias))
        if projection not in ATTN_PROJECTIONS:
            raise ValueError(f"no projection {projection!r}; they are "
                             f"{list(ATTN_PROJECTIONS + MLP_MATRICES)}")
        if isinstance(self.attn_bias, tuple):
            return projection in self.attn_bias
        if projection == "output_proj" and self.attn_output_bias is not None:
            return self.attn_output_bias
        return self.attn_bias

    @property
    def head_dim(self) -> int:
        """Dh: a query and key head's width: head_width, or D / H; in latent attention its
        non-rotary and rotary parts together."""
        if self.latent_attention:
            return self.nope_head_width + self.rope_head_width
        return self.d_model // self.n_heads if self.head_width is None else self.head_width

    @property
    def value_dim(self) -> int:
        """Dv: a value head's width: value_head_width in latent attention, else Dh."""
        return self.value_head_width if self.latent_attention else self.head_dim

    @property
    def rope_dim(self) -> int:
        """R: the features of a head RoPE rotates (rotary_dim, or all Dh; in latent attention
        the rotary part, rope_head_width)."""
        if self.latent_attention:
            return self.rope_head_width
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def latent_eps(self) -> float:
        """The latent norms' epsilon: latent_norm_eps, or norm_eps."""
        return self.norm_eps if self.latent_norm_eps is None else self.latent_norm_eps

    @property
    def latent_attention(self) -> bool:
        """Multi-head latent attention (kv_latent_rank set)."""
        return self.kv_latent_rank is not None

    @property
    def routed(self) -> bool:
        """Some layers route tokens to experts (n_experts set)."""
        return self.n_experts is not None

    def routes(self, layer: int) -> bool:
        """Whether this layer's MLP is routed experts (else dense, of width d_ff)."""
        return (self.routed and layer >= self.first_dense_layers
                and (layer + 1) % self.moe_every == 0)

    @property
    def expert_dim(self) -> int:
        """Fe: a routed expert's width (expert_width, or d_ff)."""
        return self.d_ff if self.expert_width is None else self.expert_width

    @property
    def shared_dim(self) -> int:
        """The width of the one MLP the shared experts run as (0 without them)."""
        one = self.expert_dim if self.shared_expert_width is None else self.shared_expert_width
        return self.n_shared_experts * one

    def expert_capacity(self, tokens: int) -> int | None:
        """The most tokens one expert takes from a forward of `tokens` tokens (B x T), or
        None when nothing is dropped (no capacity_factor)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.experts_per_token / self.n_experts)

    def rotates(self, layer: int) -> bool:
        """Whether this layer's attention applies RoPE (pos "rope", not one of nope_layers)."""
        return self.pos == "rope" and (self.nope_layers is None or layer not in self.nope_layers)

    def scales_queries(self, layer: int) -> bool:
        """Whether this layer's queries are multiplied by their position's query_position_scale."""
        scale = self.query_position_scale
        return scale is not None and (scale.get("layers") is None or layer in scale["layers"])

    def window(self, layer: int) -> int | None:
        """W for this layer, or None where it reads every earlier token."""
        if self.sliding_window is None or (self.window_layers is not None
                                           and layer not in self.window_layers):
            return None
        return self.sliding_window

    def rope_parameter(self, name: str):
        """A rope_scaling parameter, or its type's default (ROPE_SCALING)."""
        scaling = self.rope_scaling or {}
        return scaling.get(name, ROPE_SCALING.get(scaling.get("type"), ((), {}))[1].get(name))

    @property
    def kv_group_size(self) -> int:
        """Query heads that share one KV head: query head h reads KV head h // group."""
        return self.n_heads // self.kv_heads

    def changed(self, names) -> list[str]:
        """"name=value" for each of the fields `names` that differs from its default (what a
        writer of fewer fields than ours must refuse, by name)."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        return [f"{name}={_shown(getattr(self, name))}" for name in names
                if getattr(self, name) != fields[name].default]

    # JSON round trip.
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecoderConfig":
        """A config from its fields; ConfigError naming every unknown, missing and invalid field
        at once."""
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        problems = []
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            problems.append(f"unknown config field(s) {unknown}; known fields are "
                            f"{sorted(known)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in data
        )
        if missing:
            problems.append(f"missing required config field(s) {missing}")
        given = {name: value for name, value in data.items() if name in known}
        if not missing:  # the values of the known fields are judged too
            try:
                config = cls(**given)
            except ConfigError as exc:
                problems.append(str(exc))
            else:
                if not problems:
                    return config
        else:  # judged without the missing ones, and every relation that needs them
            unchecked = object.__new__(cls)
            for f in dataclasses.fields(cls):
                value = given.get(f.name, f.default)
                object.__setattr__(unchecked, f.name, tuple(value) if f.name in _LISTED and
                                   isinstance(value, list) else value)
            problems += _validate(unchecked, absent=frozenset(missing))
        raise ConfigError("; ".join(problems))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "DecoderConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from exc
        except RecursionError:
            data = None  # deeper than the parser can go: refused below, by its depth
        depth = _json_depth(text) if data is None else _nesting(data)
        if depth > MAX_JSON_DEPTH:
            raise ConfigError(f"config JSON is nested {depth:,} levels deep; a config is at most "
                              f"{MAX_JSON_DEPTH} deep (its deepest field, rope_scaling, is 2)")
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the config as JSON, atomically: a failed write leaves any old file intact."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DecoderConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist"
                              + (" (it is a folder)" if path.is_dir() else ""))
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte "
                              f"0x{raw[exc.start]:02x} at offset {exc.start}); a config is a "
                              "JSON file") from None
        try:
            return cls.from_json(text)
        except ConfigError as exc:
            raise ConfigError(f"config file {str(path)!r}: {exc}") from None

    def replace(self, **changes: Any) -> "DecoderConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(cfg: DecoderConfig, absent: frozenset[str] = frozenset()) -> list[str]:
    """Every problem with the config, each naming the field and its value: each field's own,
    then every relation between fields whose values are valid (so a divisibility error is
    named beside the per-field ones, not after they are fixed). `absent`: fields a config file
    left out, named elsewhere, whose relations are not judged."""
    found = [(name, problem) for name, problem in _field_problems(cfg) if name not in absent]
    bad = {name for name, _ in found} | absent
    valid = lambda *names: not bad.intersection(names)  # noqa: E731
    problems = [problem for _, problem in found]
    latent = cfg.kv_latent_rank is not None  # the head width is then its two parts'
    sizes = valid("d_model", "n_heads", "head_width")
    if sizes and not latent and cfg.head_width is None and cfg.d_model % cfg.n_heads:
        problems.append(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads} "
                        "(set head_width for heads narrower or wider than D / H)")
    if valid("n_heads", "n_kv_heads") and cfg.n_heads % cfg.kv_heads:
        problems.append(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={cfg.kv_heads}")
    # the head width is known when it is given, or when D / H divides, or from its latent parts
    widths = (valid("nope_head_width", "rope_head_width") and None not in (
        cfg.nope_head_width, cfg.rope_head_width)) if latent else sizes and (
        cfg.head_width is not None or cfg.d_model % cfg.n_heads == 0)
    if widths and not latent and valid("pos") and cfg.pos == "rope" and cfg.head_dim % 2:
        problems.append(f"head width Dh={cfg.head_dim} is odd; RoPE rotates pairs and needs it "
                        "even")
    return (problems + _attention_problems(cfg, valid, widths) + _bias_problems(cfg, valid)
            + _placement_problems(cfg, valid) + _expert_problems(cfg, valid)
            + _latent_problems(cfg, valid))


def _field_problems(cfg: DecoderConfig) -> list[tuple[str, str]]:
    """(field, problem) for every field whose own value is wrong."""
    problems: list[tuple[str, str]] = []
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        value = getattr(cfg, name)
        if not _is_int(value) or value <= 0:
            problems.append((name, f"{name}={_shown(value)} must be a positive integer"))
    for name in ("n_kv_heads", "head_width", "rotary_dim", "sliding_window"):
        value = getattr(cfg, name)
        if value is not None and (not _is_int(value) or value <= 0):
            problems.append((name, f"{name}={_shown(value)} must be a positive integer or None"))
    for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("pos", POSITIONS),
                          ("rope_layout", ROPE_LAYOUTS), ("qk_norm_scope", QK_NORM_SCOPES),
                          ("qk_norm_position", QK_NORM_POSITIONS),
                          ("qk_norm_kind", QK_NORM_KINDS),
                          ("context_policy", CONTEXT_POLICIES)):
        value = getattr(cfg, name)
        if not isinstance(value, str) or value not in allowed:
            problems.append((name, f"{name}={_shown(value)} is not one of {list(allowed)}"))
    if cfg.embedding_scale is not None and not _is_positive(cfg.embedding_scale):
        problems.append(("embedding_scale", f"embedding_scale={_shown(cfg.embedding_scale)} must "
                         "be a finite number > 0 or null"))
    if not _is_real(cfg.norm_offset) or cfg.norm_offset != cfg.norm_offset or \
            abs(cfg.norm_offset) == float("inf"):
        problems.append(("norm_offset", f"norm_offset={_shown(cfg.norm_offset)} must be a "
                         "finite number"))
    for name in ("norm_eps", "rope_theta"):
        value = getattr(cfg, name)
        if not _is_real(value) or not value >= 0 or value == float("inf"):
            problems.append((name, f"{name}={_shown(value)} must be a finite number >= 0"))
    eps = cfg.latent_norm_eps
    if eps is not None and (not _is_real(eps) or not eps >= 0 or eps == float("inf")):
        problems.append(("latent_norm_eps", f"latent_norm_eps={_shown(eps)} must be a finite "
                         "number >= 0 or null"))
    if _is_real(cfg.rope_theta) and cfg.pos == "rope" and not cfg.rope_theta > 0:
        problems.append(("rope_theta", f"rope_theta={cfg.rope_theta!r} must be > 0 with "
                         "pos='rope'"))
    if cfg.attn_output_bias is not None and not isinstance(cfg.attn_output_bias, bool):
        problems.append(("attn_output_bias", f"attn_output_bias={_shown(cfg.attn_output_bias)} "
                         "must be true, false or null"))
    for name in ("attn_scale", "attn_softcap", "logit_softcap", "window_rope_theta"):
        value = getattr(cfg, name)
        if value is not None and not _is_positive(value):
            problems.append((name, f"{name}={_shown(value)} must be a finite number > 0 or null"))
    for name, names in (("attn_bias", ATTN_PROJECTIONS), ("mlp_bias", MLP_MATRICES)):
        value = getattr(cfg, name)
        if not isinstance(value, bool) and not (isinstance(value, tuple) and all(
                isinstance(n, str) and n in names for n in value) and len(set(value)) == len(value)):
            problems.append((name, f"{name}={_shown(value)} must be true, false or a list of "
                             f"distinct projections from {list(names)}"))
    for name in ("tie_embeddings", "qk_norm", "norm_bias", "parallel_residual", "sandwich_norm",
                 "norm_affine", "pre_norm", "readout_bias", "shared_norm", "embedding_norm",
                 "post_norm", "final_norm", "attn_sinks"):
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            problems.append((name, f"{name}={_shown(value)} must be true or false"))
    problems += [("rope_scaling", problem) for problem in _rope_scaling_problems(cfg.rope_scaling)]
    return problems + _scale_field_problems(cfg) + _expert_field_problems(cfg)


def _scale_field_problems(cfg: DecoderConfig) -> list[tuple[str, str]]:
    """(field, problem) for the clamped SwiGLU's numbers and the queries' position scale."""
    problems = [("query_position_scale", problem) for problem in
                _query_scale_problems(cfg.query_position_scale, cfg.n_layers)]
    for name in ("swiglu_alpha", "swiglu_limit"):
        if not _is_positive(getattr(cfg, name)):
            problems.append((name, f"{name}={_shown(getattr(cfg, name))} must be a finite number "
                             "> 0"))
    return problems


# The fields of routed experts (besides n_experts) and the values they hold without experts.
UNROUTED = {"experts_per_token": None, "expert_width": None, "n_shared_experts": 0,
                    "shared_expert_width": None, "shared_expert_gate": False, "router_scoring": "softmax",
                    "router_order": "score_topk", "normalize_topk": True,
                    "router_selection_bias": False, "router_bias": False, "expert_bias": False,
                    "expert_groups": None,
                    "groups_per_token": None, "group_score": "top2_sum", "routed_scaling": 1.0,
                    "shared_expert_scale": 1.0,
                    "first_dense_layers": 0, "moe_every": 1, "capacity_factor": None}
_LATENT_WIDTHS = ("rope_head_width", "nope_head_width", "value_head_width")


def _expert_field_problems(cfg: DecoderConfig) -> list[tuple[str, str]]:
    """(field, problem) for each field of routed experts and latent attention whose own value
    is wrong."""
    problems: list[tuple[str, str]] = []
    for name in ("n_experts", "experts_per_token", "expert_width", "shared_expert_width",
                 "expert_groups", "groups_per_token", "kv_latent_rank", "q_latent_rank",
                 *_LATENT_WIDTHS):
        value = getattr(cfg, name)
        if value is not None and (not _is_int(value) or value <= 0):
            problems.append((name, f"{name}={_shown(value)} must be a positive integer or None"))
    for name, least in (("n_shared_experts", 0), ("first_dense_layers", 0), ("moe_every", 1)):
        value = getattr(cfg, name)
        if not _is_int(value) or value < least:
            problems.append((name, f"{name}={_shown(value)} must be an integer >= {least}"))
    for name, allowed in (("router_scoring", ROUTER_SCORINGS), ("router_order", ROUTER_ORDERS),
                          ("group_score", GROUP_SCORES)):
        value = getattr(cfg, name)
        if not isinstance(value, str) or value not in allowed:
            problems.append((name, f"{name}={_shown(value)} is not one of {list(allowed)}"))
    for name in ("normalize_topk", "router_selection_bias", "shared_expert_gate", "router_bias",
                 "expert_bias"):
        if not isinstance(getattr(cfg, name), bool):
            problems.append((name, f"{name}={_shown(getattr(cfg, name))} must be true or false"))
    for name in ("residual_multiplier", "logit_scale"):
        if not _is_positive(getattr(cfg, name)):
            problems.append((name, f"{name}={_shown(getattr(cfg, name))} must be a finite "
                             "number > 0"))
    for name in ("routed_scaling", "shared_expert_scale"):
        if not _is_positive(getattr(cfg, name)):
            problems.append((name, f"{name}={_shown(getattr(cfg, name))} must be a finite number "
                             "> 0"))
    if cfg.capacity_factor is not None and not _is_positive(cfg.capacity_factor):
        problems.append(("capacity_factor", f"capacity_factor={_shown(cfg.capacity_factor)} "
                         "must be a finite number > 0 or null"))
    return problems


def _expert_problems(cfg: DecoderConfig, valid) -> list[str]:
    """The routing fields against each other and the sizes, each where its fields are valid."""
    if cfg.n_experts is None:
        given = [f"{name}={_shown(getattr(cfg, name))}" for name, unused in
                 UNROUTED.items() if getattr(cfg, name) != unused]
        return [f"{', '.join(given)} {_need(given)} n_experts (routed experts)"] if given else []
    problems = []
    k, experts = cfg.experts_per_token, cfg.n_experts
    if valid("n_experts", "experts_per_token"):
        if k is None:
            problems.append(f"n_experts={experts} needs experts_per_token (k, 1 <= k <= E)")
        elif k > experts:
            problems.append(f"experts_per_token={k} exceeds n_experts={experts}")
    for name, unset in (("shared_expert_width", None), ("shared_expert_gate", False),
                        ("shared_expert_scale", 1.0)):
        if valid("n_shared_experts", name) and getattr(cfg, name) != unset and \
                cfg.n_shared_experts == 0:
            problems.append(f"{name}={_shown(getattr(cfg, name))} needs n_shared_experts >= 1")
    if valid("n_layers", "first_dense_layers", "moe_every") and not any(
            cfg.routes(i) for i in range(cfg.n_layers)):
        problems.append(f"first_dense_layers={cfg.first_dense_layers}, moe_every="
                        f"{cfg.moe_every} leave no routed layer among n_layers={cfg.n_layers}")
    problems += _group_problems(cfg, valid)
    if valid("mlp_bias") and cfg.mlp_bias is not False:
        problems.append(f"mlp_bias={_flag_shown(cfg.mlp_bias)} with n_experts={experts}: routed "
                        "and shared experts have no biases here (mlp_bias=false; expert_bias "
                        "gives the routed experts theirs)")
    if valid("mlp") and cfg.mlp in LEARNED_ACTIVATIONS:
        problems.append(f"mlp={cfg.mlp!r} with n_experts={experts}: its learned parameters are "
                        "one pair per dense layer, not per expert")
    return problems


def _group_problems(cfg: DecoderConfig, valid) -> list[str]:
    """Group-limited routing's fields against each other and the experts."""
    groups, chosen = cfg.expert_groups, cfg.groups_per_token
    if not valid("expert_groups", "groups_per_token", "n_experts", "experts_per_token",
                 "group_score") or (groups is None and chosen is None):
        return []
    if groups is None or chosen is None:
        return [f"expert_groups={_shown(groups)}, groups_per_token={_shown(chosen)}: give both "
                "or neither"]
    problems = []
    if cfg.n_experts % groups:
        problems.append(f"expert_groups={groups} does not divide n_experts={cfg.n_experts}")
    elif chosen > groups:
        problems.append(f"groups_per_token={chosen} exceeds expert_groups={groups}")
    else:
        size = cfg.n_experts // groups
        k = cfg.experts_per_token
        if k is not None and k > chosen * size:
            problems.append(f"experts_per_token={k} exceeds the {chosen} x {size} experts of "
                            f"groups_per_token={chosen} groups")
        if cfg.group_score == "top2_sum" and size < 2:
            problems.append(f"group_score='top2_sum' needs groups of 2 experts or more, got "
                            f"{size} (n_experts={cfg.n_experts} / expert_groups={groups})")
    return problems


def _latent_problems(cfg: DecoderConfig, valid) -> list[str]:
    """Latent attention's fields against each other and the attention they replace."""
    latent = ["q_latent_rank", *_LATENT_WIDTHS, "latent_norm_eps"]
    if cfg.kv_latent_rank is None:
        given = [f"{name}={_shown(getattr(cfg, name))}" for name in latent
                 if getattr(cfg, name) is not None]
        return [f"{', '.join(given)} {_need(given)} kv_latent_rank (latent attention)"
                ] if given else []
    problems = []
    where = f"kv_latent_rank={_shown(cfg.kv_latent_rank)}"
    missing = [name for name in _LATENT_WIDTHS if getattr(cfg, name) is None]
    if missing:
        problems.append(f"{where} needs {', '.join(missing)}")
    if valid("rope_head_width") and cfg.rope_head_width is not None and cfg.rope_head_width % 2:
        problems.append(f"rope_head_width={cfg.rope_head_width} is odd; RoPE rotates pairs")
    clashes = [f"{name}={_shown(getattr(cfg, name))}" for name, plain in
               (("pos", "rope"), ("head_width", None), ("rotary_dim", None),
                ("attn_bias", False), ("attn_output_bias", None), ("qk_norm", False),
                ("attn_sinks", False), ("query_position_scale", None))
               if getattr(cfg, name) != plain]
    if cfg.n_kv_heads not in (None, cfg.n_heads):
        clashes.append(f"n_kv_heads={_shown(cfg.n_kv_heads)}")
    if clashes:
        problems.append(f"{where} (latent attention) takes pos='rope' with the rotary part given "
                        "by rope_head_width, every head its own key and value, no biases, no "
                        f"q/k norm, no sinks and unscaled queries; got {', '.join(clashes)}")
    return problems


def _placement_problems(cfg: DecoderConfig, valid) -> list[str]:
    """Where the norms sit and how positions enter, against the fields they exclude."""
    problems = []
    if cfg.post_norm is True:
        clashes = [f"{name}={getattr(cfg, name)}" for name, plain in
                   (("pre_norm", False), ("sandwich_norm", False), ("parallel_residual", False))
                   if getattr(cfg, name) is not plain]
        if clashes:
            problems.append(f"post_norm=True (x = N(x + F(x))) takes pre_norm=False, "
                            f"sandwich_norm=False and a sequential block; got {', '.join(clashes)}")
    if valid("pos", "d_model") and cfg.pos == "sinusoidal" and cfg.d_model < 4:
        problems.append(f"pos='sinusoidal' needs d_model >= 4 (D // 2 frequencies spaced over "
                        f"D // 2 - 1 steps), got {cfg.d_model}")
    if valid("qk_norm_kind", "qk_norm") and cfg.qk_norm_kind != "rmsnorm" and not cfg.qk_norm:
        problems.append(f"qk_norm_kind={cfg.qk_norm_kind!r} needs qk_norm=True")
    return problems


def _need(given: list[str]) -> str:
    return "needs" if len(given) == 1 else "need"


def _flag_shown(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else _shown(value)


def _bias_problems(cfg: DecoderConfig, valid) -> list[str]:
    """A list of biased projections against the fields it would contradict."""
    problems = []
    if valid("attn_bias", "attn_output_bias") and isinstance(cfg.attn_bias, tuple) and \
            cfg.attn_output_bias is not None:
        problems.append(f"attn_output_bias={cfg.attn_output_bias} with attn_bias="
                        f"{list(cfg.attn_bias)}: name output_proj in the list or leave it out, "
                        "and attn_output_bias null")
    if valid("mlp_bias", "mlp") and isinstance(cfg.mlp_bias, tuple) and "w3" in cfg.mlp_bias \
            and not cfg.gated:
        problems.append(f"mlp_bias={list(cfg.mlp_bias)} names w3, but mlp={cfg.mlp!r} has no w3 "
                        "(only a gated MLP, swiglu or geglu, does)")
    return problems


def _bias_flags(cfg: DecoderConfig) -> dict[str, Any]:
    """attn_bias, attn_output_bias and mlp_bias spelled as the flags where a list of biased
    projections says what the flags say (a valid config), so an architecture has one config."""
    flags: dict[str, Any] = {}
    if isinstance(cfg.attn_bias, tuple):
        named = set(cfg.attn_bias)
        flags["attn_bias"] = tuple(n for n in ATTN_PROJECTIONS if n in named)
        qkv = named & {"q_proj", "k_proj", "v_proj"}
        if len(qkv) in (0, 3):  # q, k and v alike: the flags say it
            flags["attn_bias"] = bool(qkv)
            output = "output_proj" in named
            flags["attn_output_bias"] = None if output == bool(qkv) else output
    if isinstance(cfg.mlp_bias, tuple):
        present = [n for n in MLP_MATRICES if n != "w3" or cfg.gated]
        named = [n for n in present if n in cfg.mlp_bias]
        flags["mlp_bias"] = tuple(named) if 0 < len(named) < len(present) else bool(named)
    return flags


def _is_positive(value: Any) -> bool:
    """A finite real number > 0 (not a bool, not complex: (-8) ** -0.5 is complex)."""
    return _is_real(value) and 0 < value < float("inf")


def _shown(value: Any) -> str:
    """A value as a message shows it: its repr, shortened (a list nested hundreds deep, or a
    million long, is not printed whole)."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60


def _nesting(data: Any) -> int:
    """How deep JSON data nests (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                  else value))
    return deepest


def _json_depth(text: str) -> int:
    """How deep the brackets of JSON text nest outside its strings (for text too deep to
    parse)."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:  # a backslash escapes the next character, a quote ends the string
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _attention_problems(cfg: DecoderConfig, valid, widths: bool) -> list[str]:
    """The window's layers and the rotated width against the sizes, each where the fields it
    reads are valid (`widths`: the head width is known)."""
    problems = []
    layers = cfg.window_layers
    if valid("n_layers", "sliding_window") and layers is not None and (
            not isinstance(layers, tuple) or not all(_is_int(i) and 0 <= i < cfg.n_layers
                                                     for i in layers)
            or len(set(layers)) != len(layers)):
        problems.append(f"window_layers={_shown(layers)} must list distinct layers in [0, "
                        f"n_layers={cfg.n_layers})")
    elif layers is not None and cfg.sliding_window is None:
        problems.append(f"window_layers={_shown(list(layers))} needs a sliding_window")
    nope = cfg.nope_layers
    if valid("n_layers") and nope is not None and (
            not isinstance(nope, tuple) or not all(_is_int(i) and 0 <= i < cfg.n_layers
                                                   for i in nope) or len(set(nope)) != len(nope)):
        problems.append(f"nope_layers={_shown(nope)} must list distinct layers in [0, "
                        f"n_layers={cfg.n_layers})")
    elif nope is not None and valid("pos") and cfg.pos != "rope":
        problems.append(f"nope_layers={_shown(list(nope))} needs pos='rope' (the other layers "
                        "rotate)")
    if cfg.qk_norm_position == "after_rope" and (cfg.qk_norm is not True
                                                 or cfg.qk_norm_scope != "head"):
        problems.append(f"qk_norm_position='after_rope' needs qk_norm=True with qk_norm_scope="
                        f"'head' (each rotated head normalised), got qk_norm="
                        f"{_shown(cfg.qk_norm)}, qk_norm_scope={_shown(cfg.qk_norm_scope)}")
    clamped = [f"{name}={_shown(getattr(cfg, name))}" for name, default in
               (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)) if getattr(cfg, name) != default]
    if clamped and valid("mlp") and cfg.mlp != "swiglu_clamped":
        problems.append(f"{', '.join(clamped)} {_need(clamped)} mlp='swiglu_clamped' (mlp="
                        f"{cfg.mlp!r} reads neither)")
    if cfg.shared_norm is True and cfg.parallel_residual is not True:
        problems.append("shared_norm=True needs parallel_residual=True (one norm feeds both "
                        "sublayers of a parallel block)")
    if cfg.window_rope_theta is not None and (cfg.sliding_window is None or cfg.pos != "rope"):
        problems.append(f"window_rope_theta={_shown(cfg.window_rope_theta)} needs pos='rope' and "
                        "a sliding_window")
    if cfg.norm_affine is False and cfg.norm == "layernorm" and cfg.norm_bias is True:
        problems.append("norm_affine=False with norm_bias=True: a norm without a gain has no "
                        "shift either (set norm_bias=false)")
    rotary = valid("rotary_dim") and cfg.rotary_dim is not None
    if rotary and widths and (cfg.rotary_dim % 2 or cfg.rotary_dim > cfg.head_dim):
        problems.append(f"rotary_dim={cfg.rotary_dim} must be even and at most the head width "
                        f"Dh={cfg.head_dim}")
    offset = cfg.position_offset
    if not _is_int(offset) or offset < 0:
        problems.append(f"position_offset={_shown(offset)} must be an integer >= 0")
    elif offset and valid("pos") and cfg.pos not in ("learned", "sinusoidal"):
        problems.append(f"position_offset={offset} needs pos='learned' or 'sinusoidal' (a table "
                        f"of positions), not {cfg.pos!r}")
    if valid("pos") and cfg.pos != "rope" and (cfg.rotary_dim is not None
                                               or cfg.rope_scaling is not None):
        problems.append(f"rotary_dim={_shown(cfg.rotary_dim)}, rope_scaling="
                        f"{_shown(cfg.rope_scaling)} need pos='rope', not {cfg.pos!r}")
    if valid("rope_scaling", "rotary_dim") and widths and cfg.rope_scaling is not None and \
            cfg.rope_dim < 4 and cfg.rope_scaling["type"] == "dynamic":
        problems.append(f"rope_scaling type 'dynamic' needs a rotated width of at least 4, got "
                        f"{cfg.rope_dim} (its base grows as a power dim / (dim - 2))")
    return problems


def _rope_scaling_problems(scaling: Any) -> list[str]:
    """What is wrong with a rope_scaling dict (ROPE_SCALING), each naming the key and value."""
    if scaling is None:
        return []
    if not isinstance(scaling, dict) or scaling.get("type") not in ROPE_SCALING:
        kind = scaling.get("type") if isinstance(scaling, dict) else scaling
        return [f"rope_scaling={kind!r}: a dict whose 'type' is one of {list(ROPE_SCALING)}, or "
                "null"]
    required, optional = ROPE_SCALING[scaling["type"]]
    where = f"rope_scaling type {scaling['type']!r}"
    problems = [f"{where} needs {name!r}" for name in required if name not in scaling]
    unknown = sorted(set(scaling) - {"type", *required, *optional})
    if unknown:
        problems.append(f"{where} has unknown key(s) {unknown}; it takes "
                        f"{sorted({*required, *optional})}")
    for name, value in scaling.items():
        if name == "type" or name in unknown or (value is None and name in optional):
            continue
        if name == "truncate":
            if not isinstance(value, bool):
                problems.append(f"{where}: truncate={value!r} must be true or false")
        elif not _is_real(value) or not 0 < value < float("inf"):
            problems.append(f"{where}: {name}={value!r} must be a finite number > 0")
    if not problems and scaling["type"] == "llama3" and \
            not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        problems.append(f"{where}: high_freq_factor={scaling['high_freq_factor']} must exceed "
                        f"low_freq_factor={scaling['low_freq_factor']}")
    return problems


def _query_scale_problems(scale: Any, n_layers: Any) -> list[str]:
    """What is wrong with a query_position_scale dict, each naming the key and value."""
    if scale is None:
        return []
    required, optional = QUERY_POSITION_SCALE
    if not isinstance(scale, dict):
        return [f"query_position_scale={_shown(scale)}: a dict with {list(required)} (and "
                f"optionally {list(optional)}), or null"]
    problems = [f"query_position_scale needs {name!r}" for name in required if name not in scale]
    unknown = sorted(map(str, set(scale) - {*required, *optional}))
    if unknown:
        problems.append(f"query_position_scale has unknown key(s) {unknown}; it takes "
                        f"{sorted({*required, *optional})}")
    beta, length, offset = scale.get("beta"), scale.get("length"), scale.get("offset", 0)
    if "beta" in scale and not _is_positive(beta):
        problems.append(f"query_position_scale: beta={_shown(beta)} must be a finite number > 0")
    if "length" in scale and (not _is_int(length) or length <= 0):
        problems.append(f"query_position_scale: length={_shown(length)} must be a positive "
                        "integer")
    if not _is_int(offset) or offset < 0:
        problems.append(f"query_position_scale: offset={_shown(offset)} must be an integer >= 0")
    layers = scale.get("layers")
    if layers is not None and (not isinstance(layers, tuple) or not all(
            _is_int(i) and (not _is_int(n_layers) or 0 <= i < n_layers) for i in layers)
            or len(set(layers)) != len(layers)):
        problems.append(f"query_position_scale: layers={_shown(layers)} must list distinct layers "
                        f"in [0, n_layers={_shown(n_layers)})")
    return problems
