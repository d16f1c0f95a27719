"""What a test needs to build Hugging Face models on every transformers release the project
supports (docs/transformers-range.md), keyed on what the release's classes have, never on a
version string:

    cls = hf_class("Qwen3ForCausalLM")            # skips the test where the release lacks it
    tf.LlamaConfig(**rope_kwargs(tf.LlamaConfig, {"rope_type": "yarn", "factor": 4.0, ...}))
    tf.Gemma2Config(**layer_kwargs(tf.Gemma2Config, ["sliding_attention", "full_attention"]))

A test writes its RoPE as transformers 5's `rope_parameters` and its windowed layers as
`layer_types`; on a release whose config class holds them otherwise they are written in that
release's form (transformers 4's rope_theta beside rope_scaling; a family's own rule for its
windowed layers), or the test is skipped saying the release cannot express them.
"""

from __future__ import annotations

from typing import Any

import pytest

from decoder_audit.references.family_entry import takes
from decoder_audit.references.hf_rope import holds_rope_parameters


def hf_class(name: str) -> type:
    """transformers.<name>, or the test is skipped naming the class and the release (Qwen3
    before 4.51, Gemma 3 before 4.50, OLMo 2 before 4.47)."""
    tf = pytest.importorskip("transformers")
    cls = getattr(tf, name, None)
    if not isinstance(cls, type):
        pytest.skip(f"transformers {tf.__version__} has no {name}")
    return cls


def deepseek_class(name: str) -> type:
    """transformers.<name> of a DeepSeek family, or the test is skipped: a release without it,
    or one of transformers 4, whose DeepSeek models are audited black-box
    (hf_config._deepseek_config reads transformers 5's form only)."""
    from decoder_audit.references.hf_rope import holds_rope_parameters

    cls = hf_class(name)
    config_class = getattr(cls, "config_class", cls)
    if not holds_rope_parameters(config_class):
        pytest.skip(f"{name} of transformers {pytest.importorskip('transformers').__version__}: "
                    "DeepSeek is read as a spec in transformers 5's form only")
    return cls


def skip_unless_it_runs(model: Any) -> Any:
    """`model`, or the test is skipped when its own forward raises on two tokens (DeepSeek-V2 of
    transformers 5.0 reads a num_experts its MoE block never set): the release's bug, found on
    the model, not a fact about the gate."""
    import torch

    try:
        with torch.no_grad():
            model(torch.zeros(1, 2, dtype=torch.long))
    except Exception as exc:  # noqa: BLE001 - any failure of its own forward
        version = pytest.importorskip("transformers").__version__
        pytest.skip(f"{type(model).__name__} of transformers {version} raises in its own "
                    f"forward: {type(exc).__name__}: {exc}")
    return model


def rope_kwargs(config_class: type, rope_parameters: dict[str, Any], *,
                legacy_key: str = "rope_type") -> dict[str, Any]:
    """Config arguments for `rope_parameters` (transformers 5's form; Gemma 3's keyed by layer
    type) in the form `config_class` takes. transformers 4: flat rope_theta (GPT-NeoX:
    rotary_emb_base) and partial_rotary_factor (GPT-NeoX: rotary_pct), the scaling in
    rope_scaling under `legacy_key` ("rope_type", or the older "type"), and Gemma 3's windowed
    layers' base in rope_local_base_freq."""
    if holds_rope_parameters(config_class):
        if "partial_rotary_factor" in rope_parameters and getattr(
                config_class, "model_type", "") == "gpt_neox":
            # 5.0-5.4 overwrite rope_parameters' factor with rotary_pct (default 0.25)
            return {"rope_parameters": rope_parameters,
                    "rotary_pct": rope_parameters["partial_rotary_factor"]}
        return {"rope_parameters": rope_parameters}
    local = None
    if "full_attention" in rope_parameters:
        local = rope_parameters["sliding_attention"]["rope_theta"]
        rope_parameters = rope_parameters["full_attention"]
    scaling = dict(rope_parameters)
    theta, partial = scaling.pop("rope_theta"), scaling.pop("partial_rotary_factor", None)
    kind = scaling.pop("rope_type", "default")
    neox = takes(config_class, "rotary_pct")
    out: dict[str, Any] = {"rotary_emb_base" if neox else "rope_theta": theta}
    if partial is not None:
        if not takes(config_class, "partial_rotary_factor") and not neox:
            pytest.skip(f"{config_class.__name__} of this release has no partial_rotary_factor")
        out["rotary_pct" if neox else "partial_rotary_factor"] = partial
    if kind != "default":
        out["rope_scaling"] = {legacy_key: kind, **scaling}
    if local is not None:
        out["rope_local_base_freq"] = local
    return out


