"""The entry of a Hugging Face family whose config is read as a spec (`families.FAMILIES` holds
them all): what the family's decoder changes relative to Llama's block, read by one reader
(`hf_config.config_from_hf`), placed by one layout table (`layout_table.LAYOUTS`), written back
by one writer (`hf_families.hf_model_for`). Here: `Family`, `llama()` (an entry written as its
diff from Llama), Llama's defaults, the activation tables several groups share, and `takes`.

An entry is data, as litgpt's `config.py` writes every model and transformers' `modular_*.py`
write a family as its diff from Llama:

    Family("qwen3", "Qwen3ForCausalLM", fixed={"qk_norm": True})

says that Qwen3's decoder is Llama's with a per-head RMSNorm of q and k, and that its config's
sliding window applies. The reader starts from Llama's block (RMSNorm, a SiLU-gated MLP, RoPE on
rotated halves, no biases unless `attention_bias` / `mlp_bias` say so), then takes

    fixed        DecoderConfig fields the family's modules always compute with, whatever the
                 config says (OLMo's norms learn nothing: norm_affine=False);
    read         DecoderConfig fields read from the config: the attribute that holds each (a
                 name, or names tried in order until one is set), or a function of the config
                 where the family derives it (Gemma's embedding scale sqrt(D)); a RoPE field
                 read here (Granite SWA's per-layer bases) takes the place of the RoPE reader's
                 where it is not None;
    activations  the config's activation names the family's MLP computes, each as our `mlp`;
    refused      config attributes the family's modules read that no DecoderConfig expresses,
                 each with why: set (truthy), the config is refused naming it, and the model is
                 audited black-box, never against a spec that leaves the option out;
    experts      how its routed experts are declared (a label of the router's form:
                 "mixtral", "qwen_moe", "olmoe", "deepseek_v3", ..., or None for a dense MLP;
                 the router's fields themselves are `fixed` and `read`, but for a latent
                 block, whose "deepseek_v3" / "deepseek_v2" router `hf_latent` reads);
                 `block` the reader of a block unlike Llama's ("gpt2", "gpt_neox", "latent":
                 DeepSeek's latent attention, before routed experts or dense MLPs);
    rope_config  False where its modules fix RoPE and the entry says it (GPT-J's base 10000);
    layout       the layout its weights lie in where the names alone do not tell it
                 (GPT-BigCode's c_attn: GPT-2's name and shape, its rows by KV group).

Adding a family is one entry in its group's module (families_llama.py, families_gpt.py,
families_routed.py, families_latent.py), a correct tiny model that passes and a planted defect
that fails (tests/references/test_families.py walks the table). Nothing here imports
transformers: the classes are named, and looked up in the release at hand
(`families.present`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


Source = str | tuple[str, ...] | Callable[[Any], Any]
"""Where a DecoderConfig field's value lies in a family's config: an attribute, attributes
tried in order (the first that is set), or a function of the config."""

# Llama's block as its config declares it: the fields every Llama-derived family reads the same
LLAMA_READ: Mapping[str, Source] = MappingProxyType({
    "norm_eps": "rms_norm_eps", "attn_bias": "attention_bias", "mlp_bias": "mlp_bias"})
LLAMA_FIXED: Mapping[str, Any] = MappingProxyType({"norm": "rmsnorm", "pos": "rope"})
SILU_GATED = MappingProxyType({"silu": "swiglu"})
# Gemma's gate: tanh GELU (gelu_new is the same function written out)
TANH_GATED = MappingProxyType({"gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"})
# Non-gated MLPs down(act(up x)): the activation names transformers' ACT2FN computes, each as our
# `mlp` (gelu_pytorch_tanh, gelu_new and gelu_fast are the tanh approximation written three ways;
# the writer names an activation by the first of its names here)
PLAIN_ACTIVATIONS = MappingProxyType({
    "relu2": "relu2", "relu": "relu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"})
# A refusal several families share: OLMo's and OLMoE's clip_qkv (MPT's in its attn_config)
CLIPPED = ("clip_qkv", "q, k and v clamped to [-clip_qkv, clip_qkv]: not expressed")


@dataclass(frozen=True)
class Family:
    """One family: its config's model_type, its causal-LM class, and what its decoder changes
    relative to Llama's block (see the module docstring for each field)."""

    model_type: str
    model_class: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    read: Mapping[str, Source] = field(default_factory=dict)
    activation: tuple[str, ...] = ("hidden_act",)
    """The config attributes naming the activation, tried in order (the first that is set)."""
    activations: Mapping[str, str] = field(default_factory=lambda: SILU_GATED)
    partial_rotary: bool = False
    """Its attention rotates only the first partial_rotary_factor of each head's features
    (Llama's rotates them all, so a Llama config with a factor is refused)."""
    windows: bool = True
    """The config's sliding window (sliding_window, layer_types) is read as declared: the
    family's attention applies it, or a window it declares and ignores is a defect to find."""
    experts: str | None = None
    """How its routed experts are declared: "mixtral", "qwen_moe", "olmoe", "deepseek_v3",
    "deepseek_v2", "ernie", "kolibri", "gpt_oss", "hunyuan", "granitemoe", "cohere2_moe"
    (the router's form, a label: its fields are `fixed` and `read`, but in a latent block,
    where "deepseek_v3" / "deepseek_v2" choose `hf_latent`'s reading), None for a dense MLP."""
    refused: tuple[tuple, ...] = ()
    """(config attribute, why[, rule]): the option the family's modules read and no
    DecoderConfig expresses, refused where rule(value) holds (default: the value is truthy)."""
    grouped: bool = True
    """Its attention reads num_key_value_heads and head_dim (grouped-query heads of their own
    width); False: every head is D / H wide with its own keys and values, whatever the config
    carries (GPT-2, GPT-NeoX)."""
    block: str = "llama"
    converter: bool = False
    """Written by the converter's rename tables (GPT-2, Llama, Mistral: `hf_weights`), whose
    Llama path permutes RoPE rows into our interleaved pairs; every other family is written by
    `hf_families` with its own layout kept."""
    write: Callable[[Any, type], dict[str, Any]] | None = None
    """The config fields for what the entry reads through a function of the config, from a
    DecoderConfig and the config class (the inverse of those functions, for the writer); a dict
    it gives for a field the writer fills too (rope_parameters) adds the keys that one lacks."""
    layout_written: bool = True
    """Written by `hf_families` with the layouts (False: only the rename tables write it,
    GPT-2 and a plain Llama; Mistral is both, the tables for a windowless config)."""
    legacy_rope: Mapping[str, str] = field(default_factory=dict)
    """transformers 4's names for RoPE fields this family spelled its own way (rope_theta,
    partial_rotary_factor, window_rope_theta: the windowed layers' base)."""
    rope_config: bool = True
    """Its RoPE is read from the config's RoPE fields (rope_parameters, or rope_theta and
    rope_scaling); False: its modules fix the base and the entry fixes or reads every RoPE
    field itself (GPT-J and CodeGen: base 10000, never scaled, rotary_dim features)."""
    layout: str | None = None
    """The name of the layout (`layout_table.LAYOUTS`) its weights lie in, where the names alone do
    not tell it from another's (GPT-BigCode's c_attn is GPT-2's name and shape, its rows in
    another order); None: detected from the names."""
    rope_form: Callable[[dict, Any], dict] | None = None
    """The family's own RoPE form rewritten as a standard one before it is read: (the config's
    rope_parameters, the config) -> rope_parameters (Hunyuan's "dynamic" with an alpha is a
    static base, NTK-stretched once)."""

    def fixes(self) -> dict[str, Any]:
        """Every field the family fixes: Llama's (for a Llama-derived block), then its own."""
        return {**(LLAMA_FIXED if self.block == "llama" else {}), **self.fixed}

    def reads(self) -> dict[str, Source]:
        """Every field read from the config: Llama's (for a Llama-derived block), then the
        family's own."""
        return {**(LLAMA_READ if self.block == "llama" else {}), **self.read}


def takes(config_class: type, field: str) -> bool:
    """Whether this release's config class takes `field` as an argument of its own: a field it
    does not take is an attribute its modeling code ignores (Gemma 2's `layer_types` before
    4.53, whose windowed layers are the even ones whatever the attribute says; Phi-3's
    `partial_rotary_factor` before 4.49)."""
    try:
        return field in inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return False


def llama(model_type: str, model_class: str, **changes: Any) -> Family:
    """A family written as its diff from Llama's block."""
    return Family(model_type, model_class, **changes)
