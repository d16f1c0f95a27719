"""Decoders written the way people outside this project write them, each with one numerics
defect plantable at a time (`defect=`), for the declared-architecture checks (spec.py):

    NanoGPT      nanoGPT's names and structure: transformer.wte/wpe/h/ln_f, q/k/v fused in one
                 nn.Linear `c_attn`, exact GELU, LayerNorm with bias, the head tied by assigning
                 the embedding's Parameter;
    ScratchGPT   LLMs-from-scratch's GPTModel: tok_emb/pos_emb/trf_blocks/final_norm/out_head,
                 separate W_query/W_key/W_value with biases, its own LayerNorm (scale, shift) and
                 tanh GELU, an untied head;
    TuneLlama    a Llama written with torchtune's names (tok_embeddings, layers.{i}.attn.q_proj,
                 sa_norm.scale, mlp.w1/w2/w3, norm.scale, output): RMSNorm, SwiGLU, interleaved
                 RoPE, grouped-query attention 4/2, untied;
    LitGPT       litgpt 0.5's GPT with a Llama config: transformer.wte/h/ln_f, q, k and v stacked
                 in one `attn.qkv` (query heads, then key heads, then value heads), RoPE rotating
                 halves, key/value heads expanded over their group, mlp.fc_1/fc_2/proj;
    RootLlama    a hand-written Llama with Hugging Face's names at its root (embed_tokens,
                 layers.{i}.self_attn.q_proj, input_layernorm, mlp.gate_proj, norm, lm_head:
                 no `model.` wrapper), RoPE rotating halves, grouped-query attention 4/2.

Each is a re-implementation: nanoGPT and LLMs-from-scratch are not packages on the registry;
torchtune 0.6.1 imports torchao.dtypes.nf4tensor, which torchao 0.18 no longer has, while peft
refuses a torchao older than 0.16 (.ci/torchtune runs the real one in an environment of its own);
litgpt 0.5.9 pins numpy<2, and 0.5.10-0.5.13 a huggingface-hub older than transformers 5 needs
(.ci/litgpt runs the real one in an environment of its own). The names, shapes and arithmetic follow the originals (litgpt's
read from its 0.5.13 wheel), written here in our own words. `SPECS` holds the architecture
each declares. The defects (DEFECTS, by style) keep the model causal and its logits (B, T, V).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import decoder_audit as da

V, T = 37, 16

SPECS = {
    "nanogpt": da.DecoderConfig(vocab_size=V, d_model=24, n_layers=2, n_heads=3, d_ff=96,
                                max_seq_len=T, norm="layernorm", mlp="gelu", pos="learned",
                                attn_bias=True, mlp_bias=True, tie_embeddings=True),
    "scratch": da.DecoderConfig(vocab_size=V, d_model=24, n_layers=2, n_heads=4, d_ff=96,
                                max_seq_len=T, norm="layernorm", mlp="gelu_tanh", pos="learned",
                                attn_bias=True, mlp_bias=True, tie_embeddings=False),
    "litgpt": da.DecoderConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                               d_ff=48, max_seq_len=T, norm="rmsnorm", norm_eps=1e-5,
                               mlp="swiglu", pos="rope", rope_layout="rotate_half",
                               tie_embeddings=False),
    "tune": da.DecoderConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                             d_ff=40, max_seq_len=T, norm="rmsnorm", norm_eps=1e-6,
                             mlp="swiglu", pos="rope", rope_theta=10000.0,
                             tie_embeddings=False),
}

# The defects each style can carry, with the check that must catch it.
COMMON = {
    "scale": "oracle",          # scores divided by Dh instead of sqrt(Dh)
    "activation": "oracle",     # exact GELU <-> tanh GELU (SwiGLU: SiLU -> GELU)
    "eps": "oracle",            # norm eps 1e-2 instead of the spec's
    "no_final_norm": "oracle",  # the final norm is created but never applied
    "post_norm": "oracle",      # norm after the residual add instead of before the sublayer
    "extra_linear": "params",   # an nn.Linear nothing calls
    "untied_copy": "tying",     # the head a copy of the embedding where the spec ties
}
DEFECTS = {
    "litgpt": {**{k: v for k, v in COMMON.items() if k != "untied_copy"},
               "rope_layout": "oracle", "gqa_order": "oracle"},
    "nanogpt": {**COMMON, "no_mlp_bias": "params", "skipped_block": "oracle"},
    "scratch": {**{k: v for k, v in COMMON.items() if k != "untied_copy"},
                "no_mlp_bias": "params", "tied_head": "tying"},
    "tune": {**{k: v for k, v in COMMON.items() if k != "untied_copy"},
             "theta": "oracle", "rope_layout": "oracle", "gqa_order": "oracle",
             "detached_weight": "oracle"},  # the forward's values right, its gradient not
}


def _causal_attention(q, k, v, scale: float) -> torch.Tensor:
    """q (B, H, T, Dh), k and v (B, H, T, Dh): explicit scores, mask, softmax."""
    seq_len = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale
    future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def _check_length(ids: torch.Tensor, limit: int) -> None:
    if ids.shape[1] > limit:
        raise ValueError(f"sequence of length {ids.shape[1]} is longer than block size {limit}")


def _residual(x, norm, sublayer, post_norm: bool):
    """x + f(norm(x)) (pre-norm), or norm(x + f(x)) under the post_norm defect."""
    return norm(x + sublayer(x)) if post_norm else x + sublayer(norm(x))


# ---- nanoGPT ------------------------------------------------------------------------------------

class _NanoBlock(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, defect: str | None, bias: bool) -> None:
        super().__init__()
        d = cfg.d_model
        eps = 1e-2 if defect == "eps" else cfg.norm_eps
        self.ln_1 = nn.LayerNorm(d, eps=eps, bias=bias)
        self.ln_2 = nn.LayerNorm(d, eps=eps, bias=bias)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(d, 3 * d, bias), nn.Linear(d, d, bias)
        self.mlp = nn.Module()
        mlp_bias = bias and defect != "no_mlp_bias"
        self.mlp.c_fc = nn.Linear(d, cfg.d_ff, mlp_bias)
        self.mlp.c_proj = nn.Linear(cfg.d_ff, d, mlp_bias)
        self.heads, self.defect = cfg.n_heads, defect

    def _attention(self, x):
        b, t, d = x.shape
        q, k, v = self.attn.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        dh = d // self.heads
        y = _causal_attention(q, k, v, 1 / dh if self.defect == "scale" else 1 / math.sqrt(dh))
        return self.attn.c_proj(y.transpose(1, 2).reshape(b, t, d))

    def _mlp(self, x):
        gelu = "tanh" if self.defect == "activation" else "none"
        return self.mlp.c_proj(F.gelu(self.mlp.c_fc(x), approximate=gelu))

    def forward(self, x):
        post = self.defect == "post_norm"
        x = _residual(x, self.ln_1, self._attention, post)
        return _residual(x, self.ln_2, self._mlp, post)


class NanoGPT(nn.Module):
    """bias=False is nanoGPT's own option: no bias in any Linear or LayerNorm."""

    def __init__(self, defect: str | None = None, seed: int = 0, bias: bool = True) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["nanogpt"]
        self.block_size, self.defect = cfg.max_seq_len, defect
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, cfg.d_model), wpe=nn.Embedding(cfg.max_seq_len, cfg.d_model),
            h=nn.ModuleList(_NanoBlock(cfg, defect, bias) for _ in range(cfg.n_layers)),
            ln_f=nn.LayerNorm(cfg.d_model, eps=1e-2 if defect == "eps" else cfg.norm_eps,
                              bias=bias)))
        self.lm_head = nn.Linear(cfg.d_model, V, bias=False)
        if defect == "untied_copy":
            self.lm_head.weight = nn.Parameter(self.transformer.wte.weight.detach().clone())
        else:
            self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's weight tying
        if defect == "extra_linear":
            self.unused = nn.Linear(cfg.d_model, cfg.d_model)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        _check_length(ids, self.block_size)
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.transformer.wte(ids) + self.transformer.wpe(pos)
        # skipped_block: an off-by-one loop that never runs the last block
        blocks = self.transformer.h[:-1] if self.defect == "skipped_block" else self.transformer.h
        for block in blocks:
            x = block(x)
        if self.defect != "no_final_norm":
            x = self.transformer.ln_f(x)
        return self.lm_head(x)


