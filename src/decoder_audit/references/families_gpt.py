"""The GPT-style families of the families table (`families.FAMILIES`): blocks unlike Llama's
(GPT-2 and GPT-NeoX, whose rows the converter and the layouts place; GPT-Neo, GPT-BigCode, OPT,
BioGPT, GPT-J, CodeGen, Phi, Falcon), and the families of other positions and norm placements
(BLOOM's and MPT's ALiBi, XGLM's sinusoidal table, GPT-1's post-norm blocks, Persimmon's q/k
LayerNorms). Their entries, and beside them the functions those entries read fields through
(`Family.read`) and their inverses for the writer (`Family.write`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from .family_entry import CLIPPED, PLAIN_ACTIVATIONS, Family, llama
from .family_errors import InvalidHFConfig, Unexpressed

# Their MLPs are plain (no gate), their activation named as GPT-2's activation_function names it
# (the tanh GELU written gelu_new first, as GPT-2's configs write it)
GPT_ACTIVATIONS = MappingProxyType({"gelu": "gelu", "gelu_new": "gelu_tanh",
                                    "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                                    "relu": "relu"})
# Not Llama's block: every field is the entry's own; each head D / H wide, the window where the
# entry reads one
_GPT_STYLE = dict(block="gpt2", windows=False, grouped=False, activations=GPT_ACTIVATIONS)
_NO_CROSS_ATTENTION = ("add_cross_attention", "a decoder-only model has no cross attention")


def _n_inner(config: Any) -> int:
    """GPT-2's convention for the MLP width: n_inner, or 4 D when unset."""
    return config.n_inner if config.n_inner is not None else 4 * config.hidden_size


def _neox_attention_bias(config: Any) -> bool:
    """GPT-NeoX's q/k/v and output biases: attention_bias, on unless a config says otherwise
    (releases before it always had them)."""
    return bool(getattr(config, "attention_bias", True))


def _scaled_embedding(config: Any) -> float | None:
    """BioGPT's and XGLM's embedding scale: sqrt(D) where scale_embedding is set."""
    return float(config.hidden_size) ** 0.5 if config.scale_embedding else None


def _scaled_embedding_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"scale_embedding": cfg.embedding_scale is not None}


def _qk_layernorm_kind(config: Any) -> str:
    """Persimmon's and Phi's q/k norms are LayerNorms (where qk_layernorm gives them any)."""
    return "layernorm" if config.qk_layernorm else "rmsnorm"


# ---- GPT-2 and GPT-NeoX: the converter's GPT-2 (rename tables), GPT-NeoX's fused q/k/v -----------
GPT2 = Family(
    "gpt2", "GPT2LMHeadModel", block="gpt2", converter=True, windows=False, grouped=False,
    layout_written=False, activation=("activation_function",),
    activations={"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                 "relu": "relu"},
    fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True},
    read={"norm_eps": "layer_norm_epsilon", "d_ff": _n_inner},
    refused=(("scale_attn_weights", "unscaled scores: we always scale by 1/sqrt(Dh)",
              lambda value: not value),
             ("scale_attn_by_inverse_layer_idx", "scores scaled per layer by 1/(i+1)"),
             ("reorder_and_upcast_attn", "scores upcast and reordered"), _NO_CROSS_ATTENTION))
GPT_NEOX = Family(
    "gpt_neox", "GPTNeoXForCausalLM", block="gpt_neox", partial_rotary=True, windows=False,
    grouped=False, activations=GPT_ACTIVATIONS,
    fixed={"norm": "layernorm", "mlp_bias": True},
    read={"norm_eps": "layer_norm_eps", "parallel_residual": "use_parallel_residual",
          "attn_bias": _neox_attention_bias},
    write=lambda cfg, cls: {"attention_bias": cfg.attn_bias},
    legacy_rope={"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"})


# ---- GPT-style families (helper fam-gpt) --------------------------------------------------------
def _neo_window(config: Any) -> int | None:
    """GPT-Neo's window: window_size keys on its "local" layers (attention_layers)."""
    return config.window_size if "local" in config.attention_layers else None


def _neo_window_layers(config: Any) -> tuple[int, ...] | None:
    local = tuple(i for i, kind in enumerate(config.attention_layers) if kind == "local")
    return local if local and len(local) < len(config.attention_layers) else None


def _neo_write(cfg: Any, config_class: type) -> dict[str, Any]:
    kinds = ["local" if cfg.window(i) is not None else "global" for i in range(cfg.n_layers)]
    return {"attention_types": [[kinds, 1]], "window_size": cfg.sliding_window or 256}


