"""The symptoms of numerics bugs: what a layer of the model computes, held to its definition
written here from the model's own weights and the checkpoint's declared architecture (the
attention's scale, the rotary tables, the routing by groups, the load-balancing loss's gradient,
the readout's bias). Like symptoms.py, torch alone; each returns one figure, 0 for a correct
model up to float32 rounding. Shapes: N routed tokens, E experts, T positions, V the
vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .calls import SEED
from .calls import ids as _ids
from .calls import logits as _logits


def aux_loss_gradient(model: nn.Module, V: int, T: int = 12) -> float:
    """How far the gradient the model's load-balancing loss (out.aux_loss, output_router_logits=
    True) sends into its routers' weights is from the gradient of the loss by its definition
    (Switch Transformer: E x sum_e F_e P_e over every routed token, F_e the share of tokens that
    chose expert e among their top k, P_e the mean softmax probability of e), computed from the
    logits each router's weight gives on the input it received: |g - g_def| / |g_def|. The
    routers are transformers 5's modules named *TopKRouter (weight (E, D)); their inputs are kept
    in the graph, so both losses depend on the weights along the same paths."""
    model.eval()  # no jitter noise: the same forward for both losses
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    assert routers, f"{type(model).__name__}: no *TopKRouter module"
    received: dict[int, torch.Tensor] = {}
    hooks = [r.register_forward_pre_hook(lambda m, a, i=i: received.__setitem__(i, a[0]))
             for i, r in enumerate(routers)]
    try:
        returned = model(input_ids=_ids(V, 2, T), output_router_logits=True).aux_loss
    finally:
        for hook in hooks:
            hook.remove()
    logits = torch.cat([received[i].reshape(-1, r.weight.shape[1]).double() @ r.weight.double().T
                        for i, r in enumerate(routers)])  # (L B T, E)
    probs = logits.softmax(-1)
    chosen = probs.topk(model.config.num_experts_per_tok, -1).indices  # (L B T, k)
    share = torch.zeros_like(probs).scatter(-1, chosen, 1.0).mean(0)  # (E,) F_e
    defined = probs.shape[-1] * (share * probs.mean(0)).sum()
    weights = [r.weight for r in routers]
    got = torch.autograd.grad(returned, weights, retain_graph=True)
    want = torch.autograd.grad(defined, weights)
    off = sum(((g.double() - w) ** 2).sum() for g, w in zip(got, want)).sqrt()
    return float(off / sum((w ** 2).sum() for w in want).sqrt())


def _attention_parts(model: nn.Module):
    """The first attention module, its query, key and value weights and biases (views of the
    module's parameters), and its output projection: three projections (q_proj, k_proj, v_proj,
    out_proj: OPT, BioGPT, XGLM) or GPT-BigCode's multi-query c_attn, whose rows hold the query
    (D), then one key head and one value head (d each)."""
    for m in model.modules():
        if all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "out_proj")):
            return m, [(p.weight, p.bias) for p in (m.q_proj, m.k_proj, m.v_proj)], m.out_proj
        if hasattr(m, "c_attn") and getattr(m, "multi_query", False):
            D, d = m.embed_dim, m.head_dim
            W, b = m.c_attn.weight, m.c_attn.bias
            rows = (slice(0, D), slice(D, D + d), slice(D + d, D + 2 * d))
            return m, [(W[r], None if b is None else b[r]) for r in rows], m.c_proj
    raise AssertionError(f"{type(model).__name__}: no attention module of a known layout")


@torch.no_grad()
def attention_vs_definition(model: nn.Module, V: int, T: int = 12, scale: float = 30.0) -> float:
    """How far the first attention layer's output (what its output projection receives) is from
    causal softmax(q k^T / sqrt(d)) v written from its definition, q, k, v being its own
    projections on the input it received (a layer without rotary positions: OPT, BioGPT, XGLM,
    GPT-BigCode; key/value heads shared across query heads where there are fewer). The query
    and key weights are scaled up first (on a copy) so that the scores are far from 0 and a
    wrong scale shows."""
    import copy
    import math

    probe = copy.deepcopy(model).eval()
    attn, parts, out_proj = _attention_parts(probe)
    for weight, _ in parts[:2]:
        weight.mul_(scale)
    seen: dict[str, torch.Tensor] = {}

    def took(module, args, kwargs):
        seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    hooks = [attn.register_forward_pre_hook(took, with_kwargs=True),
             out_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("o", a[0]))]
    try:
        _logits(probe, _ids(V, 1, T), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    H = probe.config.num_attention_heads
    x = seen["x"].double()  # (1, T, D)
    q, k, v = (F.linear(x, w.double(), None if b is None else b.double()) for w, b in parts)
    d = q.shape[-1] // H
    q, k, v = (t.view(1, T, -1, d).transpose(1, 2) for t in (q, k, v))  # (1, heads, T, d)
    k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))  # (1, H, T, d)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # (1, H, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    defined = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, T, -1)  # (1, T, H d)
    return (seen["o"].double() - defined).abs().max().item()


def _recording_group_routings(model: nn.Module, seen: list) -> list:
    """Record into `seen`, for each routing by groups a forward makes, (router logits, chosen
    expert indices, selection bias, groups, groups kept), in either of transformers' two forms:
    a router module returning (logits, weights, indices) (later releases), or an MoE block whose
    route_tokens_to_experts(logits) returns (indices, weights) (5.0 to 5.6). Returns the undo
    functions."""
    undo = []
    for m in model.modules():
        if hasattr(m, "e_score_correction_bias") and hasattr(m, "num_group"):
            hook = m.register_forward_hook(lambda m, a, out: seen.append(
                (out[0], out[2], m.e_score_correction_bias, m.num_group, m.topk_group)))
            undo.append(hook.remove)
        elif hasattr(m, "route_tokens_to_experts") and hasattr(m, "n_group"):
            def recorded(router_logits, m=m, route=m.route_tokens_to_experts):
                indices, weights = route(router_logits)
                seen.append((router_logits, indices, m.gate.e_score_correction_bias, m.n_group,
                             m.topk_group))
                return indices, weights
            m.route_tokens_to_experts = recorded  # the block's forward calls it by name
            undo.append(lambda m=m: delattr(m, "route_tokens_to_experts"))
    assert undo, f"{type(model).__name__}: no routing by groups"
    return undo


@torch.no_grad()
def routed_outside_groups(model: nn.Module, V: int, T: int = 12) -> float:
    """The share of the expert choices (token, slot) that fall outside the groups the token's
    scores choose, in a model routing by groups (DeepSeek-V3's form: each group scored by the sum
    of its two best sigmoid(logit) + bias, the topk_group best kept, the experts chosen inside
    them only). The choices are those the model's routing returned, the groups recomputed here
    from the router logits it computed."""
    model.eval()
    seen: list = []
    undo = _recording_group_routings(model, seen)
    try:
        _logits(model, _ids(V, 2, T), use_cache=False)
    finally:
        for step in undo:
            step()
    outside = total = 0
    for logits, chosen, bias, groups, kept_groups in seen:
        E = logits.shape[-1]
        scores = logits.float().sigmoid() + bias  # (N, E)
        best = scores.view(-1, groups, E // groups).topk(2, -1).values.sum(-1)  # (N, groups)
        kept = best.topk(kept_groups, -1).indices  # (N, topk_group)
        group_of = chosen // (E // groups)  # (N, k)
        outside += int((group_of[..., None] != kept[:, None, :]).all(-1).sum())
        total += chosen.numel()
    return outside / total


@torch.no_grad()
def checkpoint_readout_bias(model: nn.Module, V: int, T: int = 12) -> float:
    """A checkpoint that carries a readout bias (lm_head.bias, as Phi-1, 1.5 and 2 ship) is
    written from the model (save_pretrained, the bias set to seeded values, added where the model
    has none) and loaded back (from_pretrained): how far the loaded model's logits are from its
    readout's input times its weight plus the checkpoint's bias."""
    import tempfile

    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(SEED)
    bias = 0.5 * torch.randn(V, generator=g)  # (V,)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        path = f"{folder}/model.safetensors"
        tensors = load_file(path)
        tensors["lm_head.bias"] = bias
        save_file(tensors, path, metadata={"format": "pt"})
        loaded = type(model).from_pretrained(folder).eval()
    seen: dict[str, torch.Tensor] = {}
    readout = loaded.get_output_embeddings()
    hook = readout.register_forward_pre_hook(lambda m, a: seen.__setitem__("h", a[0]))
    try:
        logits = _logits(loaded, _ids(V, 1, T))  # (1, T, V)
    finally:
        hook.remove()
    expected = seen["h"].double() @ readout.weight.double().T + bias.double()
    return (logits.double() - expected).abs().max().item()


@torch.no_grad()
def rotary_vs_declared(model: nn.Module, V: int, rotary_dim: int, T: int = 16) -> float:
    """How far the cos and sin tables the model's rotary embedding gives for positions 0..T-1
    are from RoPE over the first `rotary_dim` features of each head (the checkpoint's declared
    width; inverse frequencies theta^(-2i / rotary_dim), rotated halves) with the remaining
    features passed through (cos 1, sin 0). A table narrower than the head is that partial
    rotation (its features past the table are passed through)."""
    config = model.config
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or config.rope_theta
    head = config.head_dim
    x = torch.zeros(1, T, head)
    cos, sin = model.model.rotary_emb(x, torch.arange(T)[None])  # (1, T, width)
    width = cos.shape[-1]
    cos = torch.cat([cos[0].double(), torch.ones(T, head - width, dtype=torch.double)], -1)
    sin = torch.cat([sin[0].double(), torch.zeros(T, head - width, dtype=torch.double)], -1)
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.double) / rotary_dim)  # (R/2,)
    angles = torch.arange(T, dtype=torch.double)[:, None] * inv  # (T, R/2)
    rest = head - rotary_dim
    want_cos = torch.cat([angles.cos(), angles.cos(), torch.ones(T, rest, dtype=torch.double)], -1)
    want_sin = torch.cat([angles.sin(), angles.sin(), torch.zeros(T, rest, dtype=torch.double)], -1)
    return max((cos - want_cos).abs().max().item(), (sin - want_sin).abs().max().item())
