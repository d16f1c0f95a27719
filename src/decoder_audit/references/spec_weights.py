"""The canonical weights a spec's architecture has (`expected_weights`: DESIGN.md's names,
`token_embeddings.weight`, `layers.{i}.attn.q_proj.weight`, ..., `lm_head.weight`, with their
shapes), every name a module of its family might hold beside them (`every_canonical`), and what
a placement finds that does not fit (`misfits`, each naming the spec field that says why).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import UNROUTED, DecoderConfig


def expected_weights(spec: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight the spec's architecture has, with its shape (out, in for a
    matrix). lm_head.weight is listed tied or not: tied, it must be the embedding's Parameter."""
    v, d, t = spec.vocab_size, spec.d_model, spec.max_seq_len
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    norm = ("weight", "bias") if spec.norm == "layernorm" and spec.norm_bias else ("weight",)
    norm = norm if spec.norm_affine else ()  # OLMo's norms learn nothing
    shapes: dict[str, tuple[int, ...]] = {"token_embeddings.weight": (v, d)}
    if spec.pos == "learned":  # OPT's keeps position_offset rows before position 0's
        shapes["position_embeddings.weight"] = (spec.position_offset + t, d)
    if spec.embedding_norm:  # BLOOM's norm of the embeddings
        shapes.update({f"embedding_norm.{part}": (d,) for part in norm})
    matrices = {"attn.q_proj": (d_q, d), "attn.k_proj": (d_kv, d), "attn.v_proj": (d_kv, d),
                "attn.output_proj": (d, d_q)}
    if spec.latent_attention:
        matrices = {}
    for i in range(spec.n_layers):
        p = f"layers.{i}"
        for name in block_norms(spec):
            shapes.update({f"{p}.{name}.{part}": (d,) for part in norm})
        for name, shape in {**matrices, **_mlp_matrices(spec, i)}.items():
            shapes[f"{p}.{name}.weight"] = shape
            # each projection's own (attn_bias, mlp_bias); a routed expert's, expert_bias
            biased = spec.expert_bias if name.startswith("ffn.experts.") else \
                spec.has_bias(name.split(".")[-1])
            if biased:
                shapes[f"{p}.{name}.bias"] = shape[:1]
        if spec.attn_sinks:
            shapes[f"{p}.attn.sinks"] = (spec.n_heads,)
        if spec.latent_attention:
            shapes.update({f"{p}.{name}": shape for name, shape in _latent_weights(spec).items()})
        shapes.update(_activation_weights(spec, i))
        if spec.routes(i):
            shapes[f"{p}.ffn.router.weight"] = (spec.n_experts, d)
            if spec.router_bias:
                shapes[f"{p}.ffn.router.bias"] = (spec.n_experts,)
            if spec.router_selection_bias:
                shapes[f"{p}.ffn.router.selection_bias"] = (spec.n_experts,)
            if spec.shared_expert_gate:
                shapes[f"{p}.ffn.shared_gate.weight"] = (1, d)
        if spec.qk_norm:
            whole = spec.qk_norm_scope == "projection"  # OLMo 2: over the whole projection
            # a q/k LayerNorm (Persimmon) has a shift where the config's norms have one
            parts = ("weight", "bias") if spec.qk_norm_kind == "layernorm" and spec.norm_bias \
                else ("weight",)
            for which, width in (("q_norm", d_q), ("k_norm", d_kv)):
                shapes.update({f"{p}.attn.{which}.{part}": (width if whole else spec.head_dim,)
                               for part in parts})
    if spec.final_norm:  # GPT-1's post-norm blocks have none
        shapes.update({f"ln_final.{part}": (d,) for part in norm})
    shapes["lm_head.weight"] = (v, d)
    if spec.readout_bias:
        shapes["lm_head.bias"] = (v,)
    return shapes


def _mlp_matrices(spec: DecoderConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The MLP matrices of a layer (out, in): one dense MLP of width F, or a routed layer's E
    experts of width Fe and its shared experts (their total width), each w1, (w3,) w2."""
    d = spec.d_model
    if not spec.routes(layer):
        mlps = {"ffn": spec.d_ff}
    else:
        mlps = {f"ffn.experts.{e}": spec.expert_dim for e in range(spec.n_experts)}
        if spec.n_shared_experts:
            mlps["ffn.shared"] = spec.shared_dim
    out = {}
    for name, width in mlps.items():
        out.update({f"{name}.w1": (width, d), f"{name}.w2": (d, width)})
        if spec.gated:
            out[f"{name}.w3"] = (width, d)
    return out


def _activation_weights(spec: DecoderConfig, layer: int, *, every: bool = False
                        ) -> dict[str, tuple[int, ...]]:
    """A learned activation's parameters in a dense layer (xIELU's two numbers); `every`: those
    a module might hold whatever the spec's activation (so an extra one is found and named)."""
    if not every and (spec.mlp != "xielu" or spec.routes(layer)):
        return {}
    return {f"layers.{layer}.ffn.act.alpha_p": (1,), f"layers.{layer}.ffn.act.alpha_n": (1,)}