# ---- LLMs-from-scratch GPTModel ---------------------------------------------------------------

class ScratchLayerNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.scale, self.shift = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class _ScratchBlock(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, defect: str | None) -> None:
        super().__init__()
        d, eps = cfg.d_model, 1e-2 if defect == "eps" else cfg.norm_eps
        self.att = nn.Module()
        for name in ("W_query", "W_key", "W_value"):
            setattr(self.att, name, nn.Linear(d, d, bias=True))
        self.att.out_proj = nn.Linear(d, d)
        bias = defect != "no_mlp_bias"
        self.ff = nn.Module()
        act = nn.GELU(approximate="none" if defect == "activation" else "tanh")
        self.ff.layers = nn.Sequential(nn.Linear(d, cfg.d_ff, bias), act,
                                       nn.Linear(cfg.d_ff, d, bias))
        self.norm1, self.norm2 = ScratchLayerNorm(d, eps), ScratchLayerNorm(d, eps)
        self.heads, self.defect = cfg.n_heads, defect

    def _attention(self, x):
        b, t, d = x.shape
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.att.W_query(x)), split(self.att.W_key(x)), split(self.att.W_value(x))
        dh = d // self.heads
        y = _causal_attention(q, k, v, 1 / dh if self.defect == "scale" else dh ** -0.5)
        return self.att.out_proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        post = self.defect == "post_norm"
        x = _residual(x, self.norm1, self._attention, post)
        return _residual(x, self.norm2, self.ff.layers, post)


