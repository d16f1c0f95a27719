"""The conformance sweep: every Hugging Face causal-LM family that builds from a small config,
audited by the gate.

    python tests/conformance.py --write-docs        # the full sweep -> docs/conformance.md
    python tests/conformance.py llama gpt2 falcon   # a few families, printed
    python tests/conformance.py --cached --write-docs   # the last full sweep, judged again
    python tests/conformance.py llama --write-docs  # llama swept again, its row merged in

Only --write-docs writes a tracked file. The rows of the last full sweep are kept in
build/conformance_rows.json (gitignored); --write-docs with a few families sweeps those, puts
their rows in place of the cached ones (the other families' rows are kept), writes the page from
all of them and keeps the merged rows as the cache. Without a cached full sweep there is nothing
to merge into, and that is refused (the page would lose every other family).

`tests/gate/test_conformance.py` runs a representative subset of the same sweep in the default test
run (and the whole of it with DA_CONFORMANCE=all).

Each family is built from its config class's defaults with every size shrunk (`tiny_config`):
V = 99, D = 32, two layers, four query heads over two KV heads, head width 8, FFN 48, small
expert counts and low ranks, token ids clamped into the vocabulary. A family whose config
validators want more (a layer of each kind of a hybrid, a ratio between widths) is retried with
the next attempt of `ATTEMPTS`, and a few need a field of their own (`FAMILY_OVERRIDES`). A
family that still does not build, or needs an optional library or weights we do not have, is
listed as skipped with the reason. Weights are the family's own random initialisation (seed 0).

The gate is then run as a user would run it on that model, `da.audit(model)`: it reads V, the
input vocabulary, the pad id and the length policy from the model itself (a learned position
table is a hard limit; rotary, relative and recurrent positions are audited with
max_seq_len=None), and the row checks they are what `references.hf_models.audit_facts` reads;
nothing else is told. `EXPECTED` lists the families whose verdict is a genuine failure, with the check
that must fire and the words its message must contain.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "conformance.md"
CACHE = REPO / "build" / "conformance_rows.json"  # the last full sweep's rows (--cached)

V = 99
# Lengths of the behavioural checks in the sweep. The gate's default is 64; 24 positions cover
# every layer kind of these two- to four-layer models (sliding windows are shrunk to 8 below,
# so a window boundary is crossed) at a third of the cost.
INTERVENTION_LEN = 24
MAX_PARAMETERS = 2_000_000  # a "tiny" model above this was not shrunk: listed as skipped

# Every config field here, when the family's config has it, is set to this value.
SMALL: dict[str, Any] = dict(
    vocab_size=V, hidden_size=32, d_model=32, n_embd=32, embed_dim=32, dim=32, emb_dim=32,
    num_hidden_layers=2, n_layer=2, num_layers=2, n_layers=2,
    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=48, decoder_ffn_dim=48,
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=48, n_inner=48, ffn_dim=48, d_ff=48, dff=48, dim_ff=48,
    ffn_hidden_size=48, max_position_embeddings=64, n_positions=64, n_ctx=64, max_seq_len=64,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=16, n_shared_experts=1,
    moe_num_experts=4, moe_k=2, moe_topk=2, expert_ffn_hidden_size=16,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    qk_head_dim=16, rotary_dim=4, rotary_emb_dim=4, dim_head=8,
    sliding_window=8, sliding_window_size=8, window_size=8, attention_window_size=8,
    mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, mamba_chunk_size=16,
    mamba_expand=2, mamba_n_groups=1, ssm_state_size=16, state_size=16,
)
# A first forward of (2, 5) ids slower than this means the shrink missed a size (or the family
# runs a slow reference kernel): the next attempt shrinks more, the last gives up. Measured in
# CPU seconds of this process, not wall time, so that a loaded machine builds the same models.
MAX_FIRST_FORWARD_S = 2.0
# Integer fields whose name looks like a width get shrunk in the second attempt.
_WIDTH = re.compile(r"(dim|size|rank|width|inner|channels|hidden|_ff|ff_|heads)")
_NOT_WIDTH = re.compile(r"(vocab|position|window|max_|length|chunk|bucket|distance|token|topk|"
                        r"batch|extent|floor|multiple|rope|theta|seed|group|interval|period)")
# Attempts, in order: (name, shrink other widths, layer count or None).
ATTEMPTS = (("sizes", False, None), ("widths", True, None), ("3 layers", True, 3),
            ("4 layers", True, 4), ("8 layers", True, 8))

# Fields a family needs beyond the generic shrink (its validators tie widths together).
FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"num_heads": 8, "head_dim": 8, "expand": 2, "n_groups": 1},
    "bamba": {"mamba_n_heads": 8, "mamba_d_head": 8, "mamba_expand": 2, "mamba_n_groups": 1},
    "granitemoehybrid": {"mamba_n_heads": 8, "mamba_d_head": 8, "mamba_expand": 2,
                         "mamba_n_groups": 1},
    "zaya": {"num_experts_per_tok": 1},
    "dots3_note_text": {"num_key_value_heads": 4},
    "moshi": {"ffn_dim": 48},
    "reformer": {"is_decoder": True, "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16],
                 "attn_layers": ["local", "lsh"], "max_position_embeddings": 64},
    "xlnet": {"mem_len": None},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    "longcat_flash": {"zero_expert_num": 2},
    # ---- routed families (helper fam-moe): what each changes, exercised at tiny size ----
    "dots1": {"n_group": 2, "topk_group": 1},  # group-limited routing: 2 groups of 2 experts
    "glm4_moe": {"routed_scaling_factor": 2.5},
    "minimax_m2": {"rotary_dim": 4},  # half of each 8-wide head rotated
    "mellum": {"layer_types": ["sliding_attention", "full_attention"],
               "mlp_layer_types": ["dense", "sparse"]},
    "granitemoe": {"embedding_multiplier": 12.0, "attention_multiplier": 0.25,
                   "residual_multiplier": 0.22, "logits_scaling": 6.0},
    "granitemoeshared": {"embedding_multiplier": 12.0, "attention_multiplier": 0.25,
                         "residual_multiplier": 0.22, "logits_scaling": 6.0,
                         "shared_intermediate_size": 16},
    "exaone_moe": {"sliding_window_pattern": 2},  # layer 1 full, and so without RoPE
    "kolibri1": {"layer_types": ["sliding_attention", "full_attention"]},
    "glm4_moe_lite": {"n_group": 2, "topk_group": 1},
    # ---- dense Llama-named families (helper fam-llama): what their defaults leave unexercised
    # in two layers (a full layer beside a windowed one, a NoPE layer, multipliers of 1)
    # OLMo 3's full layers scaled, its windowed ones not (the legacy rope_scaling: every release
    # reads it, 5.x from 5.2x as the full layers' entry of its RoPE per layer kind)
    "olmo3": {"layer_types": ["sliding_attention", "full_attention"],
              "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "exaone4": {"sliding_window_pattern": 2},
    "cohere2": {"sliding_window_pattern": 2,  # its rule before layer_types, and the kinds
                "layer_types": ["sliding_attention", "full_attention"]},
    "smollm3": {"no_rope_layer_interval": 2},
    "granite": {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "logits_scaling": 4.0,
                "attention_multiplier": 0.25},
    "hyperclovax": {"embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                    "logits_scaling": 0.25, "attention_multiplier": 0.25},
    # ---- position and norm placements (helper fam-positions) ----
    # six heads: ALiBi's slopes for a head count that is no power of two (Press's interleaving);
    # MPT's own score scale read from attn_config
    "bloom": {"n_head": 6, "hidden_size": 48},
    "mpt": {"n_heads": 6, "d_model": 48, "attn_config": {"softmax_scale": 0.2}},
    # ---- what makes each feature bite at tiny size (helper fam-sinks) ----
    # GPT-OSS's clamp where the tiny model's gate and up units reach it
    "gpt_oss": {"swiglu_limit": 0.05},
    # Hunyuan's checkpoints' RoPE: "dynamic" with an alpha, a static NTK base
    "hunyuan_v1_dense": {"rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0,
                                             "factor": 1.0, "rope_theta": 10000.0}},
    "hunyuan_v1_moe": {"rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0,
                                           "factor": 1.0, "rope_theta": 10000.0}},
    # Ministral 3's query scale from position 4 on (its original context, shrunk)
    "ministral3": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
                                       "factor": 16.0, "original_max_position_embeddings": 4,
                                       "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                       "mscale_all_dim": 1.0, "llama_4_scaling_beta": 1.0}},
    # Granite's multipliers, and a NoPE full layer, a windowed layer and a full layer of
    # another base
    "granite_swa": {"num_hidden_layers": 3, "embedding_multiplier": 3.0,
                    "attention_multiplier": 0.25, "residual_multiplier": 0.5,
                    "logits_scaling": 2.0, "layer_rope_theta": [0, 10000.0, 500000.0],
                    "layer_types": ["full_attention", "sliding_attention", "full_attention"]},
    "granitemoe_swa": {"num_hidden_layers": 3, "embedding_multiplier": 3.0,
                       "attention_multiplier": 0.25, "residual_multiplier": 0.5,
                       "logits_scaling": 2.0, "layer_rope_theta": [0, 10000.0, 500000.0],
                       "layer_types": ["full_attention", "sliding_attention", "full_attention"],
                       "shared_intermediate_size": 16},
    # Flint: a routed windowed (rotary) layer after a dense full (NoPE) one
    "flint": {"mlp_only_layers": [0], "layer_types": ["full_attention", "sliding_attention"]},
    # Cohere 2 MoE: a dense prefix layer (rotary), a windowed layer and a full NoPE one; a
    # shared expert averaged with the routed sum
    "cohere2_moe": {"num_hidden_layers": 3, "first_k_dense_replace": 1,
                    "prefix_dense_intermediate_size": 24, "sliding_window_pattern": 2,
                    "num_shared_experts": 1},
}
# Calls a family needs after it is built (a default it refuses to guess).
FAMILY_SETUP: dict[str, Any] = {
    "xmod": lambda model: model.set_default_language("en_XX"),
}


def causal_lm_families() -> dict[str, str]:
    """model_type -> class name, from transformers' causal-LM auto mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _shrunk_fields(default: Any, widths: bool, layers: int | None) -> dict[str, Any]:
    values = default.to_dict()
    over = {k: v for k, v in SMALL.items() if k in values}
    for key, value in values.items():
        if key.endswith("token_id") and isinstance(value, int) and value >= V:
            over[key] = V - 1
        elif key.endswith("token_id") and isinstance(value, list):
            over[key] = [min(v, V - 1) if isinstance(v, int) else v for v in value]
        elif (widths and key not in over and isinstance(value, int) and not isinstance(value, bool)
              and value > 64 and _WIDTH.search(key) and not _NOT_WIDTH.search(key)):
            over[key] = 16 if "rank" in key else 32
        elif "vocab_size" in key and isinstance(value, int) and value > V:
            over[key] = V
    if "is_decoder" in values:  # what transformers asks of a standalone causal LM of its kind
        over["is_decoder"] = True
    if "kv_lora_rank" in values:  # latent attention: one key/value head per query head
        over["num_key_value_heads"] = over.get("num_attention_heads", 4)
    if layers is not None:
        over.update({k: layers for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
                     if k in values})
    return over


