"""The slow oracle: the decoder written as explicit per-head, per-query-row loops.

It reads only weights by name (DESIGN.md's weight names) and a config, and shares no code path
with model/: no fused kernels, no masks (query row t simply reads keys 0..t), LayerNorm and
RMSNorm from their definitions, GELU from erf or tanh, RoPE as explicit 2x2 rotations pair by
pair, the sinusoidal table entry by entry, ALiBi's slopes from Press et al.'s recursive rule. It computes in float64 on the CPU by default, so a disagreement with the fast model is a
bug, not rounding.

Weights come from a state dict or from a function `name -> tensor or None` (None: the model has
no such weight), in any dtype and on any device. They are read stage by stage: the embedding,
each layer, then the final norm and readout. A layer's weights are converted to float64 when its
stage starts and dropped when it ends; the embedding is read only at the rows the ids look up,
and the readout `READOUT_BLOCK` vocabulary rows at a time. So the oracle holds one layer in
float64 at once (GPT-2 XL: 31M weights, 250 MB), never the whole model.

    logits = oracle_logits(state_dict, cfg, ids)            # (B, T, V) float64
    oracle = StreamedOracle(weights, cfg, ids)              # the same logits, as oracle.logits,
    for stage, name, rows, grad in oracle.backward(g):      # and every weight's gradient,
        ...                                                 # readout first, embedding last

`oracle_logits` is built from differentiable torch ops, so passing a state dict whose tensors
require grad gives gradients the ordinary way (the whole graph is then kept). `StreamedOracle`
keeps only each stage's input (B, T, D) and recomputes one stage at a time on the way back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import torch

from ..config import DecoderConfig
from ..errors import CheckpointError, ContextLengthError, InputShapeError, TokenIdError

Weights = Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor | None]

READOUT_BLOCK = 2048
"""Vocabulary rows of the readout matrix converted to float64 at a time (GPT-2 XL: 2048 x 1600
doubles, 26 MB, instead of the whole 643 MB matrix)."""


# ---- the definitions ---------------------------------------------------------------------------

def _layernorm(x: torch.Tensor, gain: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, offset: float = 0.0) -> torch.Tensor:
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]  # biased, as LayerNorm defines
    normed = (x - mean) / torch.sqrt(var + eps)
    # None: a norm that learns nothing; the gain is offset + w (LayerNorm1P: 1 + w)
    normed = normed if gain is None else normed * (gain + offset)
    return normed if bias is None else normed + bias


def _rmsnorm(x: torch.Tensor, gain: torch.Tensor | None, eps: float, offset: float = 0.0
             ) -> torch.Tensor:
    mean_square = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    normed = x / torch.sqrt(mean_square + eps)
    return normed if gain is None else normed * (gain + offset)


def _activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if kind == "relu2":  # ReLU squared
        positive = torch.where(x > 0, x, torch.zeros_like(x))
        return positive * positive
    if kind == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(f"no plain activation {kind!r}")


def _softplus(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a > 30, a, torch.log(1.0 + torch.exp(torch.clamp(a, max=30))))


def _xielu(x: torch.Tensor, alpha_p: torch.Tensor, alpha_n: torch.Tensor) -> torch.Tensor:
    """xIELU (Huang et al. 2024) as Apertus learns it: a_p = softplus(alpha_p), a_n = 1/2 +
    softplus(alpha_n); x > 0: a_p x^2 + x/2; otherwise a_n (e^min(x, -1e-6) - 1 - x) + x/2."""
    a_p, a_n = _softplus(alpha_p), 0.5 + _softplus(alpha_n)
    clipped = torch.where(x < -1e-6, x, torch.full_like(x, -1e-6))
    return torch.where(x > 0, a_p * x * x + 0.5 * x, a_n * (torch.expm1(clipped) - x) + 0.5 * x)


def _pair_frequency(cfg: DecoderConfig, j: int, seq_len: int, windowed: bool = False) -> float:
    """The angle per position of rotated pair j (0 <= j < R/2), R = rotary_dim or Dh, in a
    sequence of seq_len tokens: theta^(-2j/R), stretched as cfg.rope_scaling defines it; in a
    windowed layer of a config with window_rope_theta, that base, never stretched."""
    rotated, theta = cfg.rope_dim, cfg.rope_theta
    if windowed and cfg.window_rope_theta is not None:
        return cfg.window_rope_theta ** (-2.0 * j / rotated)
    scaling = cfg.rope_scaling or {}
    kind, get = scaling.get("type"), cfg.rope_parameter
    if kind == "dynamic" and seq_len > get("original_max_seq_len"):
        grown = get("factor") * seq_len / get("original_max_seq_len") - get("factor") + 1
        return 1.0 / (theta * grown ** (rotated / (rotated - 2))) ** (2.0 * j / rotated)
    freq = 1.0 / theta ** (2.0 * j / rotated)
    if kind == "linear":
        return freq / get("factor")
    if kind == "llama3":  # Llama 3.1's piecewise rule, by wavelength
        wavelength = 2 * math.pi / freq
        original = get("original_max_seq_len")
        if wavelength > original / get("low_freq_factor"):
            return freq / get("factor")
        if wavelength < original / get("high_freq_factor"):
            return freq
        mix = (original / wavelength - get("low_freq_factor")) / (
            get("high_freq_factor") - get("low_freq_factor"))
        return mix * freq + (1 - mix) * freq / get("factor")
    if kind == "yarn":
        return _yarn_frequency(cfg, j, freq)
    return freq


def _yarn_frequency(cfg: DecoderConfig, j: int, freq: float) -> float:
    """YaRN (Peng et al. 2023): pair j keeps its frequency when it turns more than beta_fast
    times in the original context, is divided by factor below beta_slow turns, in between
    a linear blend in j."""
    get, rotated = cfg.rope_parameter, cfg.rope_dim
    bounds = []
    for turns in (get("beta_fast"), get("beta_slow")):
        # j at which theta^(-2j/R) * original = 2 pi * turns
        bounds.append(rotated / 2 * math.log(get("original_max_seq_len") / (2 * math.pi * turns))
                      / math.log(cfg.rope_theta))
    start, end = bounds
    if get("truncate"):
        start, end = math.floor(start), math.ceil(end)
    start, end = max(start, 0), min(end, rotated - 1)
    width = end - start if end != start else 0.001
    divided = min(max((j - start) / width, 0.0), 1.0)  # 0 kept .. 1 divided
    return (1 - divided) * freq + divided * freq / get("factor")


def _rope_attention_factor(cfg: DecoderConfig, windowed: bool = False) -> float:
    """What YaRN multiplies q and k by (1 for every other RoPE, and in a windowed layer with
    its own base)."""
    if (cfg.rope_scaling or {}).get("type") != "yarn" or (
            windowed and cfg.window_rope_theta is not None):
        return 1.0
    given, factor = cfg.rope_parameter("attention_factor"), cfg.rope_parameter("factor")
    if given is not None:
        return given
    return 1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0


def _rope_row(cfg: DecoderConfig, vec: torch.Tensor, position: int, seq_len: int,
              windowed: bool = False) -> torch.Tensor:
    """Rotate one head vector (Dh,) at `position`: pair j of its first R features turns by
    position * freq_j, written out as the 2x2 rotation; features R.. pass through. Pair j is
    (vec[2j], vec[2j+1]) in the "interleaved" layout, (vec[j], vec[j + R/2]) in "rotate_half".
    YaRN also scales the rotated features by its attention factor."""
    rotated = cfg.rope_dim
    angles = torch.tensor([position * _pair_frequency(cfg, j, seq_len, windowed)
                           for j in range(rotated // 2)], dtype=vec.dtype, device=vec.device)
    scale = _rope_attention_factor(cfg, windowed)
    c, s = scale * torch.cos(angles), scale * torch.sin(angles)  # (R/2,)
    if cfg.latent_attention:  # the rotary part is a latent head's last R features
        return torch.cat((vec[:-rotated], _turn(cfg, vec[-rotated:], c, s)))
    return torch.cat((_turn(cfg, vec[:rotated], c, s), vec[rotated:]))


def _turn(cfg: DecoderConfig, part: torch.Tensor, c: torch.Tensor, s: torch.Tensor
          ) -> torch.Tensor:
    """The R features `part` with pair j turned by the angle whose cosine and sine are c[j],
    s[j]: pairs (part[2j], part[2j+1]) interleaved, (part[j], part[j + R/2]) rotate_half."""
    rotated = part.shape[0]
    if cfg.rope_layout == "rotate_half":
        x0, x1 = part[:rotated // 2], part[rotated // 2:]
        turned = torch.cat((c * x0 - s * x1, s * x0 + c * x1))
    else:
        x0, x1 = part[0::2], part[1::2]
        turned = torch.stack((c * x0 - s * x1, s * x0 + c * x1), dim=-1).reshape(rotated)
    return turned


def _rope_rows(cfg: DecoderConfig, rows: torch.Tensor, windowed: bool) -> torch.Tensor:
    """Row t of `rows` (T, Dh) rotated as the token at position t of a T-token sequence."""
    return torch.stack([_rope_row(cfg, rows[t], t, rows.shape[0], windowed)
                        for t in range(rows.shape[0])])


def _sinusoid_row(cfg: DecoderConfig, position: int) -> list[float]:
    """Row position + position_offset of the sinusoidal table, entry by entry: the sines of the
    D // 2 frequencies 10000^(-i / (D // 2 - 1)), then their cosines (then a 0 for odd D)."""
    half, p = cfg.d_model // 2, position + cfg.position_offset
    frequencies = [10000.0 ** (-i / (half - 1)) for i in range(half)]
    row = [math.sin(p * f) for f in frequencies] + [math.cos(p * f) for f in frequencies]
    return row + [0.0] * (cfg.d_model - 2 * half)


