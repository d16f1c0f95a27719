"""The symptoms of the museum's bugs, measured directly on the model, independently of the gate.

Each function takes a model and returns one figure: how far the model is from its definition
(0 for a correct model, up to float32 rounding). It runs inside a release's environment, so it
uses torch alone and calls the model the way that release's users do (`model(input_ids=...)`,
`.logits`, `.loss`); nothing here imports decoder_audit.

Shapes: B rows, T positions, V the vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEED = 1  # the probe ids; the weights are seeded by the builders


def _ids(V: int, B: int, T: int, low: int = 3) -> torch.Tensor:
    """Ids drawn away from the special ids (0, 1, 2: pad, bos, eos in the builders' configs)."""
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(low, V, (B, T), generator=g)  # (B, T)


def _logits(model: nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    out = model(input_ids=ids, **kwargs) if _takes_input_ids(model) else model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits  # (B, T, V)


def _takes_input_ids(model: nn.Module) -> bool:
    import inspect

    return "input_ids" in inspect.signature(model.forward).parameters


@torch.no_grad()
def future_leak(model: nn.Module, V: int, T: int = 12, cut: int = 6) -> float:
    """How far the logits at positions < cut move when every token from `cut` on changes: a
    causal model's earlier logits cannot move at all."""
    model.eval()
    ids = _ids(V, 2, T)
    changed = ids.clone()
    changed[:, cut:] = (ids[:, cut:] + 7 - 3) % (V - 3) + 3
    before, after = _logits(model, ids), _logits(model, changed)
    return (before[:, :cut] - after[:, :cut]).abs().max().item()


@torch.no_grad()
def window_read(model: nn.Module, V: int, window: int, T: int = 16) -> float:
    """How far the last logit moves when token 0 changes, in a one-layer model whose declared
    window (`window` keys, the query's own included) ends far before position 0: a windowed
    layer cannot read it."""
    model.eval()
    assert T - 1 >= window, "token 0 must lie outside the last position's window"
    ids = _ids(V, 1, T)
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 5 - 3) % (V - 3) + 3
    return (_logits(model, ids)[0, -1] - _logits(model, changed)[0, -1]).abs().max().item()


def full_layer_windowed(model: nn.Module, V: int, window: int, T: int = 16) -> float:
    """1 when a one-layer model whose config declares that layer full attention cannot read
    token 0 from its last position (a window was applied where none is declared), else 0."""
    return float(window_read(model, V, window, T) == 0.0)


@torch.no_grad()
def cached_vs_full(model: nn.Module, V: int, T: int = 16, prefill: int = 10, chunk: int = 1,
                   cache=None) -> float:
    """The largest difference between the logits of a prefill followed by cached steps of
    `chunk` tokens and the full forward at the same positions. `cache` names a cache the caller
    builds for T positions, as generate does ("hybrid": transformers' HybridCache), or is a
    function that builds one; None lets the model make its own."""
    model.eval()
    ids = _ids(V, 1, T)
    full = _logits(model, ids, use_cache=False)  # (1, T, V)
    kwargs = {"use_cache": True, "cache_position": torch.arange(prefill)}
    if cache is not None:
        kwargs["past_key_values"] = cache() if callable(cache) else _caller_cache(model, cache, T)
    out = model(input_ids=ids[:, :prefill], **kwargs)
    worst = (out.logits - full[:, :prefill]).abs().max().item()
    for t in range(prefill, T, chunk):
        span = torch.arange(t, min(t + chunk, T))
        out = model(input_ids=ids[:, span], past_key_values=out.past_key_values, use_cache=True,
                    cache_position=span)
        worst = max(worst, (out.logits - full[:, span]).abs().max().item())
    return worst


@torch.no_grad()
def padded_cached_vs_alone(model: nn.Module, V: int, pad: int = 2, prefill: int = 3,
                           T: int = 12, cache: str | None = None) -> float:
    """A row left-padded by `pad` pad tokens (masked out, positions counted from its first real
    token, as generate sends them) decoded through the cache, a prefill and one-token steps,
    against the same row alone on the same path: the largest difference of the logits of its
    real tokens. `cache` as in cached_vs_full (the caller's cache, sized for the row)."""
    model.eval()
    ids = _ids(V, 1, T)
    pad_id = model.config.pad_token_id or 0
    padded = torch.cat([torch.full((1, pad), pad_id), ids], 1)  # (1, pad + T)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, T, dtype=torch.long)],
                     1)  # (1, pad + T)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (1, pad + T)

    def decode(row, row_mask, row_positions, start):
        n = row.shape[1]
        kwargs = {"use_cache": True}
        if cache is not None:
            kwargs["past_key_values"] = _caller_cache(model, cache, n)
        logits = []
        for lo, hi in [(0, start)] + [(t, t + 1) for t in range(start, n)]:
            out = model(input_ids=row[:, lo:hi], attention_mask=row_mask[:, :hi],
                        position_ids=row_positions[:, lo:hi], cache_position=torch.arange(lo, hi),
                        **kwargs)
            kwargs["past_key_values"] = out.past_key_values
            logits.append(out.logits)
        return torch.cat(logits, 1)  # (1, n, V)

    alone = decode(ids, mask[:, pad:], positions[:, pad:], prefill)
    padded_out = decode(padded, mask, positions, pad + prefill)
    return (padded_out[:, pad:] - alone).abs().max().item()


