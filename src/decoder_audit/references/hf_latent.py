"""Latent attention's families (DeepSeek-V2 and V3, and those built on their attention:
Youtu, GLM-4.7-Flash's glm4_moe_lite, MiniCPM3): their config read as DecoderConfig fields.

Latent attention is a block unlike Llama's, so its fields are read here; which router the entry
names (`Family.experts`: "deepseek_v3" scores by a sigmoid and chooses within groups,
"deepseek_v2" by a softmax, greedily or within groups, None: dense MLPs) decides the routed
fields; the entry's reads and fixes then apply as for every family (`hf_config`).
"""

from __future__ import annotations

import math
from typing import Any

from ..config import DecoderConfig
from ..errors import ConfigError
from .family_entry import Family
from .family_errors import InvalidHFConfig
from .hf_rope import holds_rope_parameters, rope_fields, rope_parameters_of


def latent_fields(c: Any, entry: Family, problems: list[str]) -> dict[str, Any]:
    """The DecoderConfig fields of latent attention's block as transformers' modules compute
    it (DeepseekV2Config, DeepseekV3Config and the configs of the families built on their
    attention), appending what we cannot express to `problems`: latent attention (q_lora_rank
    None: one q_proj), each head its nope features then its rope ones, RoPE on the rope part
    (interleaved or on halves as rope_interleave says, where the entry fixes neither), scores
    scaled by (nope + rope)^-0.5 (times YaRN's mscale squared where mscale_all_dim is set); a
    dense MLP of intermediate_size; the routed experts by the router's form the entry names
    (`Family.experts`: `_routing`). The entry's own reads and fixes are applied after these
    (`hf_config.config_from_hf`): its dense layers, DeepSeek-V2's interleaved pairs, MiniCPM3's
    multipliers.

    Read in transformers 5's form only (a config holding rope_parameters): before it,
    DeepSeek's router returned (indices, weights), each expert was a module of its own, and its
    MoE block mixed float32 weights into a float64 model; those releases' models are audited
    black-box, saying so."""
    family = entry.model_type
    if not holds_rope_parameters(type(c)):
        raise ConfigError(f"{family} config of a transformers 4 release (rope_theta beside "
                          "rope_scaling): its modules are read as a spec in transformers 5's "
                          "form only (a router returning logits, weights and indices; the "
                          "experts in two tensors)")
    problems += _unexpressed(c)
    rope = rope_fields(c, entry, c.qk_rope_head_dim, problems)
    rope.pop("rotary_dim")  # the rotary part is rope_head_width (a factor is refused above)
    head = c.qk_nope_head_dim + c.qk_rope_head_dim
    attn_scale = None
    params = rope_parameters_of(c, entry)
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        # yarn_apply_mscale: the softmax scale times mscale^2, whatever the RoPE type
        factor = params.get("factor") or 1.0
        mscale = 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        attn_scale = head ** -0.5 * mscale * mscale
    interleaved = bool(getattr(c, "rope_interleave", True))
    return dict(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings, norm="rmsnorm", norm_eps=float(c.rms_norm_eps),
        mlp="swiglu", pos="rope", rope_layout="interleaved" if interleaved else "rotate_half",
        **rope, attn_scale=attn_scale, kv_latent_rank=c.kv_lora_rank,
        q_latent_rank=c.q_lora_rank, rope_head_width=c.qk_rope_head_dim,
        nope_head_width=c.qk_nope_head_dim, value_head_width=c.v_head_dim,
        **_routing(c, entry.experts, problems), tie_embeddings=bool(c.tie_word_embeddings))


def _unexpressed(c: Any) -> list[str]:
    """What latent attention's block, as transformers computes it, reads and we do not express."""
    problems = []
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r} (the gate's activation is SiLU: swiglu)")
    if getattr(c, "attention_bias", False):
        problems.append("attention_bias=True (q_a_proj, kv_a_proj_with_mqa and o_proj with "
                        "biases: latent attention has none here)")
    if getattr(c, "mlp_bias", False):
        problems.append("mlp_bias=True (the dense and shared MLPs biased, the experts not)")
    if c.num_key_value_heads not in (None, c.num_attention_heads):
        problems.append(f"num_key_value_heads={c.num_key_value_heads} != num_attention_heads="
                        f"{c.num_attention_heads} (kv_b_proj gives every head its own key and "
                        "value; transformers repeats them again and fails)")
    return problems


def _routing(c: Any, router: str | None, problems: list[str]) -> dict[str, Any]:
    """The routed fields of a DeepSeek router's form (see `latent_fields`): "deepseek_v3",
    "deepseek_v2", or None for a block whose every MLP is dense (Youtu, MiniCPM3). Which
    layers are dense is the entry's to read (first_k_dense_replace, mlp_layer_types)."""
    if router is None:
        return {}
    k, experts = c.num_experts_per_tok, c.n_routed_experts
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= (experts or 0):
        raise InvalidHFConfig(f"num_experts_per_tok={k!r} must be an integer from 1 to "
                              f"n_routed_experts={experts!r} (the experts each token is sent to)")
    fields: dict[str, Any] = {
        "n_experts": c.n_routed_experts, "experts_per_token": c.num_experts_per_tok,
        "expert_width": c.moe_intermediate_size, "n_shared_experts": c.n_shared_experts,
        "routed_scaling": float(c.routed_scaling_factor)}
    if router == "deepseek_v3":
        if c.n_group is None or c.topk_group is None:
            problems.append(f"n_group={c.n_group}, topk_group={c.topk_group} (V3's router "
                            "always chooses within groups: both are needed)")
            return fields
        fields.update(router_scoring="sigmoid", router_selection_bias=True,
                      normalize_topk=bool(c.norm_topk_prob))
        if c.n_group == 1:  # one group of every expert, always chosen: no limit
            return fields
        return {**fields, "expert_groups": c.n_group, "groups_per_token": c.topk_group,
                "group_score": "top2_sum"}
    fields.update(router_scoring="softmax", normalize_topk=False)
    if c.topk_method == "group_limited_greedy":
        fields.update(expert_groups=c.n_group, groups_per_token=c.topk_group, group_score="max")
    elif c.topk_method != "greedy":
        problems.append(f"topk_method={c.topk_method!r} (V2's router computes 'greedy' and "
                        "'group_limited_greedy' only)")
    return fields