def _latent_weights(spec: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Latent attention's weights (DeepSeek's MLA) by their names under the block."""
    d, heads, rank, latent = spec.d_model, spec.n_heads, spec.q_latent_rank, spec.kv_latent_rank
    d_q = heads * spec.head_dim
    query = {"attn.q_proj.weight": (d_q, d)} if rank is None else {
        "attn.q_a_proj.weight": (rank, d), "attn.q_a_norm.weight": (rank,),
        "attn.q_b_proj.weight": (d_q, rank)}
    return {**query, "attn.kv_a_proj.weight": (latent + spec.rope_head_width, d),
            "attn.kv_a_norm.weight": (latent,),
            "attn.kv_b_proj.weight": (heads * (spec.nope_head_width + spec.value_dim), latent),
            "attn.output_proj.weight": (d, heads * spec.value_dim)}


def block_norms(spec: DecoderConfig) -> tuple[str, ...]:
    """The norms of a block: ln1, ln2 before the sublayers (pre_norm; ln1 alone where one norm
    feeds both, shared_norm) or after the residual adds (post_norm), ln1_post, ln2_post after
    the sublayers (sandwich_norm)."""
    normed = spec.pre_norm or spec.post_norm
    return (("ln1",) if normed else ()) + (
        ("ln2",) if normed and not spec.shared_norm else ()) + (
        ("ln1_post", "ln2_post") if spec.sandwich_norm else ())



def every_canonical(spec: DecoderConfig) -> list[str]:
    """Every canonical name a module of this family might hold: the spec's, and every bias,
    shift, gate and position table it might have although the spec says not (so an extra one
    is found and named, not left over)."""
    every = dict(attn_bias=True, attn_output_bias=True, mlp_bias=True, norm="layernorm",
                 mlp="swiglu", pos="learned", qk_norm=True, rotary_dim=None, rope_scaling=None,
                 window_rope_theta=None, sandwich_norm=True, pre_norm=True, norm_affine=True,
                 norm_bias=True, readout_bias=True, shared_norm=False, parallel_residual=False,
                 nope_layers=None, embedding_norm=True, final_norm=True, post_norm=False,
                 qk_norm_kind="layernorm", position_offset=0, attn_sinks=True,
                 swiglu_alpha=1.702, swiglu_limit=7.0)
    if spec.routed:  # the dense MLP without biases; the experts' and the router's
        every.update(mlp_bias=False, expert_bias=True, router_bias=True)
    if spec.latent_attention:  # latent attention's RoPE, and neither biases, q/k norms nor sinks
        every.update(attn_bias=False, attn_output_bias=None, qk_norm=False, pos="rope",
                     qk_norm_kind="rmsnorm", attn_sinks=False)
    names = expected_weights(spec.replace(**every))
    for layer in range(spec.n_layers):
        names.update(_activation_weights(spec, layer, every=True))
    if spec.routed:  # a dense MLP where the spec routes, or the reverse, is found and named
        names.update(expected_weights(spec.replace(**{**every, "n_experts": None, **UNROUTED})))
        names.update(expected_weights(spec.replace(**every, router_selection_bias=True,
                                                   first_dense_layers=0, moe_every=1,
                                                   n_shared_experts=max(1, spec.n_shared_experts),
                                                   shared_expert_gate=True)))
    return list(names)


def misfits(found: Mapping[str, tuple[int, ...]], spec: DecoderConfig) -> list[str]:
    """The differences between the canonical weights found and the spec's."""
    want = expected_weights(spec)
    problems = [f"{name} {list(shape)}: the spec expects it, the module has no such weight"
                for name, shape in want.items() if name not in found]
    problems += [f"{name} {list(found[name])}: the spec expects {list(shape)}"
                 for name, shape in want.items() if name in found and found[name] != shape]
    problems += [f"{name} {list(shape)}: the module has it, the spec ({_why_not(name, spec)}) "
                 "does not" for name, shape in found.items() if name not in want]
    return problems


def _why_not(name: str, spec: DecoderConfig) -> str:
    if name.endswith(".bias") and ".attn.output_proj" in name and \
            not isinstance(spec.attn_bias, tuple):
        return f"attn_output_bias={spec.attn_output_bias}, attn_bias={spec.attn_bias}"
    if name.endswith(".bias") and ".attn." in name:
        return f"attn_bias={_flag(spec.attn_bias)}"
    if name.startswith("embedding_norm."):
        return f"embedding_norm={spec.embedding_norm}"
    if name.startswith("ln_final.") and not spec.final_norm:
        return "final_norm=False"
    if "_norm.bias" in name and spec.qk_norm:
        return f"qk_norm_kind={spec.qk_norm_kind!r}, norm_bias={spec.norm_bias}"
    if "_norm." in name:
        return f"qk_norm={spec.qk_norm}"
    if name.endswith(".attn.sinks"):
        return f"attn_sinks={spec.attn_sinks}"
    if name.endswith(".router.bias"):
        return f"router_bias={spec.router_bias}"
    if name.endswith(".bias") and ".ffn.experts." in name:
        return f"expert_bias={spec.expert_bias}"
    if "_post." in name:
        return f"sandwich_norm={spec.sandwich_norm}"
    if name.endswith(".bias") and ".ffn." in name:
        return f"mlp_bias={_flag(spec.mlp_bias)}"
    if name.split(".")[-2].startswith("ln") and not spec.norm_affine:
        return "norm_affine=False"
    if name.split(".")[-2] in ("ln1", "ln2") and not (spec.pre_norm or spec.post_norm):
        return "pre_norm=False"
    if name.split(".")[-2] == "ln2" and spec.shared_norm:
        return "shared_norm=True"
    if name.endswith(".bias"):
        return f"norm={spec.norm!r}, norm_bias={spec.norm_bias}"
    if "w3" in name:
        return f"mlp={spec.mlp!r}"
    if name == "lm_head.bias":
        return f"readout_bias={spec.readout_bias}"
    if name.startswith("position_embeddings"):
        return f"pos={spec.pos!r}"
    return "its architecture"


def _flag(value: bool | tuple[str, ...]) -> str:
    """A bias field as a spec file spells it: False, or ['q_proj', 'v_proj']."""
    return str(list(value)) if isinstance(value, tuple) else str(value)