def layer_kwargs(config_class: type, layer_types: list[str], **legacy: Any) -> dict[str, Any]:
    """`layer_types` where `config_class` takes it; else `legacy`, the arguments the test says
    give the same layers by the family's own rule (Gemma 3: sliding_window_pattern=2 windows
    layer 0 of 2), or nothing (Gemma 2: its rule windows the even layers, which the test's
    layer_types must then be); a test giving neither is skipped."""
    if takes(config_class, "layer_types"):
        return {"layer_types": layer_types}
    if legacy:
        return legacy
    even = ["full_attention" if i % 2 else "sliding_attention" for i in range(len(layer_types))]
    if "gemma2" in getattr(config_class, "model_type", "") and layer_types == even:
        return {}
    pytest.skip(f"{config_class.__name__} of this release takes no layer_types, and its own "
                f"rule does not give {layer_types}")


def release_bugs(model: Any) -> dict[str, str]:
    """{check: the release's bug} for the checks a correct model of this family fails on its
    release by transformers' own code, each found on the model itself (never from a version):
    - a Gemma 2 or 3 whose config names cache_implementation="hybrid" (before 4.53) is stepped
      through the HybridCache `generate` builds, which mishandles a chunk of several tokens
      after the first call (its windowed layers' rolling buffer is sliced for one token) and,
      before 4.50, left pads;
    - a model whose own cache raises on a chunk of two tokens after one (StableLM in 5.0);
    - a YaRN model whose frequencies follow max_position_embeddings although the config gives
      its factor and original length (4.51-4.55 replaced the factor by their ratio);
    - a model whose forward takes num_items_in_batch and ignores it (GPT-NeoX, 4.48);
    - a routed model whose routers return softmax probabilities as their logits, which the
      load-balancing loss softmaxes again (transformers#45120: Mixtral, Qwen2-MoE, OLMoE and
      the families generated from them, 5.0 to 5.5)."""
    bugs = {}
    config = getattr(model, "config", None)
    if getattr(config, "cache_implementation", None) == "hybrid":
        bugs["kv_cache"] = "HybridCache: a chunk of tokens after the first call"
        bugs["padding"] = "HybridCache: left pads through the cache (before 4.50)"
    elif not _steps_a_chunk(model):
        bugs["kv_cache"] = "its own cache raises on a chunk of tokens after the first call"
    elif _sliding_cache_chunks_wrong(model):
        bugs["kv_cache"] = ("SlidingWindowCache/HybridCache: a chunk of tokens after the first "
                            "call (transformers#40893, before 4.57)")
    if _yarn_factor_replaced(model):
        bugs["oracle"] = "YaRN's factor replaced by max_position_embeddings / original"
    if _ignores_num_items(model):
        bugs["model_loss"] = "its forward takes num_items_in_batch and ignores it"
    if _router_logits_softmaxed(model):
        bugs["router_aux_loss"] = ("its routers return probabilities as router_logits, "
                                   "softmaxed again by the load-balancing loss (#45120)")
    return bugs


def _router_logits_softmaxed(model: Any) -> bool:
    """Whether the router_logits a forward returns are distributions (each row non-negative and
    summing to 1), which no router's raw logits are."""
    import torch

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "output_router_logits"):
        return False
    ids = torch.zeros(1, 4, dtype=torch.long)
    copy = __import__("copy").deepcopy(model)  # transformers hooks its recorders on first use
    try:
        with torch.no_grad():
            logits = copy(input_ids=ids, output_router_logits=True).router_logits
    except (TypeError, AttributeError):
        return False
    if not logits:
        return False
    first = logits[0].float()
    return bool((first >= 0).all() and torch.allclose(first.sum(-1), torch.ones(1), atol=1e-4))


