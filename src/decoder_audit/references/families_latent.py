"""The latent families of the families table (`families.FAMILIES`): DeepSeek's latent attention
(MLA: queries and keys/values through low-rank latents, each head's features split into a
rotary and a non-rotary part; `hf_latent` reads the block) in front of routed experts (DeepSeek
V3 and V2, GLM-4.7-Flash) or dense MLPs (Youtu, MiniCPM3). Beside the entries, the functions
they read fields through (`Family.read`) and their inverses for the writer (`Family.write`);
the routers' own helpers are families_routed.py's."""

from __future__ import annotations

from typing import Any

from .families_routed import dense_prefix, dense_prefix_write, first_k_dense, no_shared_mlp
from .family_entry import Family

# transformers' RMSNorm default: latent attention's norms (q_a_layernorm, kv_a_layernorm) are
# built without the config's rms_norm_eps, the block norms with it
_LATENT_NORM_EPS = 1e-6


def _latent_norm_eps(config: Any) -> float | None:
    """The latent norms' eps, where it is not the block norms' rms_norm_eps."""
    return None if float(config.rms_norm_eps) == _LATENT_NORM_EPS else _LATENT_NORM_EPS


def _minicpm3_residual(config: Any) -> float:
    """MiniCPM3's residual_scale: scale_depth / sqrt(num_hidden_layers)."""
    return config.scale_depth / config.num_hidden_layers ** 0.5


def _minicpm3_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"scale_emb": cfg.embedding_scale or 1.0,
            "scale_depth": cfg.residual_multiplier * cfg.n_layers ** 0.5,
            "dim_model_base": cfg.logit_scale * cfg.d_model}


# DeepSeek V3 and V2: latent attention in front of routed experts (their routers read by
# `hf_latent`), the first first_k_dense_replace layers dense
DEEPSEEK: tuple[Family, ...] = (
    Family("deepseek_v3", "DeepseekV3ForCausalLM", block="latent", experts="deepseek_v3",
           windows=False, read={"first_dense_layers": first_k_dense,
                                "latent_norm_eps": _latent_norm_eps}),
    # V2 rotates interleaved pairs (as complex numbers) whatever a rope_interleave says
    Family("deepseek_v2", "DeepseekV2ForCausalLM", block="latent", experts="deepseek_v2",
           windows=False, read={"first_dense_layers": first_k_dense,
                                "latent_norm_eps": _latent_norm_eps},
           fixed={"rope_layout": "interleaved"}),
)
# the latent families after them (helper fam-moe)
LATENT_DERIVED: tuple[Family, ...] = (
    # Youtu: DeepSeek-V3's latent attention in front of a dense MLP in every layer
    Family("youtu", "YoutuForCausalLM", block="latent", windows=False,
           read={"latent_norm_eps": _latent_norm_eps}),
    # GLM-4.7-Flash: DeepSeek-V3's latent attention and router, dense layers from mlp_layer_types
    Family("glm4_moe_lite", "Glm4MoeLiteForCausalLM", block="latent", experts="deepseek_v3",
           refused=(no_shared_mlp("n_shared_experts"),),
           windows=False, write=dense_prefix_write("mlp_layer_types"),
           read={"first_dense_layers": dense_prefix("mlp_layer_types"),
                 "latent_norm_eps": _latent_norm_eps}),
    # MiniCPM3: DeepSeek-V2's latent attention turning its rotary part on halves, dense MLPs,
    # the embeddings x scale_emb, each sublayer's output x scale_depth / sqrt(L), the final
    # hidden state divided by hidden_size / dim_model_base before the readout
    Family("minicpm3", "MiniCPM3ForCausalLM", block="latent", windows=False,
           fixed={"rope_layout": "rotate_half"}, write=_minicpm3_write,
           read={"latent_norm_eps": _latent_norm_eps, "embedding_scale": "scale_emb",
                 "residual_multiplier": _minicpm3_residual,
                 "logit_scale": lambda c: c.dim_model_base / c.hidden_size}),
)