def _per_layer(value: Any, n_layers: Any) -> bool:
    """A field with one entry per layer (layer_types, a {layer index: ...} map): it must be
    derived again for the new layer count, so it is dropped from a shrunk part."""
    if isinstance(value, list):
        return isinstance(n_layers, int) and len(value) == n_layers
    return isinstance(value, dict) and bool(value) and all(
        isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in value)


def tiny_config(model_type: str, widths: bool = False, layers: int | None = None) -> Any:
    """The family's default config with every size shrunk (see the module docstring); composite
    configs (a text model inside a multimodal one) have each part shrunk the same way."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    fields = _shrunk_fields(default, widths, layers)
    for key in getattr(cls, "sub_configs", {}) or {}:
        part = getattr(default, key, None)
        if part is not None and hasattr(part, "to_dict"):
            sub = _shrunk_fields(part, widths, layers)
            kept = {k: v for k, v in part.to_dict().items()
                    if not _per_layer(v, getattr(part, "num_hidden_layers", None))}
            fields[key] = type(part)(**{**kept, **sub}).to_dict()
    fields.update(FAMILY_OVERRIDES.get(model_type, {}))
    return cls(**fields)


class Unbuildable(Exception):
    """The family does not build at tiny size here; the message says why."""


def build_tiny(model_type: str, class_name: str) -> tuple[torch.nn.Module, str]:
    """(model in eval mode, the attempt that built it), or Unbuildable with the last reason."""
    import transformers as tf

    cls = getattr(tf, class_name, None)
    if cls is None:
        raise Unbuildable(f"transformers has no {class_name}")
    reasons = []
    for name, widths, layers in ATTEMPTS:
        try:
            model = _build_once(cls, model_type, widths, layers)
        except Unbuildable as exc:
            reasons.append(str(exc))
            continue
        except ImportError as exc:
            raise Unbuildable(f"needs an optional library: {_first_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - any failure to build is a reason to retry
            reasons.append(f"{type(exc).__name__}: {_first_line(exc)}")
            continue
        return model, name
    raise Unbuildable(reasons[-1])


def _build_once(cls: type, model_type: str, widths: bool, layers: int | None) -> torch.nn.Module:
    config = tiny_config(model_type, widths, layers)
    with torch.device("meta"):
        try:
            meta = cls(config)
        except AttributeError:  # a multimodal config mapped to the text-only class: its text part
            config = config.get_text_config()
            meta = cls(config)
    count = sum(p.numel() for p in meta.parameters())
    if count > MAX_PARAMETERS:
        largest = max(meta.named_parameters(), key=lambda item: item[1].numel())
        raise Unbuildable(f"still {count:,} parameters after shrinking (largest "
                          f"{largest[0]} {tuple(largest[1].shape)})")
    torch.manual_seed(0)
    model = cls(config).eval()
    setup = FAMILY_SETUP.get(model_type)
    if setup is not None:
        setup(model)
    started = time.process_time()
    with torch.no_grad():  # one forward proves it runs at all (hybrids need a layer of each kind)
        model(torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0)))
    took = time.process_time() - started
    if took > MAX_FIRST_FORWARD_S:
        raise Unbuildable(f"one forward of (2, 5) ids took {took:.1f} CPU s at tiny size (a slow "
                          "reference kernel, or a size the shrink missed)")
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


# ---- the verdicts -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Expected:
    """A family whose verdict is a genuine failure: every check that must fail, each with words
    its message must contain (which path leaked, which input was mishandled), and why."""

    checks: dict[str, tuple[str, ...]]
    why: str


_LEFT_PADDING = ("left padding shifts its positions: the positions come from the cache length "
                 "and it takes no position_ids (the decoders of encoder-decoder families)")
_CHUNKED_STATE = ("its recurrent cache takes one token a step: cached chunks of more than one "
                  "token are computed wrongly, without an error")
_BIDIRECTIONAL = "its default configuration attends in both directions (not a causal decoder)"


def _pads(why: str = _LEFT_PADDING) -> Expected:
    return Expected({"padding": ("left-padded", "pads count as positions")}, why)


EXPECTED: dict[str, Expected] = {
    # the output_attentions path leaks while the plain forward is causal
    "falcon": Expected({"attention_rows": ("future key", "output_attentions=True",
                                           "eager attention", "leak is in this path only")},
                       "its eager attention (the path output_attentions=True takes) adds the "
                       "boolean causal mask to the scores instead of masking them; its default "
                       "sdpa forward is causal"),
    # bidirectional by default
    "cpmant": Expected({"inputs": ("float ids",), "causal": ("reads future tokens",),
                        "prefix": ("depend on what follows",),
                        "attention_rows": ("future key", "fails `causal` too"),
                        "kv_cache": (), "padding": ("one masked forward", "pads' content "
                                                    "reaches")},
                       _BIDIRECTIONAL + "; it also accepts float ids, its cache path raises (its "
                       "prompt tokens change the key count) and its attention_mask is a dummy "
                       "parameter: a left-padded row reads its pads"),
    "xlm": Expected({"causal": ("reads future tokens",), "prefix": ("depend on what follows",),
                     "attention_rows": ("future key", "fails `causal` too"), "grad_causal": ()},
                    _BIDIRECTIONAL + " (causal=False)"),
    "xlnet": Expected({"causal": ("reads future tokens",), "prefix": ("depend on what follows",),
                       "attention_rows": ("future key", "fails `causal` too")},
                      _BIDIRECTIONAL + " (attn_type='bi')"),
    "prophetnet": Expected({"inputs": ("T=63 raised",), "causal": ("reads future tokens",),
                            "prefix": ("depend on what follows",), "kv_cache": (),
                            "padding": ("left-padded",), "grad_causal": ()},
                           "its n-gram decoder leaks about 1e-5 of later tokens into earlier "
                           "logits (forward and backward), raises below its declared 64 "
                           "positions, takes a cache only for one-token inputs, and left padding "
                           "shifts its positions"),
    # inputs and shapes mishandled
    "rwkv": Expected({"inputs": ("T=1: logits (3, 3, 99)",), "prefix": ("shape (2, 2, 99)",),
                      "padding": ("left-padded", "pads' content reaches"),
                      "grad_causal": ("inplace operation",),
                      "dead_parameters": ("inplace operation",)},
                     "a single-token input comes back (B, B, V) (the time axis is squeezed), "
                     "left pads enter its recurrent state, and its backward raises in eval mode"),
    "opt": Expected({"inputs": ("rank-3 ids", "output (6, 1, 99)")},
                    "(B, T, 1) ids are flattened to (B*T, 1) and run, not rejected"),
    "bert-generation": Expected({"inputs": ("rank-3 ids", "output (2, 3, 3, 99)")},
                                "(B, T, 1) ids are accepted and give (B, T, T, V) logits"),
    "dory": Expected({"inputs": ("inside the context",), "prefix": ("depend on what follows",),
                      "kv_cache": (), "padding": ("raised", "without pads run")},
                     "it raises RuntimeError from T = its sliding window on (8 here, 1024 by "
                     "default), inside the context its config declares (a defect `inputs` "
                     "names); the gate audits the rest within that limit, where a one-token "
                     "prefix alone differs from the full run, its cached path raises, and a "
                     "left-padded batch raises in the cached steps that run without pads "
                     "(generate(attention_mask=...) raises too); its masked forward is right"),
    # recurrent caches fed chunks, pads through a recurrent state
    "mamba": Expected({"kv_cache": ("chunks",), "padding": ("left-padded", "through the cache")},
                      _CHUNKED_STATE + "; after a left-padded prefill its cached steps differ "
                      "(its masked forward is right)"),
    "falcon_mamba": Expected({"kv_cache": ("chunks",),
                              "padding": ("left-padded", "through the cache")},
                             _CHUNKED_STATE + "; after a left-padded prefill its cached steps "
                             "differ (its masked forward is right)"),
    "recurrent_gemma": Expected(
        {"padding": ("one masked forward", "left-padded", "pads' content reaches")},
        "the temporal convolution of its recurrent blocks (conv1d_width 4) reads the pad slots: "
        "neither the attention_mask nor the recurrence's reset at position 0 reaches it "
        "(measured: with the convolution's taps on earlier tokens zeroed, the padded rows equal "
        "the rows alone). Pads holding the padding id pass here only because its embedding row "
        "and this initialisation's biases are 0, so a pad reaches the convolution as exactly 0; "
        "users report the same on left-padded fine-tuning (huggingface/transformers#31201)"),
    "jamba": Expected({"kv_cache": ("chunks",)}, _CHUNKED_STATE),
    "moshi": Expected({"kv_cache": ("one token at a time",),
                       "padding": ("left-padded", "through the cache"),
                       "window": ("window of 8",)},
                      "its config declares a sliding window (8 here) that no attention path "
                      "applies: the full forward reads every earlier token (the flash path that "
                      "applied it is gone), while its cache keeps only the window's keys, so "
                      "cached decoding past the window differs from the full forward"),
    "gpt_neo": Expected({"kv_cache": ("StaticCache",)},
                        "its local (windowed) layers decode wrongly through a StaticCache: the "
                        "prefill's logits differ from the full forward (by 0.08 at this size; "
                        "generate(cache_implementation='static') scores its first step 0.1 away "
                        "from the dynamic cache's), while the cache it makes itself is right"),
    "git": Expected({"padding": ("left-padded", "through the cache")},
                    "left padding changes the cached steps (its positions come from the cache "
                    "length, not from the position_ids it is given)"),
    **{family: _pads() for family in ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small",
                                       "marian", "mbart", "mvp", "pegasus", "plbart", "trocr",
                                       "whisper")},
}
# Families whose labels= loss does not shift the labels (logit t is scored against label t): fed
# the labels every Hugging Face collator builds (the input ids), they learn to copy their input.
# The BART lineage's decoders used as causal LMs, XLNet, CPM-Ant and XLM.
UNSHIFTED_LOSS = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "cpmant", "marian",
                  "mbart", "mvp", "pegasus", "plbart", "trocr", "whisper", "xlm", "xlnet")
_UNSHIFTED = ("its labels= loss scores logit t against label t (no shift): fed the labels every "
              "causal-LM collator builds (the input ids), it learns to copy its input")
for _family in UNSHIFTED_LOSS:
    if _family in EXPECTED:
        EXPECTED[_family].checks.setdefault("model_loss", ("unshifted labels",))
    else:
        EXPECTED[_family] = Expected({"model_loss": ("unshifted labels",)}, _UNSHIFTED)
# ProphetNet's loss is its n-gram objective (several future tokens at once), not next-token
# cross entropy; GIT's slices its logits by the image tokens a text-only call does not have.
EXPECTED["prophetnet"].checks["model_loss"] = ("none of the",)
EXPECTED["git"].checks["model_loss"] = ("batch_size",)
# train_mode reruns the causal cuts in train mode: a family that reads future tokens in eval mode
# reads them there too.
for _expected in EXPECTED.values():
    if "reads future tokens" in _expected.checks.get("causal", ()):
        _expected.checks.setdefault("train_mode", ("reads future tokens",))

# Verdicts the gate itself gets wrong today: false alarms of a check, kept visible here (and in
# docs/conformance.md) until the check is fixed. The tests mark them xfail; once the check
# passes these families, the test fails until the entry is removed. Empty since the padding
# check measures where a model numbers its positions (RoBERTa's family: padding_idx + 1) and
# grad_causal skips a model that refuses a backward in eval mode (Reformer).
GATE_ISSUES: dict[str, Expected] = {}


@dataclass
class Row:
    family: str
    cls: str
    built: bool
    verdict: str  # "pass", "FAIL", "skipped"
    params: int = 0
    attempt: str = ""
    seconds: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    facts: str = ""
    reason: str = ""  # why the family was not built


def audit_family(model_type: str, class_name: str, *, intervention_len: int = INTERVENTION_LEN
                 ) -> Row:
    import decoder_audit as da
    from decoder_audit.references.hf_models import audit_facts

    started = time.perf_counter()
    try:
        with _quiet():
            model, attempt = build_tiny(model_type, class_name)
    except Unbuildable as exc:
        return Row(model_type, class_name, False, "skipped", reason=str(exc),
                   seconds=time.perf_counter() - started)
    # The plain call a user writes: the gate reads V, the input vocabulary, the pad id and the
    # length policy from the model itself; they must be what references.hf_models reads.
    with _quiet():
        report = da.audit(model, intervention_len=intervention_len)
    facts, read = report.facts, audit_facts(model)
    row = Row(model_type, class_name, True, "pass" if report.passed else "FAIL",
              params=sum(p.numel() for p in model.parameters()), attempt=attempt,
              seconds=time.perf_counter() - started,
              facts=f"V={facts.vocab_size}" + (f", V_in={facts.input_vocab_size}"
                                               if facts.input_vocab_size != facts.vocab_size
                                               else "")
              + f", max_seq_len={facts.max_seq_len}")
    given = {"vocab_size": facts.vocab_size, "max_seq_len": facts.max_seq_len,
             "input_vocab_size": facts.input_vocab_size, "pad_token_id": facts.pad_token_id}
    expected = {**read.audit_options(),
                "input_vocab_size": read.input_vocab_size or read.vocab_size}
    if given != expected:
        row.failed["facts"] = f"the plain call read {given}, the model declares {expected}"
    for check in report.checks:
        if check.skipped:
            row.skipped[check.name] = check.evidence.get("reason", check.detail)
        else:
            row.ran.append(check.name)
            if not check.passed:
                row.failed[check.name] = check.detail
    return row


@contextlib.contextmanager
def _quiet():
    """transformers' warnings about tiny vocabularies and defaults are not evidence."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()):
            yield


