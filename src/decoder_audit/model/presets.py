"""Named configurations, from the frozen 368-parameter teaching model to GPT-2 XL, Llama and
the routed-expert decoders (Mixtral, OLMoE, Qwen3-MoE, DeepSeek-V3)."""

from __future__ import annotations

import math

from ..config import DecoderConfig
from ..errors import ConfigError

# The frozen teaching decoder of the seeds: V=8 tokens, D=4, two blocks of two-head bias-free
# attention and a biased 4 -> 8 -> 4 ReLU MLP, learned positions for T <= 4, LayerNorm, tied.
_TINY_368 = DecoderConfig(
    vocab_size=8, d_model=4, n_layers=2, n_heads=2, d_ff=8, max_seq_len=4,
    norm="layernorm", mlp="relu", pos="learned", attn_bias=False, mlp_bias=True,
    tie_embeddings=True,
)

# (L, D, H) of the four GPT-2 sizes; both families below use them.
_GPT2_SHAPES = {
    "small": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}


def _gpt2(n_layers: int, d_model: int, n_heads: int) -> DecoderConfig:
    """GPT-2: learned positions, LayerNorm, tanh-GELU MLP of width 4D, biases everywhere, tied."""
    return DecoderConfig(
        vocab_size=50257, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        d_ff=4 * d_model, max_seq_len=1024, norm="layernorm", norm_eps=1e-5, mlp="gelu_tanh",
        pos="learned", attn_bias=True, mlp_bias=True, tie_embeddings=True,
    )


def _cs336(n_layers: int, d_model: int, n_heads: int, *, vocab_size: int = 50257,
           max_seq_len: int = 1024, d_ff: int | None = None) -> DecoderConfig:
    """The CS336 Transformer LM: RMSNorm, SwiGLU (d_ff = 4D here), interleaved RoPE, no biases,
    untied readout."""
    return DecoderConfig(
        vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        d_ff=4 * d_model if d_ff is None else d_ff, max_seq_len=max_seq_len, norm="rmsnorm",
        norm_eps=1e-5, mlp="swiglu", pos="rope", rope_theta=10000.0, attn_bias=False,
        mlp_bias=False, tie_embeddings=False,
    )


PRESETS: dict[str, DecoderConfig] = {
    "tiny-368": _TINY_368,
    **{f"gpt2-{size}": _gpt2(*shape) for size, shape in _GPT2_SHAPES.items()},
    **{f"cs336-{size}": _cs336(*shape) for size, shape in _GPT2_SHAPES.items()},
    # The assignment's reference test model (reference/cs336/model_config.json).
    "cs336-test": _cs336(3, 64, 4, vocab_size=10000, max_seq_len=16, d_ff=128),
    # A small Llama-3-style shape with real grouped-query attention (4 query heads per KV head).
    "llama-debug": DecoderConfig(
        vocab_size=2048, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=704,
        max_seq_len=512, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope",
        rope_theta=500000.0, attn_bias=False, mlp_bias=False, tie_embeddings=False,
    ),
    # Llama 2 7B and Llama 3 8B (Meta's shapes: interleaved RoPE pairs, as Meta's own code
    # rotates them; a Hugging Face checkpoint of either reads as rotate_half through from_hf).
    "llama2-7b": DecoderConfig(
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=4096,
        norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope", rope_theta=10000.0,
        attn_bias=False, mlp_bias=False, tie_embeddings=False,
    ),
    "llama3-8b": DecoderConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
        max_seq_len=8192, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope",
        rope_theta=500000.0, attn_bias=False, mlp_bias=False, tie_embeddings=False,
    ),
    # Routed experts, from each model's published config.json (docs/experts.md gives the
    # sources and the published parameter counts the ledger is tested against). RoPE pairs as
    # the Hugging Face checkpoints store them: rotate_half, DeepSeek's interleaved.
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): 8 experts of 14336, 2 per token.
    "mixtral-8x7b": DecoderConfig(
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
        max_seq_len=32768, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope",
        rope_theta=1e6, rope_layout="rotate_half", tie_embeddings=False, n_experts=8,
        experts_per_token=2,
    ),
    # OLMoE 1B-7B (allenai/OLMoE-1B-7B-0924): 64 experts of 1024, 8 per token, unnormalised
    # weights (norm_topk_prob false), q/k RMSNorm over the whole projection.
    "olmoe-1b-7b": DecoderConfig(
        vocab_size=50304, d_model=2048, n_layers=16, n_heads=16, d_ff=1024, max_seq_len=4096,
        norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope", rope_theta=10000.0,
        rope_layout="rotate_half", qk_norm=True, qk_norm_scope="projection",
        tie_embeddings=False, n_experts=64, experts_per_token=8, normalize_topk=False,
    ),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B): 128 experts of 768, 8 per token, renormalised; heads
    # of 128 with per-head q/k norms (d_ff is the unused dense width, intermediate_size).
    "qwen3-30b-a3b": DecoderConfig(
        vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_width=128,
        d_ff=6144, max_seq_len=40960, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", pos="rope",
        rope_theta=1e6, rope_layout="rotate_half", qk_norm=True, tie_embeddings=False,
        n_experts=128, experts_per_token=8, expert_width=768,
    ),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3, without its multi-token-prediction module): latent
    # attention (q 1536, kv 512, heads of 128 + 64, values of 128), 3 dense layers of 18432,
    # then 256 experts of 2048 (8 per token, sigmoid scores, a selection-only bias, weights
    # renormalised times 2.5, chosen within the 4 best of 8 groups of 32) and one shared;
    # YaRN x40 from 4096, the scores scaled by (0.1 ln 40 + 1)^2 / sqrt(192) (mscale_all_dim 1).
    "deepseek-v3": DecoderConfig(
        vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, d_ff=18432,
        max_seq_len=163840, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", pos="rope",
        rope_theta=10000.0, rope_scaling={"type": "yarn", "factor": 40.0,
                                          "original_max_seq_len": 4096, "beta_fast": 32.0,
                                          "beta_slow": 1.0, "attention_factor": 1.0},
        attn_scale=(0.1 * math.log(40.0) + 1.0) ** 2 / math.sqrt(192), tie_embeddings=False,
        kv_latent_rank=512, q_latent_rank=1536, rope_head_width=64, nope_head_width=128,
        value_head_width=128, n_experts=256, experts_per_token=8, expert_width=2048,
        n_shared_experts=1, router_scoring="sigmoid", router_selection_bias=True,
        expert_groups=8, groups_per_token=4, routed_scaling=2.5, first_dense_layers=3,
    ),
}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset(name: str) -> DecoderConfig:
    """The named configuration; raises ConfigError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets are {preset_names()}") from None