def _bigcode_kv_heads(config: Any) -> int | None:
    """GPT-BigCode's one key/value head (multi_query), or one per query head."""
    return 1 if config.multi_query and config.num_attention_heads > 1 else None


def _unscaled(config: Any) -> float | None:
    """Scores q.k unscaled where scale_attn_weights is off (GPT-BigCode), else 1/sqrt(Dh)."""
    return None if config.scale_attn_weights else 1.0


def _bigcode_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"n_inner": cfg.d_ff, "multi_query": cfg.kv_heads == 1,
            "scale_attn_weights": cfg.attn_scale is None}


def _opt_width(config: Any) -> int:
    """OPT's residual width, where its embedding has the same (OPT-350m's project_in and
    project_out map between an embedding of word_embed_proj_dim and the blocks)."""
    if config.word_embed_proj_dim != config.hidden_size:
        raise Unexpressed(f"word_embed_proj_dim={config.word_embed_proj_dim} != hidden_size="
                          f"{config.hidden_size} (project_in and project_out between the "
                          "embedding's width and the blocks': not expressed)")
    return config.hidden_size


def _opt_post_norm(config: Any) -> bool:
    """OPT's norms after each residual add (OPT-350m's do_layer_norm_before=False)."""
    return not config.do_layer_norm_before


def _opt_final_norm(config: Any) -> bool:
    """OPT's final norm: only in front of pre-norm blocks, and not where a config removes it
    (_remove_final_layer_norm, kept for old checkpoints)."""
    return bool(config.do_layer_norm_before) and not getattr(config, "_remove_final_layer_norm",
                                                                False)


def _opt_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"_remove_final_layer_norm": cfg.pre_norm and not cfg.final_norm}


def _rotary_dim(config: Any) -> int | None:
    """GPT-J's and CodeGen's rotated width: rotary_dim features of each head (None where that
    is all of them). Unset, their table is hidden_size wide, which only one head of D fits."""
    heads, width = config.num_attention_heads, config.hidden_size
    if config.rotary_dim is None:
        if heads == 1:
            return None
        raise InvalidHFConfig(f"rotary_dim=None with num_attention_heads={heads}: the rotary "
                              f"table is hidden_size={width} wide, wider than a head of "
                              f"{width // heads} (the forward fails)")
    return None if config.rotary_dim == width // heads else config.rotary_dim


def _gptj_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"n_inner": cfg.d_ff, "rotary_dim": cfg.rotary_dim or cfg.head_dim}


_GPTJ = dict(_GPT_STYLE, rope_config=False, activation=("activation_function",), write=_gptj_write,
             # one LayerNorm feeding attention and the MLP beside each other; RoPE on
             # interleaved pairs (rotate_every_two) of the first rotary_dim features, base 10000
             fixed={"norm": "layernorm", "pos": "rope", "rope_layout": "interleaved",
                    "rope_theta": 10000.0, "parallel_residual": True, "shared_norm": True,
                    "attn_bias": False, "mlp_bias": True, "readout_bias": True},
             read={"norm_eps": "layer_norm_epsilon", "d_ff": _n_inner,
                   "rotary_dim": _rotary_dim})


def _falcon_kv_heads(config: Any) -> int | None:
    """Falcon's key/value heads: num_kv_heads in the new architecture, one with multi_query,
    else one per query head."""
    heads = config.num_attention_heads
    kv = (config.num_kv_heads if config.new_decoder_architecture else
          1 if config.multi_query else heads)
    return None if kv == heads else kv


def _falcon_parallel(config: Any) -> bool:
    """Whether Falcon's block is parallel (its MLP reads the block's input, not the stream
    after attention), for the forms its layer both builds and runs."""
    norms = config.num_ln_in_parallel_attn
    if config.new_decoder_architecture and not config.parallel_attn:
        raise Unexpressed("new_decoder_architecture=True with parallel_attn=False (its layer "
                          "builds the sequential norms and reads the parallel ones)")
    if config.new_decoder_architecture and norms not in (None, 1, 2):
        raise Unexpressed(f"num_ln_in_parallel_attn={norms} (its layer reads 1 or 2 norms)")
    if not config.new_decoder_architecture and config.parallel_attn and norms == 2:
        raise Unexpressed("num_ln_in_parallel_attn=2 without new_decoder_architecture (its "
                          "layer builds ln_attn, ln_mlp and reads input_layernorm)")
    return bool(config.parallel_attn)