def _ignores_num_items(model: Any) -> bool:
    """Whether the loss is the same given num_items_in_batch = 1 and = 1000 (GPT-NeoX in 4.48
    took it through **kwargs, 'unused for now': the gradient-accumulation bug)."""
    import torch

    ids = torch.zeros(1, 4, dtype=torch.long)
    try:
        with torch.no_grad():
            losses = [model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(count)).loss
                      for count in (1, 1000)]
    except TypeError:  # not taken at all: model_loss does not ask
        return False
    return bool(torch.equal(losses[0], losses[1]))


def _steps_a_chunk(model: Any) -> bool:
    import torch

    ids = torch.zeros(1, 3, dtype=torch.long)
    try:
        with torch.no_grad():
            first = model(ids[:, :1], use_cache=True)
            model(ids[:, 1:], past_key_values=first.past_key_values, use_cache=True)
    except RuntimeError:
        return False
    return True


def _sliding_cache_chunks_wrong(model: Any) -> bool:
    """Whether a windowed cache a caller builds (SlidingWindowCache, HybridCache: a static
    sliding layer) decodes chunks of three tokens after a one-token prefill, past the window,
    differently from the full forward or raises on them (before 4.57 such a layer took one
    token at a time)."""
    from museum.symptoms import cached_vs_full

    from decoder_audit.references.hf_caches import caller_caches
    from decoder_audit.references.hf_windows import declared_windows

    windows = [w for w in declared_windows(model.config) or () if w is not None]
    if not windows:
        return False
    length = min(2 * min(windows) + 2, getattr(model.config, "max_position_embeddings", 64))
    for label, build in caller_caches(model, 1, length)[0]:
        if not label.startswith(("SlidingWindowCache", "HybridCache")):
            continue
        try:
            moved = cached_vs_full(model, model.config.vocab_size, T=length, prefill=1, chunk=3,
                                   cache=build)
        except (RuntimeError, IndexError):  # 4.56: the chunk overruns the sliding slots
            return True
        if not moved <= 1e-4:
            return True
    return False


def _yarn_factor_replaced(model: Any) -> bool:
    """Whether the release's YaRN frequencies for this config change with max_position_embeddings
    alone (they must not when factor and original_max_position_embeddings are given)."""
    import copy

    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope = getattr(model.config, "rope_parameters", None) or getattr(model.config, "rope_scaling",
                                                                     None) or {}
    if rotary is None or rope.get("rope_type", rope.get("type")) != "yarn":
        return False
    longer = copy.deepcopy(model.config)
    longer.max_position_embeddings *= 2
    return not bool((type(rotary)(config=longer).inv_freq == rotary.inv_freq).all())


def written_rope(config: Any) -> dict[str, Any]:
    """A config's RoPE as transformers 5's rope_parameters, read from whichever form its release
    wrote (4.x: rope_theta beside rope_scaling, whose `type` key is rope_type)."""
    if holds_rope_parameters(type(config)):
        return dict(config.rope_parameters)
    rope = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})
    rope.setdefault("rope_type", rope.pop("type", None))
    return {**rope, "rope_theta": config.rope_theta}


def yarn_bug(config_class: type) -> str | None:
    """Why this release's YaRN frequencies are not YaRN's of its config, or None: given factor
    and original_max_position_embeddings, they must not change with max_position_embeddings;
    4.45-4.50 ignored original_max_position_embeddings (taking max_position_embeddings) and
    4.51-4.55 replaced the factor by max_position_embeddings / original."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "rope_theta": 1e4}
    frequencies = []
    for length in (256, 1024):
        config = config_class(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                              max_position_embeddings=length, **rope_kwargs(config_class, rope))
        frequencies.append(ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")[0])
    if bool((frequencies[0] == frequencies[1]).all()):
        return None
    return ("this release's YaRN frequencies follow max_position_embeddings although the config "
            "gives factor and original_max_position_embeddings")