def _press_slopes(heads: int) -> list[float]:
    """ALiBi's head slopes as Press et al. define them: for a power of two n, the geometric
    sequence starting at and multiplied by 2^(-8/n); otherwise the slopes of the power of two
    below, followed by every other slope of twice that many heads, as many as are missing."""
    if math.log2(heads).is_integer():
        first = 2.0 ** (-8.0 / heads)
        return [first ** (i + 1) for i in range(heads)]
    below = 2 ** math.floor(math.log2(heads))
    return _press_slopes(below) + _press_slopes(2 * below)[0::2][:heads - below]


def _linear(x: torch.Tensor, w: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    y = x @ w[f"{name}.weight"].T
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def _norm(cfg: DecoderConfig, x: torch.Tensor, w: Mapping[str, torch.Tensor],
          name: str) -> torch.Tensor:
    gain = w[f"{name}.weight"] if cfg.norm_affine else None
    if cfg.norm == "layernorm":  # the shift where the config has one (norm_bias)
        shift = w[f"{name}.bias"] if cfg.norm_bias and cfg.norm_affine else None
        return _layernorm(x, gain, shift, cfg.norm_eps, cfg.norm_offset)
    return _rmsnorm(x, gain, cfg.norm_eps, cfg.norm_offset)


# ---- the stages: embedding, one layer, final norm and readout ----------------------------------

ROUTED_MLPS = ("experts.{e}", "shared")  # a routed layer's MLPs, under ffn.
LEARNED_ACTIVATION_WEIGHTS = ("alpha_p", "alpha_n")  # xIELU's, under ffn.act.
LATENT_LINEARS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "output_proj")


