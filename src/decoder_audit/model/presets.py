"""Named configurations, from the frozen 368-parameter teaching model to GPT-2 XL."""

from __future__ import annotations

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
}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset(name: str) -> DecoderConfig:
    """The named configuration; raises ConfigError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets are {preset_names()}") from None