def _falcon_shared_norm(config: Any) -> bool:
    """One norm in front of both sublayers: the original parallel block (Falcon-7B), or the
    new architecture's with num_ln_in_parallel_attn=1 (Falcon-11B)."""
    if not config.parallel_attn:
        return False
    return not config.new_decoder_architecture or config.num_ln_in_parallel_attn == 1


def _falcon_write(cfg: Any, config_class: type) -> dict[str, Any]:
    if cfg.parallel_residual:  # the new architecture holds any KV heads, one norm or two
        return {"new_decoder_architecture": True, "parallel_attn": True,
                "num_ln_in_parallel_attn": 1 if cfg.shared_norm else 2,
                "num_kv_heads": cfg.kv_heads}
    return {"new_decoder_architecture": False, "parallel_attn": False,
            "multi_query": cfg.kv_heads == 1, "num_kv_heads": cfg.n_heads}


GPT_STYLE: tuple[Family, ...] = (
    # GPT-Neo: GPT-2's block with unscaled scores, a bias on the output projection only, and
    # windowed "local" layers
    Family("gpt_neo", "GPTNeoForCausalLM", **_GPT_STYLE, activation=("activation_function",),
           fixed={"norm": "layernorm", "pos": "learned", "attn_scale": 1.0,
                  "attn_bias": ("output_proj",), "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon",
                 "d_ff": lambda c: (c.intermediate_size if c.intermediate_size is not None
                                    else 4 * c.hidden_size),
                 "sliding_window": _neo_window, "window_layers": _neo_window_layers},
           write=_neo_write),
    # GPT-BigCode (StarCoder): GPT-2's block, one key/value head with multi_query, its c_attn
    # rows KV group by KV group (its own layout: GPT-2's names and shape)
    Family("gpt_bigcode", "GPTBigCodeForCausalLM", **_GPT_STYLE,
           activation=("activation_function",), layout="Hugging Face GPT-BigCode",
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _n_inner,
                 "n_kv_heads": _bigcode_kv_heads, "attn_scale": _unscaled},
           write=_bigcode_write, refused=(_NO_CROSS_ATTENTION,)),
    # OPT: fairseq's pre-norm decoder, LayerNorms of eps 1e-5, learned positions from row 2
    Family("opt", "OPTForCausalLM", **_GPT_STYLE, activation=("activation_function",),
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "learned",
                  "position_offset": 2},
           read={"d_model": _opt_width, "d_ff": "ffn_dim", "attn_bias": "enable_bias",
                 "mlp_bias": "enable_bias", "norm_affine": "layer_norm_elementwise_affine",
                 "norm_bias": "layer_norm_elementwise_affine",
                 # OPT-350m's post-norm blocks (do_layer_norm_before=False), without a final norm
                 "pre_norm": "do_layer_norm_before", "post_norm": _opt_post_norm,
                 "final_norm": _opt_final_norm},
           write=_opt_write),
    # BioGPT: OPT's block with biases everywhere and an embedding scaled by sqrt(D)
    Family("biogpt", "BioGptForCausalLM", **_GPT_STYLE,
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "learned",
                  "position_offset": 2, "attn_bias": True, "mlp_bias": True},
           read={"embedding_scale": _scaled_embedding}, write=_scaled_embedding_write),
    Family("gptj", "GPTJForCausalLM", **_GPTJ),
    # CodeGen: GPT-J with q, k, v fused (qkv_proj in 4 shards of q, v, k rows: its layout)
    Family("codegen", "CodeGenForCausalLM", **_GPTJ),
    # Phi-1, Phi-2: Llama's names for q/k/v, one LayerNorm in front of a parallel block, partial
    # rotary, biases everywhere, a plain MLP fc1 -> fc2, a bias on the logits
    llama("phi", "PhiForCausalLM", partial_rotary=True, windows=False,
          activations=GPT_ACTIVATIONS,
          fixed={"norm": "layernorm", "attn_bias": True, "mlp_bias": True,
                 "parallel_residual": True, "shared_norm": True, "readout_bias": True},
          # per-head LayerNorms of q and k (with a shift) where qk_layernorm says, as Persimmon
          read={"norm_eps": "layer_norm_eps", "qk_norm": "qk_layernorm",
                "qk_norm_kind": _qk_layernorm_kind}),
    # Falcon: its new architecture (two norms beside each other, or one; grouped KV heads) and
    # the original (Falcon-7B: one norm, a parallel block, one KV head), q/k/v fused
    Family("falcon", "FalconForCausalLM", **_GPT_STYLE, activation=("activation",),
           fixed={"norm": "layernorm", "pos": "rope"},
           read={"norm_eps": "layer_norm_epsilon", "attn_bias": "bias", "mlp_bias": "bias",
                 "d_ff": "ffn_hidden_size", "n_kv_heads": _falcon_kv_heads,
                 "parallel_residual": _falcon_parallel, "shared_norm": _falcon_shared_norm},
           write=_falcon_write,
           refused=(("alibi", "ALiBi's linear distance biases on the scores instead of RoPE"),)),
)