def sweep(families: dict[str, str], *, echo: bool = False) -> list[Row]:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.set_num_threads(1)
    rows = []
    for model_type, class_name in families.items():
        row = audit_family(model_type, class_name)
        rows.append(row)
        if echo:
            what = row.reason if not row.built else "; ".join(
                f"{k}: {v[:90]}" for k, v in row.failed.items())
            print(f"{row.family:28} {row.verdict:7} {row.seconds:5.1f}s {what}", flush=True)
    return rows


def verdict_problems(row: Row) -> list[str]:
    """How `row` differs from what is expected of its family: a correct family must pass every
    check; a family in EXPECTED must fail exactly its listed checks, each message containing
    its words. Empty when the row is as expected."""
    expected = EXPECTED.get(row.family) or GATE_ISSUES.get(row.family)
    wanted = expected.checks if expected else {}
    problems = []
    for name, detail in row.failed.items():
        if name not in wanted:
            problems.append(f"{name} failed: {detail}")
    for name, words in wanted.items():
        if name not in row.failed:
            problems.append(f"{name} was expected to fail ({expected.why}) but did not")
            continue
        missing = [w for w in words if w not in row.failed[name]]
        if missing:
            problems.append(f"{name}'s message lacks {missing}: {row.failed[name]}")
    return problems