def layer_weight_names(cfg: DecoderConfig, layer: int) -> list[str]:
    """Every name a layer may read; a bias the model lacks is simply absent (the oracle uses a
    bias wherever the weights have one, so an extra bias is computed, not ignored). A routed
    layer's experts and shared experts, latent attention's projections and norms."""
    p = f"layers.{layer}"
    attention = LATENT_LINEARS if cfg.latent_attention else (
        "q_proj", "k_proj", "v_proj", "output_proj")
    linears = [f"{p}.attn.{n}" for n in attention]
    mlps = [f"{p}.ffn"]
    if cfg.routes(layer):
        mlps = [f"{p}.ffn.experts.{e}" for e in range(cfg.n_experts)] + [f"{p}.ffn.shared"]
    linears += [f"{mlp}.{n}" for mlp in mlps for n in ("w1", "w2", "w3")]
    norms = ("ln1", "ln2", "ln1_post", "ln2_post")
    extra = [f"{p}.attn.{n}.weight" for n in ("q_norm", "k_norm", "q_a_norm", "kv_a_norm")]
    extra += [f"{p}.attn.{n}.bias" for n in ("q_norm", "k_norm")]  # a q/k LayerNorm's shift
    if cfg.routes(layer):
        extra += [f"{p}.ffn.router.weight", f"{p}.ffn.router.bias",
                  f"{p}.ffn.router.selection_bias", f"{p}.ffn.shared_gate.weight"]
    else:  # a learned activation's parameters
        extra += [f"{p}.ffn.act.{n}" for n in LEARNED_ACTIVATION_WEIGHTS]
    if cfg.attn_sinks:
        extra.append(f"{p}.attn.sinks")
    return ([f"{p}.{n}.{part}" for n in norms for part in ("weight", "bias")]
            + [f"{name}.{part}" for name in linears for part in ("weight", "bias")] + extra)


FINAL_NORM_NAMES = ("ln_final.weight", "ln_final.bias")
EMBED_NORM_NAMES = ("embedding_norm.weight", "embedding_norm.bias")