class ScratchGPT(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["scratch"]
        self.context_length, self.defect = cfg.max_seq_len, defect
        self.tok_emb = nn.Embedding(V, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.trf_blocks = nn.Sequential(*(_ScratchBlock(cfg, defect)
                                          for _ in range(cfg.n_layers)))
        self.final_norm = ScratchLayerNorm(cfg.d_model, 1e-2 if defect == "eps" else cfg.norm_eps)
        self.out_head = nn.Linear(cfg.d_model, V, bias=False)
        if defect == "tied_head":  # the spec says untied
            self.out_head.weight = self.tok_emb.weight
        if defect == "extra_linear":
            self.unused = nn.Linear(cfg.d_model, 4)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, in_idx):
        _check_length(in_idx, self.context_length)
        pos = torch.arange(in_idx.shape[1], device=in_idx.device)
        x = self.trf_blocks(self.tok_emb(in_idx) + self.pos_emb(pos))
        if self.defect != "no_final_norm":
            x = self.final_norm(x)
        return self.out_head(x)


# ---- a Llama with torchtune's names -------------------------------------------------------------

class StyleRMSNorm(nn.Module):
    """RMSNorm with its gain named as the style names it (torchtune: scale; litgpt: weight)."""

    def __init__(self, d: int, eps: float, gain: str = "weight") -> None:
        super().__init__()
        self.eps, self.gain = eps, gain
        self.register_parameter(gain, nn.Parameter(torch.ones(d)))

    def forward(self, x):
        gain = getattr(self, self.gain)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * gain


def _rope(x: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
    """x (B, H, T, Dh) rotated: pairs (x[2j], x[2j+1]) (torchtune's layout) or halves."""
    t, dh = x.shape[-2], x.shape[-1]
    freqs = theta ** (-torch.arange(0, dh, 2, dtype=torch.float32) / dh)
    angle = torch.arange(t, dtype=torch.float32)[:, None] * freqs  # (T, Dh/2)
    cos, sin = angle.cos(), angle.sin()
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    x0, x1 = x[..., :dh // 2], x[..., dh // 2:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


class _TuneLayer(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, defect: str | None) -> None:
        super().__init__()
        d, dh = cfg.d_model, cfg.head_dim
        eps = 1e-2 if defect == "eps" else cfg.norm_eps
        self.attn = nn.Module()
        self.attn.q_proj = nn.Linear(d, cfg.n_heads * dh, bias=False)
        self.attn.k_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.attn.v_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.attn.output_proj = nn.Linear(cfg.n_heads * dh, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.w1 = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.w2 = nn.Linear(cfg.d_ff, d, bias=False)
        self.mlp.w3 = nn.Linear(d, cfg.d_ff, bias=False)
        self.sa_norm, self.mlp_norm = StyleRMSNorm(d, eps, "scale"), StyleRMSNorm(d, eps, "scale")
        if cfg.qk_norm:  # torchtune's Qwen3: a per-head RMSNorm of q and k before RoPE
            self.attn.q_norm = StyleRMSNorm(dh, eps, "scale")
            self.attn.k_norm = StyleRMSNorm(dh, eps, "scale")
        self.cfg, self.defect = cfg, defect

    def _attention(self, x):
        b, t, _ = x.shape
        cfg, defect = self.cfg, self.defect
        split = lambda z, h: z.view(b, t, h, cfg.head_dim).transpose(1, 2)  # noqa: E731
        q = split(self.attn.q_proj(x), cfg.n_heads)
        k, v = split(self.attn.k_proj(x), cfg.kv_heads), split(self.attn.v_proj(x), cfg.kv_heads)
        if cfg.qk_norm:
            q, k = self.attn.q_norm(q), self.attn.k_norm(k)
        theta = 1000.0 if defect == "theta" else cfg.rope_theta
        q, k = (_rope(z, theta, interleaved=defect != "rope_layout") for z in (q, k))
        group = cfg.n_heads // cfg.kv_heads
        if defect == "gqa_order":  # [k0, k1, k0, k1]: query head h reads KV head h % Hkv
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        else:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        dh = cfg.head_dim
        y = _causal_attention(q, k, v, 1 / dh if defect == "scale" else 1 / math.sqrt(dh))
        return self.attn.output_proj(y.transpose(1, 2).reshape(b, t, -1))

    def _mlp(self, x):
        act = F.gelu if self.defect == "activation" else F.silu
        hidden = act(self.mlp.w1(x)) * self.mlp.w3(x)
        if self.defect == "detached_weight":  # the down projection's weight gets no gradient
            return F.linear(hidden, self.mlp.w2.weight.detach())
        return self.mlp.w2(hidden)

    def forward(self, x):
        post = self.defect == "post_norm"
        x = _residual(x, self.sa_norm, self._attention, post)
        return _residual(x, self.mlp_norm, self._mlp, post)


class TuneLlama(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0, qk_norm: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["tune"].replace(qk_norm=qk_norm)
        self.defect = defect
        self.tok_embeddings = nn.Embedding(V, cfg.d_model)
        self.layers = nn.ModuleList(_TuneLayer(cfg, defect) for _ in range(cfg.n_layers))
        self.norm = StyleRMSNorm(cfg.d_model, 1e-2 if defect == "eps" else cfg.norm_eps, "scale")
        self.output = nn.Linear(cfg.d_model, V, bias=False)
        if defect == "extra_linear":
            self.unused = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        if self.defect != "no_final_norm":
            x = self.norm(x)
        return self.output(x)


# ---- litgpt's GPT with its Llama config ----------------------------------------------------------

class _LitBlock(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, defect: str | None) -> None:
        super().__init__()
        d, dh, eps = cfg.d_model, cfg.head_dim, 1e-2 if defect == "eps" else cfg.norm_eps
        self.norm_1, self.norm_2 = StyleRMSNorm(d, eps), StyleRMSNorm(d, eps)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, (cfg.n_heads + 2 * cfg.kv_heads) * dh, bias=False)
        self.attn.proj = nn.Linear(cfg.n_heads * dh, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.fc_1 = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.fc_2 = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.proj = nn.Linear(cfg.d_ff, d, bias=False)
        self.cfg, self.defect = cfg, defect

    def _attention(self, x):
        b, t, _ = x.shape
        cfg, dh = self.cfg, self.cfg.head_dim
        q, k, v = self.attn.qkv(x).split((cfg.n_heads * dh, cfg.kv_heads * dh,
                                          cfg.kv_heads * dh), dim=-1)
        q = q.view(b, t, cfg.n_heads, dh).transpose(1, 2)
        k, v = (z.view(b, t, cfg.kv_heads, dh).transpose(1, 2) for z in (k, v))
        q, k = (_rope(z, cfg.rope_theta, interleaved=self.defect == "rope_layout") for z in (q, k))
        group = cfg.n_heads // cfg.kv_heads
        if self.defect == "gqa_order":  # tiled: query head h reads key/value head h % Hkv
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        else:  # litgpt expands each key/value head over its group of query heads
            k, v = (z[:, :, None].expand(b, cfg.kv_heads, group, t, dh).reshape(b, -1, t, dh)
                    for z in (k, v))
        y = _causal_attention(q, k, v, 1 / dh if self.defect == "scale" else dh ** -0.5)
        return self.attn.proj(y.transpose(1, 2).reshape(b, t, -1))

    def _mlp(self, x):
        act = F.gelu if self.defect == "activation" else F.silu
        return self.mlp.proj(act(self.mlp.fc_1(x)) * self.mlp.fc_2(x))

    def forward(self, x):
        post = self.defect == "post_norm"
        x = _residual(x, self.norm_1, self._attention, post)
        return _residual(x, self.norm_2, self._mlp, post)


class LitGPT(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["litgpt"]
        self.defect = defect
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, cfg.d_model),
            h=nn.ModuleList(_LitBlock(cfg, defect) for _ in range(cfg.n_layers)),
            ln_f=StyleRMSNorm(cfg.d_model, 1e-2 if defect == "eps" else cfg.norm_eps)))
        self.lm_head = nn.Linear(cfg.d_model, V, bias=False)
        if defect == "extra_linear":
            self.unused = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        if self.defect != "no_final_norm":
            x = self.transformer.ln_f(x)
        return self.lm_head(x)


# ---- a hand-written Llama with Hugging Face's names at its root ----------------------------------

class _RootLlamaLayer(nn.Module):
    """Hugging Face Llama's module names (self_attn.q_proj, input_layernorm, mlp.gate_proj, ...)
    and arithmetic (RoPE rotating halves, key/value heads repeated over their group), written
    by hand: no `model.` wrapper around the embedding, the layers and the final norm."""

    def __init__(self, cfg: da.DecoderConfig, defect: str | None) -> None:
        super().__init__()
        d, dh, eps = cfg.d_model, cfg.head_dim, 1e-2 if defect == "eps" else cfg.norm_eps
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, cfg.n_heads * dh, bias=False)
        self.self_attn.k_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.self_attn.v_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.self_attn.o_proj = nn.Linear(cfg.n_heads * dh, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.up_proj = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.d_ff, d, bias=False)
        self.input_layernorm = StyleRMSNorm(d, eps)
        self.post_attention_layernorm = StyleRMSNorm(d, eps)
        self.cfg, self.defect = cfg, defect

    def _attention(self, x):
        b, t, _ = x.shape
        cfg, dh, attn = self.cfg, self.cfg.head_dim, self.self_attn
        q = attn.q_proj(x).view(b, t, cfg.n_heads, dh).transpose(1, 2)  # (B, H, T, Dh)
        k, v = (p(x).view(b, t, cfg.kv_heads, dh).transpose(1, 2)  # (B, Hkv, T, Dh)
                for p in (attn.k_proj, attn.v_proj))
        theta = 1000.0 if self.defect == "theta" else cfg.rope_theta
        q, k = (_rope(z, theta, interleaved=self.defect == "rope_layout") for z in (q, k))
        group = cfg.n_heads // cfg.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B, H, T, Dh)
        y = _causal_attention(q, k, v, 1 / dh if self.defect == "scale" else dh ** -0.5)
        return attn.o_proj(y.transpose(1, 2).reshape(b, t, -1))

    def _mlp(self, x):
        act = F.gelu if self.defect == "activation" else F.silu
        return self.mlp.down_proj(act(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))

    def forward(self, x):
        post = self.defect == "post_norm"
        x = _residual(x, self.input_layernorm, self._attention, post)
        return _residual(x, self.post_attention_layernorm, self._mlp, post)


class RootLlama(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["hf_root"]
        self.defect = defect
        self.embed_tokens = nn.Embedding(V, cfg.d_model)
        self.layers = nn.ModuleList(_RootLlamaLayer(cfg, defect) for _ in range(cfg.n_layers))
        self.norm = StyleRMSNorm(cfg.d_model, 1e-2 if defect == "eps" else cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, V, bias=False)
        if defect == "extra_linear":
            self.unused = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        if self.defect != "no_final_norm":
            x = self.norm(x)
        return self.lm_head(x)


SPECS["hf_root"] = SPECS["litgpt"].replace(d_ff=40, norm_eps=1e-6, rope_theta=10000.0)
DEFECTS["hf_root"] = {**{k: v for k, v in COMMON.items() if k != "untied_copy"},
                      "theta": "oracle", "rope_layout": "oracle"}

STYLES = {"nanogpt": NanoGPT, "scratch": ScratchGPT, "tune": TuneLlama, "litgpt": LitGPT,
          "hf_root": RootLlama}


# ---- the declarations real models need (spec_declarations tests) -----------------------------
#
#     ScratchQwen3     LLMs-from-scratch's Qwen3Model (llms_from_scratch.qwen3, 1.0.19): tok_emb,
#                      trf_blocks.{i}.att.W_query/W_key/W_value/out_proj, per-head RMSNorms
#                      att.q_norm/k_norm (gain `scale`) before a rotate-half RoPE, ff.fc1/fc2/fc3
#                      (gate, up, down), norm1/norm2/final_norm with gain `scale`, out_head.
#                      Re-implemented: the package pins numpy < 2.1 and pulls tensorflow, so it
#                      is not a test dependency (test_spec_declarations compares this replica
#                      with the package where it is importable).
#     Megatron1P       a GPT whose LayerNorms are Megatron's LayerNorm1P (apply_layernorm_1p,
#                      NeMo, Nemotron): the gain is 1 + w, w stored around 0.
#     BiasedLlama      TuneLlama with a bias on some projections only (`biases`, canonical
#                      names: q_proj, v_proj, output_proj, w1, w3 ...).
#     wrong_backward_llama   TuneLlama whose down projections' hand-written backward is 5% off.
# Their defects are tabled in tests/gate/test_spec_declarations.py (DEFECTS here is the
# catalogue docs/defects.md and the README count).

SPECS["qwen3"] = da.DecoderConfig(
    vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_width=16, d_ff=40,
    max_seq_len=T, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", pos="rope", rope_theta=1e6,
    rope_layout="rotate_half", qk_norm=True, tie_embeddings=False)
SPECS["megatron1p"] = SPECS["nanogpt"].replace(norm_offset=1.0, tie_embeddings=False)


class ScratchRMSNorm(nn.Module):
    """LLMs-from-scratch's Qwen3 RMSNorm: normalised in float32, gain `scale` (and a `shift`
    it may have)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x):
        wide = x.to(torch.float32)
        normed = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.scale).to(x.dtype)


def _rotate_half_table(head_dim: int, theta: float, length: int):
    """cos, sin (length, Dh): each pair's angle repeated over both halves, as the package
    tabulates them once for the whole context."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos(), angles.sin()


class _Qwen3Block(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, defect: str | None) -> None:
        super().__init__()
        d, dh, eps = cfg.d_model, cfg.head_dim, 1e-2 if defect == "eps" else cfg.norm_eps
        self.att = nn.Module()
        widths = {"W_query": (d, cfg.n_heads * dh), "W_key": (d, cfg.kv_heads * dh),
                  "W_value": (d, cfg.kv_heads * dh), "out_proj": (cfg.n_heads * dh, d)}
        for name, (fan_in, fan_out) in widths.items():
            setattr(self.att, name, nn.Linear(fan_in, fan_out, bias=False))
        if defect != "no_q_norm":
            self.att.q_norm = ScratchRMSNorm(dh, eps)
        self.att.k_norm = ScratchRMSNorm(dh, eps)
        self.ff = nn.Module()
        self.ff.fc1 = nn.Linear(d, cfg.d_ff, bias=False)
        self.ff.fc2 = nn.Linear(d, cfg.d_ff, bias=False)
        self.ff.fc3 = nn.Linear(cfg.d_ff, d, bias=False)
        self.norm1, self.norm2 = ScratchRMSNorm(d, eps), ScratchRMSNorm(d, eps)
        self.cfg, self.defect = cfg, defect

    def _attention(self, x, cos, sin):
        b, t, _ = x.shape
        cfg, dh = self.cfg, self.cfg.head_dim
        q = self.att.W_query(x).view(b, t, cfg.n_heads, dh).transpose(1, 2)
        k = self.att.W_key(x).view(b, t, cfg.kv_heads, dh).transpose(1, 2)
        v = self.att.W_value(x).view(b, t, cfg.kv_heads, dh).transpose(1, 2)
        if hasattr(self.att, "q_norm"):
            q = self.att.q_norm(q)
        k = self.att.k_norm(k)
        if self.defect == "rope_layout":  # pairs (x[2j], x[2j+1]) where the spec says halves
            q, k = _rope(q, cfg.rope_theta, True), _rope(k, cfg.rope_theta, True)
        else:
            q, k = (z * cos[:t] + torch.cat((-z[..., dh // 2:], z[..., :dh // 2]), -1) * sin[:t]
                    for z in (q, k))
        group = cfg.n_heads // cfg.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = _causal_attention(q, k, v, 1 / dh if self.defect == "scale" else dh ** -0.5)
        return self.att.out_proj(y.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin):
        x = x + self._attention(self.norm1(x), cos, sin)
        h = self.norm2(x)
        return x + self.ff.fc3(F.silu(self.ff.fc1(h)) * self.ff.fc2(h))


class ScratchQwen3(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPECS["qwen3"]
        self.tok_emb = nn.Embedding(V, cfg.d_model)
        self.trf_blocks = nn.ModuleList(_Qwen3Block(cfg, defect) for _ in range(cfg.n_layers))
        self.final_norm = ScratchRMSNorm(cfg.d_model, cfg.norm_eps)
        self.out_head = nn.Linear(cfg.d_model, V, bias=False)
        cos, sin = _rotate_half_table(cfg.head_dim, cfg.rope_theta, cfg.max_seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, in_idx):
        _check_length(in_idx, self.cos.shape[0])
        x = self.tok_emb(in_idx)
        for block in self.trf_blocks:
            x = block(x, self.cos, self.sin)
        return self.out_head(self.final_norm(x))


class LayerNorm1P(nn.LayerNorm):
    """Megatron's LayerNorm1P: the gain is 1 + weight, the weight starting at 0 (`plain`: the
    defect of a port that applies the stored weight alone)."""

    def __init__(self, d: int, eps: float, plain: bool = False) -> None:
        super().__init__(d, eps=eps)
        nn.init.zeros_(self.weight)
        self.plain = plain

    def forward(self, x):
        gain = self.weight if self.plain else self.weight + 1
        return F.layer_norm(x, self.normalized_shape, gain, self.bias, self.eps)


class Megatron1P(NanoGPT):
    """nanoGPT's names and block with every LayerNorm a LayerNorm1P, untied (Megatron's GPT
    unties by default). Defect "plain": the norms apply w alone, as a port that forgot the 1."""

    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__(None, seed)
        cfg = SPECS["megatron1p"]
        gen = torch.Generator().manual_seed(seed)
        self.lm_head.weight = nn.Parameter(torch.randn(V, cfg.d_model, generator=gen) * 0.02)
        norm = lambda: LayerNorm1P(cfg.d_model, cfg.norm_eps, plain=defect == "plain")  # noqa: E731
        for block in self.transformer.h:
            block.ln_1, block.ln_2 = norm(), norm()
        self.transformer.ln_f = norm()
        with torch.no_grad():  # trained norms: w around 0, so a gain 1 + w around 1
            for name, p in self.named_parameters():
                if p.dim() == 1 and (".ln_" in name or name.startswith("transformer.ln_f")):
                    p.normal_(0.0, 0.1, generator=gen)


class _BiasedLayer(_TuneLayer):
    """A torchtune Llama layer whose projections named in `biases` carry a bias."""

    def __init__(self, cfg: da.DecoderConfig, defect: str | None, biases: tuple[str, ...]):
        super().__init__(cfg, defect)
        for name in biases:
            owner = self.mlp if name.startswith("w") else self.attn
            old = getattr(owner, name)
            linear = nn.Linear(old.in_features, old.out_features, bias=True)
            nn.init.normal_(linear.bias, std=0.02)
            setattr(owner, name, linear)


class BiasedLlama(TuneLlama):
    def __init__(self, biases: tuple[str, ...], defect: str | None = None, seed: int = 0) -> None:
        super().__init__(defect, seed)
        cfg = SPECS["tune"]
        self.layers = nn.ModuleList(_BiasedLayer(cfg, defect, biases)
                                    for _ in range(cfg.n_layers))
        for name, p in self.layers.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)


class _FivePercentLinear(torch.autograd.Function):
    """y = x W^T whose backward gives W a gradient 5% too large (a hand-written backward's
    slip): the forward is exact, only the gradient is wrong."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, 1.05 * grad.flatten(0, -2).T @ x.flatten(0, -2)


class _WrongBackwardLayer(_TuneLayer):
    def _mlp(self, x):
        hidden = F.silu(self.mlp.w1(x)) * self.mlp.w3(x)
        return _FivePercentLinear.apply(hidden, self.mlp.w2.weight)


def wrong_backward_llama(seed: int = 0) -> TuneLlama:
    """TuneLlama whose down projections run _FivePercentLinear (the layers' class swapped: the
    same weights, the same forward)."""
    model = TuneLlama(seed=seed)
    for layer in model.layers:
        layer.__class__ = _WrongBackwardLayer
    return model

