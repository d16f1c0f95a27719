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

from . import numerics
from .calls import ids as _ids
from .calls import logits as _logits


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


SYMPTOMS = {f.__name__: f for f in (
    future_leak, window_read, full_layer_windowed, cached_vs_full, padded_cached_vs_alone,
    forward_raises, packed_leak, softcap_dropped, litgpt_cached_vs_full, lens_cached_vs_full,
    loss_with_items, loss_with_shift_labels, loss_with_labels, dead_gradients,
    numerics.aux_loss_gradient, numerics.attention_vs_definition, numerics.routed_outside_groups,
    numerics.checkpoint_readout_bias, numerics.rotary_vs_declared)}