def _embed(cfg: DecoderConfig, ids: torch.Tensor, row: Callable[[int], torch.Tensor],
           positions: torch.Tensor | None, table: torch.Tensor,
           norm: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """x (B, T, D): the embedding row of each id (`row(v)`), times the config's embedding scale
    rounded to the table's dtype (as the model rounds it), plus position t's row (learned, or
    the sinusoidal table's), normalised where the config has an embedding norm (`norm`: its
    weights)."""
    seq_len = ids.shape[1]
    x = torch.stack([torch.stack([row(int(i)) for i in seq]) for seq in ids])  # (B, T, D)
    if cfg.embedding_scale is not None:
        x = x * float(torch.tensor(cfg.embedding_scale, dtype=table.dtype))
    if cfg.pos == "learned":
        x = x + positions[:seq_len]
    elif cfg.pos == "sinusoidal":
        x = x + torch.tensor([_sinusoid_row(cfg, t) for t in range(seq_len)], dtype=x.dtype)
    return _norm(cfg, x, norm, "embedding_norm") if cfg.embedding_norm else x


def _position_rows(cfg: DecoderConfig, ids: torch.Tensor) -> slice:
    """The position table's rows of positions 0..T-1: from row position_offset (OPT's table
    keeps two rows before position 0's)."""
    return slice(cfg.position_offset, cfg.position_offset + ids.shape[1])


def _block(cfg: DecoderConfig, w: Mapping[str, torch.Tensor], layer: int,
           x: torch.Tensor) -> torch.Tensor:
    """One pre-norm block on x (B, T, D). The norms, projections and MLP act on each position
    alone, so they take the whole batch at once (each weight is read once per block, and its
    gradient is one product, not one per sequence); attention, the only mixing across
    positions, runs one sequence, one head and one query row at a time."""
    p = f"layers.{layer}"
    # OLMo 2 and post-norm blocks (GPT-1): attention reads the stream itself
    h = _norm(cfg, x, w, f"{p}.ln1") if cfg.pre_norm else x
    if cfg.latent_attention:
        q, k, v = _latent_qkv(cfg, w, p, h)
    else:
        q = _linear(h, w, f"{p}.attn.q_proj")  # (B, T, H*Dh)
        k = _linear(h, w, f"{p}.attn.k_proj")  # (B, T, Hkv*Dh)
        v = _linear(h, w, f"{p}.attn.v_proj")
    if cfg.qk_norm and (cfg.qk_norm_scope == "projection" or
                        cfg.qk_norm_position == "before_rope"):
        # over all of q's (k's) features, or each head's Dh features before RoPE
        q = _qk_norm(cfg, q, w, f"{p}.attn.q_norm")
        k = _qk_norm(cfg, k, w, f"{p}.attn.k_norm")
    mixed = torch.stack([_attention(cfg, q[b], k[b], v[b], layer, w, p)
                         for b in range(x.shape[0])])
    attended = _linear(mixed, w, f"{p}.attn.output_proj")  # mixed: (B, T, H*Dh)
    if cfg.sandwich_norm:  # the sublayer's output normalised before it joins the stream
        attended = _norm(cfg, attended, w, f"{p}.ln1_post")
    after_attention = x + cfg.residual_multiplier * attended
    if cfg.post_norm:  # GPT-1: the sum normalised, which the MLP then reads
        after_attention = _norm(cfg, after_attention, w, f"{p}.ln1")
    if not cfg.shared_norm:  # else the MLP reads ln1's output, as attention did
        # a parallel block's MLP reads the block's input x; otherwise the stream after attention
        h = x if cfg.parallel_residual else after_attention
        h = _norm(cfg, h, w, f"{p}.ln2") if cfg.pre_norm else h
    x = after_attention
    out = _routed(cfg, w, f"{p}.ffn", h) if cfg.routes(layer) else _mlp(cfg, w, f"{p}.ffn", h)
    if cfg.sandwich_norm:
        out = _norm(cfg, out, w, f"{p}.ln2_post")
    x = x + cfg.residual_multiplier * out  # (B, T, D)
    return _norm(cfg, x, w, f"{p}.ln2") if cfg.post_norm else x


def _mlp(cfg: DecoderConfig, w: Mapping[str, torch.Tensor], name: str,
         h: torch.Tensor) -> torch.Tensor:
    """The MLP `name` (w1, w2 and a gated MLP's w3) on h (..., D) -> (..., D)."""
    if cfg.mlp == "swiglu":
        gate = _linear(h, w, f"{name}.w1")
        hidden = gate * torch.sigmoid(gate) * _linear(h, w, f"{name}.w3")
    elif cfg.mlp == "swiglu_clamped":  # GPT-OSS: g <= limit, |u| <= limit, (u + 1) g sigma(a g)
        limit = cfg.swiglu_limit
        gate = _linear(h, w, f"{name}.w1")
        gate = torch.where(gate > limit, torch.full_like(gate, limit), gate)
        up = _linear(h, w, f"{name}.w3")
        up = torch.where(up > limit, torch.full_like(up, limit),
                         torch.where(up < -limit, torch.full_like(up, -limit), up))
        hidden = (up + 1.0) * gate / (1.0 + torch.exp(-cfg.swiglu_alpha * gate))
    elif cfg.mlp == "geglu":
        hidden = _activation("gelu_tanh", _linear(h, w, f"{name}.w1")) * _linear(h, w,
                                                                                 f"{name}.w3")
    elif cfg.mlp == "xielu":  # its parameters learned per layer
        hidden = _xielu(_linear(h, w, f"{name}.w1"), w[f"{name}.act.alpha_p"],
                        w[f"{name}.act.alpha_n"])
    else:
        hidden = _activation(cfg.mlp, _linear(h, w, f"{name}.w1"))
    return _linear(hidden, w, f"{name}.w2")


def _routed(cfg: DecoderConfig, w: Mapping[str, torch.Tensor], name: str,
            h: torch.Tensor) -> torch.Tensor:
    """A routed MLP on h (B, T, D), one token at a time in batch-major order: the router's
    choice, then each chosen expert's output times its weight, summed, plus the shared experts.
    With a capacity, an expert's assignments past it (counted in this order, a token's choices
    from its first) are dropped."""
    batch, seq_len, d_model = h.shape
    tokens = h.reshape(-1, d_model)  # (N, D)
    capacity = cfg.expert_capacity(tokens.shape[0])
    taken = [0] * cfg.n_experts
    rows = []
    for x in tokens:
        logits = w[f"{name}.router.weight"] @ x  # (E,)
        if cfg.router_bias:  # GPT-OSS: a bias on the logits, which choose and weigh
            logits = logits + w[f"{name}.router.bias"]
        chosen, weights = _route_token(cfg, logits, w.get(f"{name}.router.selection_bias"))
        out = torch.zeros_like(x)
        for expert, weight in zip(chosen, weights):
            taken[expert] += 1
            if capacity is None or taken[expert] <= capacity:
                out = out + weight * _mlp(cfg, w, f"{name}.experts.{expert}", x)
        if cfg.n_shared_experts:
            shared = _mlp(cfg, w, f"{name}.shared", x)
            if cfg.shared_expert_gate:  # Qwen2-MoE: times sigmoid(w_g . x)
                shared = shared / (1.0 + torch.exp(-(w[f"{name}.shared_gate.weight"][0] @ x)))
            out = out + cfg.shared_expert_scale * shared
        rows.append(out)
    return torch.stack(rows).reshape(batch, seq_len, d_model)


def _route_token(cfg: DecoderConfig, logits: torch.Tensor, bias: torch.Tensor | None
                 ) -> tuple[list[int], list[torch.Tensor]]:
    """One token's experts, best first, and their weights, from its router logits (E,): the
    scores (a softmax over the experts, or each logit's sigmoid), chosen by score plus the
    selection bias (within the best groups where the experts are grouped); or, "topk_score",
    the k largest logits (plus the bias) scored among themselves. Then divided by their sum
    (normalize_topk), times routed_scaling."""
    def score(values: torch.Tensor) -> torch.Tensor:
        if cfg.router_scoring == "sigmoid":
            return 1.0 / (1.0 + torch.exp(-values))
        exps = torch.exp(values - values.max())
        return exps / exps.sum()

    scores = logits if cfg.router_order == "topk_score" else score(logits)
    ranked = (scores if bias is None else scores + bias).detach()  # (E,)
    allowed = _best_groups(cfg, ranked)  # (E,) bool
    # Equal scores (a router of zeros scores every expert alike) leave the choice to a rule:
    # torch.topk's, the rule the routers it is compared with apply (ours, transformers'), on
    # the order of the scores the oracle computed itself.
    chosen = ranked.masked_fill(~allowed, float("-inf")).topk(
        cfg.experts_per_token).indices.tolist()
    picked = scores[chosen]  # (k,)
    if cfg.router_order == "topk_score":
        picked = score(picked)
    if cfg.normalize_topk:
        picked = picked / picked.sum()
    return chosen, list(picked * cfg.routed_scaling)


def _best_groups(cfg: DecoderConfig, ranked: torch.Tensor) -> torch.Tensor:
    """Which experts (E,) a token may choose from: every one, or those of its groups_per_token
    best groups of E / G consecutive experts, a group worth its two best `ranked` values summed
    ("top2_sum") or its best ("max"); groups of equal worth chosen by torch.topk's rule."""
    allowed = torch.ones(cfg.n_experts, dtype=torch.bool)
    if cfg.expert_groups is None:
        return allowed
    size = cfg.n_experts // cfg.expert_groups
    worth = []
    for g in range(cfg.expert_groups):
        best = sorted((float(v) for v in ranked[g * size:(g + 1) * size]), reverse=True)
        worth.append(best[0] + best[1] if cfg.group_score == "top2_sum" else best[0])
    kept = torch.tensor(worth, dtype=torch.float64).topk(cfg.groups_per_token).indices
    allowed[:] = False
    for g in kept.tolist():
        allowed[g * size:(g + 1) * size] = True
    return allowed


def _latent_qkv(cfg: DecoderConfig, w: Mapping[str, torch.Tensor], p: str, h: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Latent attention's q, k (B, T, H*Dh) and v (B, T, H*Dv) from h (B, T, D): the query
    through its latent (or one projection), the keys' and values' latent normalised and
    expanded head by head, each head's key its own non-rotary part then the rotary key every
    head shares (RoPE turns it, and the query's last R features, in `_attention`)."""
    attn, offset = f"{p}.attn", cfg.norm_offset
    eps = cfg.norm_eps if cfg.latent_norm_eps is None else cfg.latent_norm_eps  # the latents
    if cfg.q_latent_rank is not None:
        q_latent = _rmsnorm(_linear(h, w, f"{attn}.q_a_proj"), w[f"{attn}.q_a_norm.weight"], eps,
                            offset)
        q = _linear(q_latent, w, f"{attn}.q_b_proj")
    else:
        q = _linear(h, w, f"{attn}.q_proj")
    joint = _linear(h, w, f"{attn}.kv_a_proj")  # (B, T, C + R)
    rank = cfg.kv_latent_rank
    latent = _rmsnorm(joint[..., :rank], w[f"{attn}.kv_a_norm.weight"], eps, offset)
    shared_key = joint[..., rank:]  # (B, T, R)
    expanded = _linear(latent, w, f"{attn}.kv_b_proj")  # (B, T, H*(Dn + Dv))
    nope, width = cfg.nope_head_width, cfg.nope_head_width + cfg.value_dim
    keys, values = [], []
    for head in range(cfg.n_heads):
        part = expanded[..., head * width:(head + 1) * width]
        keys.append(torch.cat((part[..., :nope], shared_key), dim=-1))  # (B, T, Dh)
        values.append(part[..., nope:])  # (B, T, Dv)
    return q, torch.cat(keys, dim=-1), torch.cat(values, dim=-1)


def _qk_norm(cfg: DecoderConfig, x: torch.Tensor, w: Mapping[str, torch.Tensor],
             name: str) -> torch.Tensor:
    """The q (or k) norm `name` of x (B, T, heads*Dh): over the whole projection, or over every
    head's slice with one gain (Dh,) for all heads; an RMSNorm, or a LayerNorm with its shift
    where the weights have one."""
    gain, shift = w[f"{name}.weight"], w.get(f"{name}.bias")
    whole = cfg.qk_norm_scope == "projection"
    parts = x if whole else x.unflatten(-1, (-1, cfg.head_dim))  # (B, T, heads, Dh)
    if cfg.qk_norm_kind == "layernorm":
        normed = _layernorm(parts, gain, shift, cfg.norm_eps, cfg.norm_offset)
    else:
        normed = _rmsnorm(parts, gain, cfg.norm_eps, cfg.norm_offset)
    return normed if whole else normed.flatten(-2)


def _attention(cfg: DecoderConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               layer: int, w: Mapping[str, torch.Tensor], p: str) -> torch.Tensor:
    """One sequence's causal attention: q (T, H*Dh), k and v (T, Hkv*Dh) -> (T, H*Dh), head by
    head and query row by query row; query head h reads key/value head h // (H / Hkv). In a
    windowed layer row t reads keys t-W+1..t; scores are q.k times attn_scale (1/sqrt(Dh)
    unless given), less ALiBi's slope times the distance t - s (pos "alibi"), then soft-capped
    to c * tanh(score / c) where attn_softcap gives c; with attention sinks, head h's sink
    logit joins each row's denominator (`_row_weights`). Each head's rows are first rotated,
    normalised and scaled by position where the config says (`_head_rows`)."""
    group, head_dim, value_dim = cfg.kv_group_size, cfg.head_dim, cfg.value_dim
    window = cfg.window(layer)
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(head_dim)
    slopes = _press_slopes(cfg.n_heads) if cfg.pos == "alibi" else [0.0] * cfg.n_heads
    head_outputs = []
    for head in range(cfg.n_heads):
        kv = head // group
        q_h = q[:, head * head_dim:(head + 1) * head_dim]  # (T, Dh)
        k_h = k[:, kv * head_dim:(kv + 1) * head_dim]
        v_h = v[:, kv * value_dim:(kv + 1) * value_dim]  # (T, Dv)
        q_h, k_h = _head_rows(cfg, q_h, k_h, layer, w, p)
        sink = w[f"{p}.attn.sinks"][head] if cfg.attn_sinks else None
        out_rows = []
        for t in range(q.shape[0]):
            # inclusive causal: row t reads keys 0..t only, the last W of them when windowed
            visible = slice(0 if window is None else max(0, t - window + 1), t + 1)
            scores = (k_h[visible] @ q_h[t]) * scale  # (visible,)
            if cfg.pos == "alibi":  # key s's score lowered by the slope times its distance
                scores = scores - slopes[head] * torch.tensor(
                    [float(t - key) for key in range(*visible.indices(t + 1))], dtype=scores.dtype)
            if cfg.attn_softcap is not None:
                scores = cfg.attn_softcap * torch.tanh(scores / cfg.attn_softcap)
            out_rows.append(_row_weights(scores, sink) @ v_h[visible])  # (Dh,)
        head_outputs.append(torch.stack(out_rows))  # (T, Dh)
    return torch.cat(head_outputs, dim=-1)


def _head_rows(cfg: DecoderConfig, q_h: torch.Tensor, k_h: torch.Tensor, layer: int,
               w: Mapping[str, torch.Tensor], p: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's query and key rows (T, Dh) as its scores read them: rotated (RoPE, but in a
    NoPE layer), then normalised where the q/k norms act on the rotated heads (Hunyuan), then
    each query row t times its position's scale (query_position_scale)."""
    if cfg.rotates(layer):
        windowed = cfg.window(layer) is not None
        q_h, k_h = _rope_rows(cfg, q_h, windowed), _rope_rows(cfg, k_h, windowed)
    if cfg.qk_norm and cfg.qk_norm_scope == "head" and cfg.qk_norm_position == "after_rope":
        q_h = _qk_norm(cfg, q_h, w, f"{p}.attn.q_norm")  # (T, Dh): one head
        k_h = _qk_norm(cfg, k_h, w, f"{p}.attn.k_norm")
    if cfg.scales_queries(layer):
        q_h = torch.stack([_query_scale(cfg, t) * q_h[t] for t in range(q_h.shape[0])])
    return q_h, k_h


def _row_weights(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """A row's attention weights over its visible keys: exp(s) / sum exp(s), or with a sink
    logit b, exp(s) / (sum exp(s) + exp(b)) (the sink itself attends to nothing)."""
    top = scores.max() if sink is None else torch.maximum(scores.max(), sink)
    exps = torch.exp(scores - top)
    total = exps.sum() if sink is None else exps.sum() + torch.exp(sink - top)
    return exps / total


def _query_scale(cfg: DecoderConfig, position: int) -> float:
    """query_position_scale at a position: 1 + beta * ln(1 + floor((pos + offset) / length))."""
    scale = cfg.query_position_scale
    steps = (position + scale.get("offset", 0)) // scale["length"]
    return 1.0 + scale["beta"] * math.log(1 + steps)


def _vocab_blocks(vocab_size: int) -> list[slice]:
    return [slice(v, min(v + READOUT_BLOCK, vocab_size))
            for v in range(0, vocab_size, READOUT_BLOCK)]


# ---- reading weights ---------------------------------------------------------------------------

def _getter(weights: Weights) -> Callable[[str], torch.Tensor | None]:
    return weights.get if isinstance(weights, Mapping) else weights


def _readout_name(get: Callable[[str], torch.Tensor | None]) -> str:
    """`lm_head.weight`, or the embedding for a tied state dict that omits the head."""
    return "lm_head.weight" if get("lm_head.weight") is not None else "token_embeddings.weight"


class _Reader:
    """Converts weights to the oracle's dtype on the CPU as a stage reads them. With
    `leaves=True` every converted tensor is a fresh leaf that requires grad, detached from the
    caller's tensor: its .grad is the oracle's gradient for that weight (or those rows)."""

    def __init__(self, get: Callable[[str], torch.Tensor | None], dtype: torch.dtype,
                 leaves: bool) -> None:
        self.get, self.dtype, self.leaves = get, dtype, leaves

    def wide(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.leaves:
            return tensor.detach().to("cpu", self.dtype, copy=True).requires_grad_(True)
        return tensor.to("cpu", self.dtype)

    def load(self, names) -> dict[str, torch.Tensor]:
        found = {name: self.get(name) for name in names}
        return {name: self.wide(t) for name, t in found.items() if t is not None}


# ---- the oracle --------------------------------------------------------------------------------

def check_oracle_inputs(weights, cfg: DecoderConfig, ids: torch.Tensor) -> None:
    """The model's input contract, and weights that can be read, before any lookup: ids an
    integer (B, T) tensor with values (not on the meta device), 1 <= T <= max_seq_len, every id
    in [0, V) (a -1 would otherwise index row V - 1); every weight the config needs present and
    holding values. Typed errors name the value and the limit."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] < 1 or \
            ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        dtype = getattr(ids, "dtype", None)
        raise InputShapeError(f"ids must be an integer tensor (B, T) with B >= 1, got {shape} "
                              f"of dtype {dtype}")
    if ids.device.type == "meta":
        raise InputShapeError(f"ids {tuple(ids.shape)} are on the meta device: they hold no "
                              "values to look up")
    seq_len = ids.shape[1]
    if not 1 <= seq_len <= cfg.max_seq_len:
        raise ContextLengthError(f"sequence length T={seq_len} is outside [1, max_seq_len="
                                 f"{cfg.max_seq_len}]; nothing is cropped")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= cfg.vocab_size:
        bad = low if low < 0 else high
        raise TokenIdError(f"token id {bad} is outside [0, vocab_size={cfg.vocab_size})")
    get = weights.get if isinstance(weights, Mapping) else weights
    missing, on_meta = [], []
    for name in _required_weights(cfg):  # one at a time: a getter may gather or load each
        tensor = get(name)
        if tensor is None:
            missing.append(name)
        elif tensor.device.type == "meta":
            on_meta.append(name)
    missing, on_meta = sorted(missing), sorted(on_meta)
    if missing:
        raise CheckpointError(f"the weights lack {missing}, which the config needs (norm="
                              f"{cfg.norm!r}, pos={cfg.pos!r}, mlp={cfg.mlp!r})")
    if on_meta:
        raise CheckpointError(f"weights {on_meta[:3]}{' ...' if len(on_meta) > 3 else ''} are on "
                              "the meta device: they hold no values")


def _required_weights(cfg: DecoderConfig) -> list[str]:
    """Every weight the config needs (biases are optional: used wherever present)."""
    norm_parts = ("weight", "bias") if cfg.norm == "layernorm" and cfg.norm_bias else ("weight",)
    norm_parts = norm_parts if cfg.norm_affine else ()
    names = ["token_embeddings.weight"]
    if cfg.pos == "learned":
        names.append("position_embeddings.weight")
    matrices = ("w1", "w2", "w3") if cfg.gated else ("w1", "w2")
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}"
        normed = cfg.pre_norm or cfg.post_norm  # ln1, ln2 before the sublayers or after the adds
        norms = (("ln1",) if normed else ()) + (
            ("ln2",) if normed and not cfg.shared_norm else ()) + (
            ("ln1_post", "ln2_post") if cfg.sandwich_norm else ())
        names += [f"{p}.{norm}.{part}" for norm in norms for part in norm_parts]
        names += [f"{p}.attn.{n}.weight" for n in _attention_weights(cfg)]
        if cfg.qk_norm:  # a q/k LayerNorm's shift too, where the config's norms have one
            shifted = cfg.qk_norm_kind == "layernorm" and cfg.norm_bias
            names += [f"{p}.attn.{n}.{part}" for n in ("q_norm", "k_norm")
                      for part in (("weight", "bias") if shifted else ("weight",))]
        if cfg.attn_sinks:
            names.append(f"{p}.attn.sinks")
        mlps = [f"{p}.ffn"]
        if cfg.routes(layer):
            mlps = [f"{p}.ffn.experts.{e}" for e in range(cfg.n_experts)] + (
                [f"{p}.ffn.shared"] if cfg.n_shared_experts else [])
            names.append(f"{p}.ffn.router.weight")
            if cfg.router_bias:
                names.append(f"{p}.ffn.router.bias")
            if cfg.router_selection_bias:
                names.append(f"{p}.ffn.router.selection_bias")
            if cfg.shared_expert_gate:
                names.append(f"{p}.ffn.shared_gate.weight")
        names += [f"{mlp}.{n}.weight" for mlp in mlps for n in matrices]
        if cfg.mlp == "xielu" and not cfg.routes(layer):
            names += [f"{p}.ffn.act.{n}" for n in LEARNED_ACTIVATION_WEIGHTS]
    if cfg.embedding_norm:
        names += [f"embedding_norm.{part}" for part in norm_parts]
    return names + [f"ln_final.{part}" for part in norm_parts if cfg.final_norm]


def _attention_weights(cfg: DecoderConfig) -> tuple[str, ...]:
    """The attention module's weights (and latent attention's norms' gains) the config needs."""
    if not cfg.latent_attention:
        return ("q_proj", "k_proj", "v_proj", "output_proj")
    query = ("q_proj",) if cfg.q_latent_rank is None else ("q_a_proj", "q_a_norm", "q_b_proj")
    return query + ("kv_a_proj", "kv_a_norm", "kv_b_proj", "output_proj")


def oracle_logits(state_dict: Weights, cfg: DecoderConfig, ids: torch.Tensor,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Logits (B, T, V) of the decoder described by `cfg` with weights `state_dict` (a mapping,
    or a function name -> tensor or None), for ids (B, T). Stage by stage: one layer's weights
    in `dtype` at a time.

    The readout uses `lm_head.weight` when present and `token_embeddings.weight` otherwise (a
    tied state dict may omit the head)."""
    check_oracle_inputs(state_dict, cfg, ids)
    get = _getter(state_dict)
    read = _Reader(get, dtype, leaves=False)
    table = get("token_embeddings.weight")
    positions = get("position_embeddings.weight") if cfg.pos == "learned" else None
    x = _embed(cfg, ids.cpu(), lambda v: read.wide(table[v]),
               None if positions is None else read.wide(positions[_position_rows(cfg, ids)]),
               table, read.load(EMBED_NORM_NAMES))
    for layer in range(cfg.n_layers):
        x = _block(cfg, read.load(layer_weight_names(cfg, layer)), layer, x)
    x = _final_norm(cfg, x, read.load(FINAL_NORM_NAMES))
    return _read_out(cfg, x, read, get)


def _final_norm(cfg: DecoderConfig, x: torch.Tensor, w: Mapping[str, torch.Tensor]
                ) -> torch.Tensor:
    """The final norm of x (B, T, D), or x itself where the config has none (GPT-1)."""
    return _norm(cfg, x, w, "ln_final") if cfg.final_norm else x


def _read_out(cfg: DecoderConfig, x: torch.Tensor, read: "_Reader",
              get: Callable[[str], torch.Tensor | None]) -> torch.Tensor:
    """The logits (B, T, V) of the final stage's output x (B, T, D): the readout matrix a block
    of vocabulary rows at a time, its bias where the weights have one, then the soft cap."""
    readout, bias = get(_readout_name(get)), get("lm_head.bias")
    logits = torch.cat([x @ read.wide(readout[block]).T for block in _vocab_blocks(cfg.vocab_size)],
                       dim=-1)
    return _capped(cfg, logits if bias is None else logits + read.wide(bias))


def _capped(cfg: DecoderConfig, logits: torch.Tensor) -> torch.Tensor:
    """The logits (B, T, V) times logit_scale, then soft-capped to c * tanh(logits / c) where
    logit_softcap gives c."""
    cap, logits = cfg.logit_softcap, logits * cfg.logit_scale
    return logits if cap is None else cap * torch.tanh(logits / cap)


def _backward(output: torch.Tensor, grad: torch.Tensor) -> None:
    """output.backward(grad), as the backward of the scalar sum(output * grad): the same
    gradients bitwise (d/d output is 1.0 * grad), but torch checks an explicit grad's shape
    with torch.fx's symbolic shapes, whose first use imports sympy (3 s, and 300 000 objects
    every later gc.collect walks)."""
    (output * grad).sum().backward()


class StreamedOracle:
    """The oracle's logits and, on request, its gradients, holding one stage at a time.

    The forward pass keeps only what enters each layer and the final stage (B, T, D each).
    `backward(grad_logits)` then walks from the readout to the embedding; each stage is
    recomputed from its saved input with its weights as fresh float64 leaves, differentiated,
    and dropped before the next stage is read."""

    def __init__(self, weights: Weights, cfg: DecoderConfig, ids: torch.Tensor,
                 dtype: torch.dtype = torch.float64,
                 progress: Callable[[str], None] | None = None) -> None:
        check_oracle_inputs(weights, cfg, ids)
        self.get, self.cfg, self.ids, self.dtype = _getter(weights), cfg, ids.cpu(), dtype
        self.progress = progress or (lambda what: None)
        self.inputs: list[torch.Tensor] = []  # entering layer 0..L-1, then the final stage
        read = _Reader(self.get, dtype, leaves=False)
        table = self.get("token_embeddings.weight")
        with torch.no_grad():
            x = _embed(cfg, self.ids, lambda v: read.wide(table[v]), self._positions(read), table,
                       read.load(EMBED_NORM_NAMES))
            for layer in range(cfg.n_layers):
                self.progress(f"oracle forward: layer {layer + 1}/{cfg.n_layers}")
                self.inputs.append(x)
                x = _block(cfg, read.load(layer_weight_names(cfg, layer)), layer, x)
            self.inputs.append(x)
            x = _final_norm(cfg, x, read.load(FINAL_NORM_NAMES))
            self.logits = _read_out(cfg, x, read, self.get)

    def _positions(self, read: _Reader) -> torch.Tensor | None:
        if self.cfg.pos != "learned":
            return None
        return read.wide(self.get("position_embeddings.weight")[_position_rows(self.cfg,
                                                                               self.ids)])

    def backward_stages(self) -> list[tuple[str, dict[str, torch.Tensor | None]]]:
        """(stage, {weight name: the rows it reads, None for all}) in the order `backward`
        yields them: the embedding reads only the rows its ids look up (and positions 0..T-1)."""
        cfg = self.cfg
        present = lambda names: {n: None for n in names if self.get(n) is not None}  # noqa: E731
        stages = [("final", {_readout_name(self.get): None,
                             **present(("lm_head.bias",) + FINAL_NORM_NAMES)})]
        stages += [(f"layers.{i}", present(layer_weight_names(cfg, i)))
                   for i in reversed(range(cfg.n_layers))]
        embed = {"token_embeddings.weight": torch.unique(self.ids)}
        if cfg.pos == "learned":
            rows = _position_rows(cfg, self.ids)
            embed["position_embeddings.weight"] = torch.arange(rows.start, rows.stop)
        return stages + [("embed", {**embed, **present(EMBED_NORM_NAMES)})]

    def backward(self, grad_logits: torch.Tensor) -> Iterator[tuple[str, str, torch.Tensor | None,
                                                                    torch.Tensor]]:
        """Gradients of sum(logits * grad_logits) with respect to every weight read, as pieces
        (stage, name, rows, gradient): `rows` None means the whole weight, else the gradient is
        for those rows of it (readout blocks; the embedding rows the ids look up, every other
        row's gradient being zero). Stages in `backward_stages` order, readout first, embedding
        last; a weight read by two stages (a tied embedding) comes in pieces from both, to be
        summed. Grad mode is enabled only inside each step, never across a yield."""
        cfg, grad_logits = self.cfg, grad_logits.to("cpu", self.dtype)
        if cfg.logit_softcap is not None:  # d/dz c tanh(z / c) = 1 - tanh^2 = 1 - (logit / c)^2
            grad_logits = grad_logits * (1 - (self.logits / cfg.logit_softcap) ** 2)
        grad_logits = grad_logits * cfg.logit_scale  # the readout's z scaled before the cap
        read = _Reader(self.get, self.dtype, leaves=True)
        upstream = yield from self._final_backward(read, grad_logits)
        for layer in reversed(range(cfg.n_layers)):
            self.progress(f"oracle backward: layer {layer + 1}/{cfg.n_layers}")
            x = self.inputs[layer].detach().requires_grad_(True)
            w = read.load(layer_weight_names(cfg, layer))
            with torch.enable_grad():
                _backward(_block(cfg, w, layer, x), upstream)
            upstream = x.grad
            # a weight no path reached (an expert no token chose, a selection-only bias): 0
            grads = {name: torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
                     for name, leaf in w.items()}
            del w, x  # the float64 weights go before the caller reads the gradients
            for name, grad in grads.items():
                yield f"layers.{layer}", name, None, grad
            del grads
        yield from self._embed_backward(read, upstream)

    def _final_backward(self, read: _Reader, grad_logits: torch.Tensor):
        """Readout pieces block by block, then the final norm's; returns d/dx of its input."""
        name = _readout_name(self.get)
        readout = self.get(name)
        x = self.inputs[-1].detach().requires_grad_(True)
        norm = read.load(FINAL_NORM_NAMES)
        with torch.enable_grad():
            normed = _final_norm(self.cfg, x, norm)
        cut = normed.detach().requires_grad_(True)  # the readout's input, (B, T, D)
        for block in _vocab_blocks(self.cfg.vocab_size):
            w = read.wide(readout[block])  # (rows, D) leaf
            with torch.enable_grad():
                _backward(cut @ w.T, grad_logits[..., block])
            yield "final", name, torch.arange(block.start, block.stop), w.grad
            del w
        if self.get("lm_head.bias") is not None:  # d/db of sum(logits * g) = g summed over B, T
            yield "final", "lm_head.bias", None, grad_logits.sum((0, 1))
        with torch.enable_grad():
            _backward(normed, cut.grad)
        for n, leaf in norm.items():
            yield "final", n, None, leaf.grad
        return x.grad

    def _embed_backward(self, read: _Reader, upstream: torch.Tensor):
        table = self.get("token_embeddings.weight")
        looked_up = torch.unique(self.ids)  # sorted
        rows = {int(v): read.wide(table[int(v)]) for v in looked_up}  # (D,) leaves
        positions = self._positions(read)
        norm = read.load(EMBED_NORM_NAMES)
        with torch.enable_grad():
            _backward(_embed(self.cfg, self.ids, rows.__getitem__, positions, table, norm),
                      upstream)
        yield "embed", "token_embeddings.weight", looked_up, torch.stack([rows[int(v)].grad
                                                                           for v in looked_up])
        if positions is not None:
            rows = _position_rows(self.cfg, self.ids)
            yield ("embed", "position_embeddings.weight", torch.arange(rows.start, rows.stop),
                   positions.grad)
        for name, leaf in norm.items():  # the embedding norm's gain and shift
            yield "embed", name, None, leaf.grad