def _caller_cache(model: nn.Module, kind: str, T: int):
    """The cache `generate` builds for a model whose layers mix windowed and full attention,
    sized for T positions, under the keyword names of the release that runs (batch_size became
    max_batch_size)."""
    import inspect

    import transformers

    if kind != "hybrid":
        raise ValueError(f"cache={kind!r}: only 'hybrid' is built here")
    params = inspect.signature(transformers.HybridCache.__init__).parameters
    batch = "max_batch_size" if "max_batch_size" in params else "batch_size"
    return transformers.HybridCache(config=model.config, max_cache_len=T, **{batch: 1})


@torch.no_grad()
def forward_raises(model: nn.Module, V: int, T: int = 16) -> float:
    """1 when the plain forward `model(input_ids=ids)` raises on T tokens (T within the
    model's declared max_position_embeddings), else 0."""
    model.eval()
    try:
        _logits(model, _ids(V, 1, T))
    except Exception:  # noqa: BLE001 - raising is the symptom measured
        return 1.0
    return 0.0


@torch.no_grad()
def packed_leak(model: nn.Module, V: int, doc: int = 6, use_cache: bool | None = None) -> float:
    """Two documents packed in one row, told apart by position ids alone (0..doc-1 twice, what
    DataCollatorWithFlattening sends): how far the second document's logits move when the first
    one changes. `use_cache` is passed when not None (None: the model's default)."""
    model.eval()
    ids = _ids(V, 1, 2 * doc)
    changed = ids.clone()
    changed[0, :doc] = (ids[0, :doc] + 7 - 3) % (V - 3) + 3
    positions = torch.arange(doc).repeat(2)[None]  # (1, 2 doc)
    kwargs = {"position_ids": positions}
    if use_cache is not None:
        kwargs["use_cache"] = use_cache
    moved = _logits(model, ids, **kwargs) - _logits(model, changed, **kwargs)
    return moved[0, doc:].abs().max().item()


@torch.no_grad()
def litgpt_cached_vs_full(model: nn.Module, V: int, T: int = 16, prefill: int = 3) -> float:
    """litgpt's cached decoding (set_kv_cache, then forward(idx, input_pos)) against its full
    forward: the largest logit difference over a prefill and one-token steps."""
    model.eval()
    ids = _ids(V, 1, T)
    full = model(ids)  # (1, T, V)
    model.set_kv_cache(batch_size=1)
    worst = (model(ids[:, :prefill], input_pos=torch.arange(prefill)) - full[:, :prefill]).abs().max()
    for t in range(prefill, T):
        step = model(ids[:, t:t + 1], input_pos=torch.tensor([t]))
        worst = max(worst, (step[:, -1] - full[:, t]).abs().max())
    model.clear_kv_cache()
    return float(worst)