def _oracle_paragraph(built: list[Row], tf) -> str:
    """Which families the white-box checks (params, oracle) ran on: those whose config is read
    as their spec (references/families.py, one entry per family)."""
    white = [r for r in built if "oracle" in r.ran]
    names = ", ".join(f"{r.family} ({r.cls})" for r in white)
    return (f"**The float64 oracle and the parameter ledger ran on {len(white)} families**: "
            f"{names}. Each is an entry of the families table (references/families.py; "
            "[the table](families.md) says what each changes relative to Llama's block): its "
            "config is its spec (`da.audit(hf_model)` needs no argument) and its weights are "
            "checked where they lie. Every other family is audited black-box; the next section "
            "says what each lacks, and `da.audit(model, spec=cfg)` gives it the same white-box "
            "checks where a DecoderConfig expresses its architecture.")


def _black_box_section(built: list[Row]) -> list[str]:
    """Every built family the oracle did not run on, with what it lacks: the oracle's skip
    reason (what the reader refused, or references.family_black_box.BLACK_BOX)."""
    rows = [r for r in built if "oracle" not in r.ran]
    lines = ["", f"## Left black-box ({len(rows)} families)", "",
             "| family | class | what it lacks |", "|---|---|---|"]
    for r in rows:
        why = r.skipped.get("oracle") or r.failed.get("oracle", "")
        inner = re.search(r"converter can read \((.*)\)$", why)  # the reference's own reason
        why = (inner[1] if inner else why).replace(f"{r.cls} ({r.family}) ", "")
        lines.append(f"| {r.family} | {r.cls} | {_cell(why.replace(r.cls, '(its class)'), 300)} |")
    return lines