# ---- position and norm placements (helper fam-positions) ----------------------------------------
_ALIBI_HORIZON = 2048
"""BLOOM's training length: the max_seq_len of a BLOOM spec, whose config declares none (ALiBi
runs at any length: the gate audits it with no hard limit, `facts.py`)."""


def _alibi_horizon(config: Any) -> int:
    """The length a config without one of its own is read with (BLOOM's: `_ALIBI_HORIZON`)."""
    return getattr(config, "max_position_embeddings", None) or _ALIBI_HORIZON


def _four_times(config: Any) -> int:
    """The MLP width BLOOM, MPT and GPT-1 fix at 4 D (MPT's expansion_ratio, BLOOM's n_inner
    are never read by transformers' modules)."""
    return 4 * config.hidden_size


def _mpt_scale(config: Any) -> float | None:
    """MPT's score scale: attn_config.softmax_scale, None for 1/sqrt(Dh)."""
    return config.attn_config.softmax_scale


# transformers' BLOOM and MPT add the slopes of Press et al. (MPT's alibi_bias_max is fixed at
# 8 by transformers, whatever attn_config says: the same slopes), after the score scale
POSITION_FAMILIES: tuple[Family, ...] = (
    Family("bloom", "BloomForCausalLM", block="bloom", windows=False, grouped=False,
           activation=(), activations={},  # its own tanh GELU, whatever the config says
           fixed={"norm": "layernorm", "pos": "alibi", "embedding_norm": True, "attn_bias": True,
                  "mlp_bias": True, "mlp": "gelu_tanh"},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times,
                 "max_seq_len": _alibi_horizon},
           refused=(("apply_residual_connection_post_layernorm",
                     "the residual taken after the norm, not before it"),)),
    Family("mpt", "MptForCausalLM", block="mpt", windows=False, grouped=False,
           activation=(), activations={},  # exact GELU, fixed
           fixed={"norm": "layernorm", "norm_bias": False, "pos": "alibi", "attn_bias": False,
                  "mlp_bias": False, "mlp": "gelu"},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times,
                 "max_seq_len": "max_seq_len", "attn_scale": _mpt_scale},
           write=lambda cfg, cls: {"attn_config": {"softmax_scale": cfg.attn_scale}},
           refused=(("attn_config.clip_qkv", CLIPPED[1]),)),
    # XGLM: fairseq's sinusoidal table from row 2, the embedding scaled by sqrt(D)
    Family("xglm", "XGLMForCausalLM", block="xglm", windows=False, grouped=False,
           activation=("activation_function",), activations=PLAIN_ACTIVATIONS,
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "sinusoidal",
                  "position_offset": 2, "attn_bias": True, "mlp_bias": True},
           read={"d_ff": "ffn_dim", "embedding_scale": _scaled_embedding},
           write=_scaled_embedding_write,
           refused=(_NO_CROSS_ATTENTION,
                    ("pad_token_id", "its sinusoidal table's row pad_token_id is zeroed, so "
                     "position pad_token_id - 2 adds nothing",
                     lambda value: isinstance(value, int) and value >= 2))),
    # GPT-1: post-norm blocks, no final norm, learned positions, GPT-2's tanh GELU as "gelu"
    Family("openai-gpt", "OpenAIGPTLMHeadModel", block="openai-gpt", windows=False,
           grouped=False, activation=("afn",),
           activations={"gelu": "gelu_tanh", "relu": "relu"},
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True,
                  "pre_norm": False, "post_norm": True, "final_norm": False},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times}),
    # Persimmon: per-head LayerNorms of q and k (with a shift), partial rotary, ReLU squared
    Family("persimmon", "PersimmonForCausalLM", block="persimmon", partial_rotary=True,
           windows=False, grouped=False, activations=PLAIN_ACTIVATIONS,
           fixed={"norm": "layernorm", "pos": "rope", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_eps", "qk_norm": "qk_layernorm",
                 "qk_norm_kind": _qk_layernorm_kind}),
)