@torch.no_grad()
def lens_cached_vs_full(model: nn.Module, V: int, T: int = 16, prefill: int = 6) -> float:
    """TransformerLens' cached decoding (a HookedTransformerKeyValueCache passed as
    past_kv_cache) against its full forward: the largest logit difference over a prefill and
    one-token steps."""
    from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache

    model.eval()
    ids = _ids(V, 1, T)
    full = model(ids)  # (1, T, V)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
    # with a cache the model asks its tokenizer for pads unless it is told: a model built from
    # its config has none, so the (all-real) mask is given
    first = ids[:, :prefill]
    worst = (model(first, past_kv_cache=cache, attention_mask=torch.ones_like(first))
             - full[:, :prefill]).abs().max()
    for t in range(prefill, T):
        step = model(ids[:, t:t + 1], past_kv_cache=cache,
                     attention_mask=torch.ones_like(ids[:, t:t + 1]))
        worst = max(worst, (step[:, -1] - full[:, t]).abs().max())
    return float(worst)


@torch.no_grad()
def softcap_dropped(model: nn.Module, V: int, T: int = 12, scale: float = 30.0) -> float:
    """How far the default attention path's logits are from the eager path's (which applies
    config.attn_logit_softcapping) once the query and key weights are scaled up so that scores
    reach the cap: 0 when the default path caps too. Runs on a copy of the model."""
    import copy

    probe = copy.deepcopy(model).eval()
    for name, p in probe.named_parameters():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            p.mul_(scale)
    ids = _ids(V, 1, T)
    default = _logits(probe, ids, use_cache=False)
    probe.config._attn_implementation = "eager"
    return (default - _logits(probe, ids, use_cache=False)).abs().max().item()


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


def next_token_ce(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
                  ) -> torch.Tensor:
    """Cross entropy of the next token, written from its definition: the logits at t predict
    labels[t + 1]; labels of -100 are left out."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction=reduction)


@torch.no_grad()
def loss_with_items(model: nn.Module, V: int, T: int = 12, items: int = 7) -> float:
    """|loss - sum of token losses / num_items_in_batch| for a labels= call given
    `num_items_in_batch`, as the Trainer passes it under gradient accumulation."""
    model.eval()
    ids = _ids(V, 2, T)
    labels = ids.clone()
    labels[0, :3] = -100
    total = next_token_ce(_logits(model, ids), labels, reduction="sum")
    loss = model(input_ids=ids, labels=labels, num_items_in_batch=items).loss
    return abs(loss.item() - total.item() / items)


@torch.no_grad()
def loss_with_shift_labels(model: nn.Module, V: int, T: int = 12) -> float:
    """|loss - cross entropy against shift_labels| for a call given pre-shifted targets
    (shift_labels[t] is the target of position t, as sequence-parallel training sends them)."""
    model.eval()
    ids = _ids(V, 2, T)
    shifted = torch.full_like(ids, -100)
    shifted[:, :-1] = torch.flip(ids, [1])[:, :-1]  # targets unlike ids[t + 1]
    logits = _logits(model, ids)
    expected = F.cross_entropy(logits.reshape(-1, V).float(), shifted.reshape(-1),
                               ignore_index=-100)
    loss = model(input_ids=ids, labels=ids, shift_labels=shifted).loss
    return abs(loss.item() - expected.item())


@torch.no_grad()
def loss_with_labels(model: nn.Module, V: int, T: int = 12) -> float:
    """|loss - next-token cross entropy| for a plain labels= call with some labels ignored."""
    model.eval()
    ids = _ids(V, 2, T)
    labels = ids.clone()
    labels[0, :3] = -100
    loss = model(input_ids=ids, labels=labels).loss
    return abs(loss.item() - next_token_ce(_logits(model, ids), labels).item())


def dead_gradients(model: nn.Module, V: int, T: int = 12) -> float:
    """How many trainable parameters get no gradient (None or all zeros) from the next-token
    loss on random ids."""
    model.train()
    model.zero_grad(set_to_none=True)
    ids = _ids(V, 2, T)
    next_token_ce(_logits(model, ids), ids).backward()
    dead = [n for n, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    model.zero_grad(set_to_none=True)
    return float(len(dead))


SYMPTOMS = {f.__name__: f for f in (future_leak, window_read, full_layer_windowed, cached_vs_full, forward_raises,
                                    packed_leak, softcap_dropped, litgpt_cached_vs_full, lens_cached_vs_full,
                                    loss_with_items,
                                    loss_with_shift_labels, loss_with_labels, dead_gradients,
                                    aux_loss_gradient, attention_vs_definition,
                                    routed_outside_groups, checkpoint_readout_bias,
                                    rotary_vs_declared, padded_cached_vs_alone)}