def write_docs(rows: list[Row], path: Path | None = None) -> Path:
    """docs/conformance.md (or `path`): every family, its verdict, the checks it ran, skipped
    and failed."""
    import transformers

    path = DOCS if path is None else path
    built = [r for r in rows if r.built]
    passed = [r for r in built if r.verdict == "pass"]
    failed = [r for r in built if r.verdict != "pass"]
    expected = [r for r in failed if r.family in EXPECTED and not verdict_problems(r)]
    issues = [r for r in failed if r.family in GATE_ISSUES and not verdict_problems(r)]
    lines = [
        "# Conformance: the gate on every Hugging Face causal-LM family",
        "",
        "Generated by `python tests/conformance.py --write-docs` (the full sweep, about "
        f"{sum(r.seconds for r in rows) / 60:.0f} minutes on 2 cores); "
        "`tests/gate/test_conformance.py` runs a representative subset in the default test run and "
        "all of it with `DA_CONFORMANCE=all`. Do not edit by hand.",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}. Every family in "
        "transformers' causal-LM auto mapping is built from its config's defaults with every "
        f"size shrunk (V = {V}, D = 32, 2 layers, 4 query heads over 2 KV heads, head width 8, "
        "FFN 48, 4 experts; see `tiny_config` in tests/conformance.py), random weights of "
        "its own initialisation (seed 0), and audited with the plain call a user writes, "
        f"`da.audit(model, intervention_len={INTERVENTION_LEN})`: the gate reads V, the input "
        "vocabulary, the padding id and the length policy from the model itself (a learned "
        "position table is a hard limit; rotary, relative and recurrent positions are audited "
        "with max_seq_len=None; an undeclared limit is found by calling), and each row checks "
        "they are what `references.hf_models.audit_facts` reads. The training-path checks that "
        "need a declared training path (packing, checkpointing, autocast) are skipped here.",
        "",
        f"**{len(rows)} families: {len(built)} built, {len(passed)} pass, {len(failed)} fail: "
        f"{len(expected)} genuinely (the check and the path that leaked are listed below), "
        f"{len(issues)} by a false alarm of the gate's generation checks (open, listed below), "
        f"{len(failed) - len(expected) - len(issues)} unexpectedly; "
        f"{len(rows) - len(built)} not built (reason below).** "
        f"Audit cost: {sum(r.seconds for r in built) / max(1, len(built)):.1f} s per model on "
        "average, build included.",
        "",
        _oracle_paragraph(built, transformers),
        "",
        "## Verdicts",
        "",
        "| family | class | parameters | verdict | failed checks | checks run | skipped |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for r in built:
        fails = "; ".join(f"`{k}`" for k in r.failed) or ""
        skipped = ", ".join(r.skipped) or ""
        lines.append(f"| {r.family} | {r.cls} | {r.params:,} | {r.verdict} | {fails} | "
                     f"{len(r.ran)} | {skipped} |")
    lines += _black_box_section(built)
    lines += ["", "## Why checks were skipped", "",
              "| check | reason | families |", "|---|---|---:|"]
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in built:
        for name, why in r.skipped.items():  # the class name aside, reasons repeat
            reasons.setdefault((name, why.replace(r.cls, "(its class)")), []).append(r.family)
    for (name, why), families in sorted(reasons.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        shown = ", ".join(families) if len(families) <= 6 else f"{len(families)} families"
        lines.append(f"| `{name}` | {_cell(why)} | {shown} |")
    lines += ["", "## Failures", "",
              "Each failure with the gate's own message. Families listed in `EXPECTED` "
              "(tests/conformance.py) fail for a genuine reason, stated here; the test asserts "
              "the same checks fail with the same words.", ""]
    for r in failed:
        problems = verdict_problems(r)
        if problems:
            status = "UNEXPECTED: " + "; ".join(problems)
        elif r.family in GATE_ISSUES:
            status = "**gate issue (open)**, not the model's fault: " + GATE_ISSUES[r.family].why
        else:
            status = "genuine: " + EXPECTED[r.family].why
        lines.append(f"### {r.family} ({r.cls})")
        lines.append("")
        lines.append(status)
        lines.append("")
        for name, detail in r.failed.items():
            lines.append(f"- `{name}`: {_cell(detail, 400)}")
        lines.append("")
    lines += ["## Not built", "", "| family | class | reason |", "|---|---|---|"]
    for r in rows:
        if not r.built:
            lines.append(f"| {r.family} | {r.cls} | {_cell(r.reason)} |")
    path.write_text("\n".join(lines) + "\n")
    return path


def _cell(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[:limit] + " ..."


def merged_rows(cached: list[Row], fresh: list[Row]) -> list[Row]:
    """The cached sweep's rows with each freshly swept family's row in its place (a family the
    cache lacks goes at the end)."""
    by_family = {row.family: row for row in fresh}
    kept = [by_family.pop(row.family, row) for row in cached]
    return kept + [row for row in fresh if row.family in by_family]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _read_cache() -> list[Row] | None:
    return [Row(**row) for row in json.loads(CACHE.read_text())] if CACHE.is_file() else None


def _write_cache(rows: list[Row]) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps([dataclasses.asdict(row) for row in rows]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="model types (default: all)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write {_shown(DOCS)} (with families: their rows merged into the "
                             "last full sweep's)")
    parser.add_argument("--cached", action="store_true",
                        help=f"judge the rows of the last full sweep ({_shown(CACHE)}) instead "
                             "of sweeping again")
    args = parser.parse_args(argv)
    everything = causal_lm_families()
    unknown = [f for f in args.families if f not in everything]
    if unknown:
        parser.error(f"unknown model types {unknown}")
    cached = _read_cache()
    if args.write_docs and args.families and not args.cached and cached is None:
        parser.error(f"--write-docs with families merges their rows into the last full sweep's "
                     f"({_shown(CACHE)}), which is not there; run the full sweep first (python "
                     "tests/conformance.py --write-docs)")
    if args.cached and cached is None:
        parser.error(f"--cached: no rows of a full sweep at {_shown(CACHE)}")
    chosen = {f: everything[f] for f in args.families} if args.families else everything
    if args.cached:  # the rows of the last sweep, judged again (after EXPECTED changed)
        rows = cached
    else:
        rows = sweep(chosen, echo=True)
        if not args.families:
            _write_cache(rows)
        elif args.write_docs:  # the families swept again, in place of their cached rows
            rows = merged_rows(cached, rows)
            _write_cache(rows)
    if args.write_docs:
        print(f"wrote {write_docs(rows)}")
    unexpected = [r.family for r in rows if r.built and verdict_problems(r)]
    if unexpected:
        print(f"unexpected verdicts: {unexpected}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
