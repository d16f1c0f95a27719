"""The Hugging Face families whose config is read as a spec, in one table: `FAMILIES`, one entry
(`family_entry.Family`) per family, saying what its decoder changes relative to Llama's block,
read by one reader (`hf_config.config_from_hf`), placed by one layout table
(`layout_table.LAYOUTS`), written back by one writer (`hf_families.hf_model_for`). The entries
are written in their groups' modules, beside the functions they read fields through:

    families_llama.py    Llama's block under other names (Llama, Mistral, Qwen2, Gemma, ...)
    families_gpt.py      GPT-style blocks (GPT-2, GPT-NeoX, GPT-J, OPT, Falcon, ...) and other
                         positions and norm placements (BLOOM, MPT, XGLM, GPT-1, Persimmon)
    families_routed.py   Llama's attention before routed experts (Mixtral, Qwen-MoE, GLM-4.5,
                         GPT-OSS, Cohere 2 MoE, ...)
    families_latent.py   DeepSeek's latent attention (DeepSeek V2 / V3, MiniCPM3, ...)

and the families left black-box, with what they lack, in family_black_box.py. Nothing here
imports transformers: the classes are named, and looked up in the release at hand (`present`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .families_gpt import GPT2, GPT_NEOX, GPT_STYLE, POSITION_FAMILIES
from .families_llama import (CONVERTER_LLAMAS, HUNYUAN_DENSE, LLAMA_DERIVED, LLAMA_NAMED,
                             SCALED_DENSE)
from .families_latent import DEEPSEEK, LATENT_DERIVED
from .families_routed import GPT_OSS, HUNYUAN_MOE, ROUTED, ROUTED_DERIVED, WINDOWED_ROUTED
from .family_entry import Family

FAMILIES: tuple[Family, ...] = (
    GPT2, *CONVERTER_LLAMAS,  # the converter's (rename tables; Llama's RoPE rows permuted)
    *LLAMA_DERIVED, GPT_NEOX,  # the first the layouts placed (rotate-half RoPE kept)
    *ROUTED, *DEEPSEEK,
    *GPT_STYLE,
    *ROUTED_DERIVED, *LATENT_DERIVED,
    *LLAMA_NAMED,
    *POSITION_FAMILIES,
    # sinks, the clamped SwiGLU, biased routers and experts, q/k norms after RoPE,
    # position-scaled queries
    GPT_OSS, HUNYUAN_DENSE, HUNYUAN_MOE, *SCALED_DENSE, *WINDOWED_ROUTED,
)
"""Every family read as a spec, in the order the writer tries them: where two families read
back the same DecoderConfig the first is written (Mistral before Phi-3 and Qwen2 for a plain
grouped-query Llama with a window)."""

BY_TYPE: Mapping[str, Family] = MappingProxyType({f.model_type: f for f in FAMILIES})
# class name -> the first family (in the table's order) whose class it is
BY_CLASS: Mapping[str, Family] = MappingProxyType(
    {f.model_class: f for f in reversed(FAMILIES)})


def family(model_type: str) -> Family | None:
    """The entry of a model_type (a family's own), or None."""
    return BY_TYPE.get(model_type)


def present(module: Any, *, converter: bool | None = None) -> dict[str, type]:
    """model_type -> class for each family whose class the transformers module `module` has
    (a release lacks Qwen3 before 4.51, Gemma 3 before 4.50, OLMo 2 before 4.47): every family,
    or only the converter's (converter=True) or only the layouts' (False)."""
    found = {}
    for entry in FAMILIES:
        if converter is not None and entry.converter != converter:
            continue
        cls = getattr(module, entry.model_class, None)  # a lazy module: AttributeError -> None
        if cls is not None:
            found[entry.model_type] = cls
    return found

