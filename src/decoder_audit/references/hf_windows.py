"""The sliding windows a Hugging Face config declares, layer by layer, in every form transformers
has written them (read from the config alone; transformers is never imported here):

    layer_types             5.x and 4.53+: "sliding_attention" layers read `sliding_window`
                            positions, "full_attention" (and any other kind) every earlier one;
    use_sliding_window      False turns the window off (Qwen2 and its kin), whatever the rest says;
    sliding_window_pattern  before layer_types (Gemma 3, Cohere 2): every pattern-th layer is
                            full, the others windowed;
    max_window_layers       before layer_types (Qwen2 with use_sliding_window): the layers from
                            this index on are windowed;
    Gemma 2                 before layer_types: the even layers are windowed, the odd ones full;
    attention_layers        GPT-Neo: its "local" layers read `window_size` positions;
    otherwise               `sliding_window` on every layer (Mistral, Phi-3, Starcoder2).

A window of W positions lets the query at position p read the keys at p' with p - p' < W (itself
and the W - 1 before it), as transformers' masks and decoder-audit's `DecoderConfig.window` count
it.
"""

from __future__ import annotations

from typing import Any

from .family_entry import takes


def text_config(config: Any) -> Any:
    """The config of the text model (a composite config's text part, `get_text_config`), or the
    config itself."""
    getter = getattr(config, "get_text_config", None)
    try:
        return getter() if callable(getter) else config
    except Exception:  # noqa: BLE001 - a composite config without a text part: use it whole
        return config


def layer_kinds(config: Any, family: str | None = None) -> list[str] | None:
    """The attention kind of each layer ("sliding_attention", "full_attention", ...) as the
    release's modeling code reads them, or None where the config names no kinds (then its
    `sliding_window`, if any, holds on every layer). `family` (the class's, e.g. "gemma2")
    defaults to the config's model_type. `layer_types` counts only where the config's class
    takes it: before 4.53, Gemma 2 windowed its even layers whatever the attribute said."""
    text = text_config(config)
    family = family or getattr(text, "model_type", None)
    layers = getattr(text, "num_hidden_layers", None)
    types = getattr(text, "layer_types", None)
    if types and (takes(type(text), "layer_types") or family not in _LEGACY):
        return list(types)
    if not isinstance(layers, int) or layers < 1:
        return None
    pattern = getattr(text, "sliding_window_pattern", None)
    first = getattr(text, "max_window_layers", None)
    if family == "gemma2":
        windowed = [not i % 2 for i in range(layers)]
    elif family in ("gemma3", "gemma3_text") or isinstance(pattern, int) and pattern > 0:
        windowed = [bool((i + 1) % (pattern or 6)) for i in range(layers)]
    elif getattr(text, "use_sliding_window", None) is True and isinstance(first, int):
        windowed = [i >= first for i in range(layers)]
    else:
        return None
    return ["sliding_attention" if slides else "full_attention" for slides in windowed]


# Families whose windowed layers a release before `layer_types` decided by a rule of its own.
_LEGACY = ("gemma2", "gemma3", "gemma3_text", "qwen2", "cohere2")


def window_size(config: Any) -> int | None:
    """The window `config` declares (its text config's sliding_window, GPT-Neo's window_size),
    whichever layers it is on; None without one."""
    text = text_config(config)
    size = getattr(text, "sliding_window", None)
    if size is None and "local" in (getattr(text, "attention_layers", None) or ()):
        size = getattr(text, "window_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None


def declared_windows(config: Any) -> tuple[int | None, ...] | None:
    """The window of each layer (None: full attention) that `config` declares, or None when it
    declares no window (no sliding_window, or one switched off). A window switched on and
    scoped to no layer (`_scoped`) gives every layer None: each is then held to full attention
    past that window."""
    text = text_config(config)
    window, layers = getattr(text, "sliding_window", None), getattr(text, "num_hidden_layers", None)
    kinds = getattr(text, "attention_layers", None)  # GPT-Neo: "local" layers of window_size
    if window is None and isinstance(kinds, (list, tuple)) and "local" in kinds:
        size = getattr(text, "window_size", None)
        return tuple(size if kind == "local" else None for kind in kinds) \
            if isinstance(size, int) and size >= 1 else None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1 \
            or not isinstance(layers, int) or layers < 1:
        return None
    if getattr(text, "use_sliding_window", True) is False:
        return None
    types = layer_kinds(text) or ["sliding_attention"] * layers
    found = tuple(window if kind == "sliding_attention" else None for kind in types)
    # A window switched on for no layer holds every layer to full attention only where the
    # config says per layer where it applies (Qwen2 and Qwen3: use_sliding_window with
    # max_window_layers). Elsewhere a kind not named "sliding_attention" may still be windowed
    # by its family (MiniMax windows its "full_attention" layers, DeepSeek-V4 its compressed
    # ones): nothing is declared then.
    if any(w is not None for w in found) or _scoped(text):
        return found
    return None


def _scoped(text: Any) -> bool:
    return (getattr(text, "use_sliding_window", None) is True
            and isinstance(getattr(text, "max_window_layers", None), int))
