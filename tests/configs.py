"""The one grid of test configs (STYLE.md 16): every config a test builds a decoder from is
named here, once, and test modules select from it instead of writing `DecoderConfig(...)`.

Two parts:
- `grid()`: configs generated from the axes below (norm x MLP x position kind x biases x tying x
  attention heads), chosen so that every pair of values of any two axes occurs in at least one
  entry (`product()` is the full cross product, far larger). Widths are odd or unequal so no axis
  can be identified by its size; RoPE entries have an even head width, GQA entries a group >= 2
  over >= 2 KV heads.
- `SPECIAL`: hand-named configs that particular tests need for their shape (GQA 6/2, MQA, the
  tiny Hugging Face conversion shapes, long contexts, the torch.nn twin's shapes, ...).

Use `named(name)` for one config, `entries(*names)` / `grid()` for lists of `Entry`, and
`params(entries)` for `pytest.mark.parametrize("cfg", params(...))` with the names as test ids.
Configs that must be *invalid* (ConfigError tests) are not here: they stay beside their tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import pytest

import decoder_audit as da


class Entry(NamedTuple):
    name: str
    config: da.DecoderConfig


# ---- the axes of the grid ---------------------------------------------------------------------

NORMS = {"ln": "layernorm", "rms": "rmsnorm"}
MLPS = {"relu": "relu", "gelu": "gelu", "gelutanh": "gelu_tanh", "swiglu": "swiglu"}
POSITIONS = {"learned": "learned", "rope": "rope", "nopos": "none"}
BIASES = {"nobias": (False, False), "attnbias": (True, False), "mlpbias": (False, True),
          "biases": (True, True)}  # (attn_bias, mlp_bias)
TYING = {"tied": True, "untied": False}
HEADS = ("mha", "gqa", "mqa")  # n_kv_heads = None, 2 (group >= 2), 1
AXES = (NORMS, MLPS, POSITIONS, BIASES, TYING, HEADS)

# Two odd shapes, alternated along the grid: (V, D, L, H, F, T, rope_theta). Head widths 6 and 4
# (even, for RoPE); H = 4 and 6 both split into 2 KV heads with groups 2 and 3; F = 23 < D.
SHAPES = (
    dict(vocab_size=13, d_model=24, n_layers=2, n_heads=4, d_ff=23, max_seq_len=5),
    dict(vocab_size=29, d_model=24, n_layers=3, n_heads=6, d_ff=37, max_seq_len=7,
         rope_theta=500.0),
)


def _build(labels: tuple[str, ...], shape: dict) -> Entry:
    norm, mlp, pos, bias, tie, heads = labels
    attn_bias, mlp_bias = BIASES[bias]
    n_kv_heads = {"mha": None, "gqa": 2, "mqa": 1}[heads]
    cfg = da.DecoderConfig(**shape, n_kv_heads=n_kv_heads, norm=NORMS[norm], mlp=MLPS[mlp],
                           pos=POSITIONS[pos], attn_bias=attn_bias, mlp_bias=mlp_bias,
                           tie_embeddings=TYING[tie])
    return Entry("-".join(labels), cfg)


def _labels() -> list[tuple[str, ...]]:
    return list(itertools.product(*(list(axis) for axis in AXES)))


def product() -> Iterator[Entry]:
    """The full cross product of the axes (576 configs): for exhaustive runs, not the suite."""
    for i, labels in enumerate(_labels()):
        yield _build(labels, SHAPES[i % len(SHAPES)])


def _pairs(labels: tuple[str, ...]) -> set[tuple[int, str, int, str]]:
    return {(i, labels[i], j, labels[j]) for i, j in itertools.combinations(range(len(labels)), 2)}


def _pairwise_labels() -> list[tuple[str, ...]]:
    """Greedy all-pairs cover: repeatedly take the first combination of the cross product that
    covers the most still-uncovered value pairs. Deterministic."""
    candidates = _labels()
    uncovered = set().union(*(_pairs(labels) for labels in candidates))
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda labels: len(_pairs(labels) & uncovered))
        chosen.append(best)
        uncovered -= _pairs(best)
    return chosen


GRID: tuple[Entry, ...] = tuple(_build(labels, SHAPES[i % len(SHAPES)])
                                for i, labels in enumerate(_pairwise_labels()))


def grid() -> list[Entry]:
    """Every pair of axis values in at least one config (see the module docstring)."""
    return list(GRID)


# ---- special configs, named for what the tests need of them -----------------------------------

# The odd GPT-ish width several modules share: D=24, H=6 -> Dh=4, F=37, V=29.
ODD = dict(vocab_size=29, d_model=24, n_heads=6, d_ff=37)
# Hugging Face conversion: ODD widths, T=32 (references/test_hf.py feeds ids of length 32).
HF = dict(ODD, max_seq_len=32)
# The torch.nn twin: ODD widths, T=11, GPT-style (LayerNorm, MHA) so the twin can express them.
TWIN = dict(ODD, max_seq_len=11)

SPECIAL: dict[str, da.DecoderConfig] = {
    "tiny-368": da.preset("tiny-368"),
    # GQA 6/2 (group 3), the Llama recipe, odd widths: trace shapes, gradients, GQA == MHA with
    # duplicated KV heads, checkpoints.
    "gqa-odd": da.DecoderConfig(**ODD, n_layers=2, n_kv_heads=2, max_seq_len=6, norm="rmsnorm",
                                mlp="swiglu", pos="rope", rope_theta=10000.0,
                                tie_embeddings=False),
    # GQA 4/2 (group 2; Hkv=1 would hide a wrong repeat order), RoPE, RMSNorm, SwiGLU, untied:
    # the mutant zoo's grouped-query subject.
    "gqa-small": da.DecoderConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                                  d_ff=24, max_seq_len=7, norm="rmsnorm", mlp="swiglu",
                                  pos="rope", tie_embeddings=False),
    # GQA 6/3, gelu_tanh, every bias, tied (LayerNorm, learned positions): checkpoints.
    "gqa3-gelutanh-biases-tied": da.DecoderConfig(**ODD, n_layers=3, n_kv_heads=3, max_seq_len=9,
                                                  mlp="gelu_tanh", attn_bias=True, mlp_bias=True),
    # GQA 4/2 with LayerNorm, SwiGLU under RoPE and every bias, d_ff < d_model.
    "ln-swiglu-rope-allbias-gqa": da.DecoderConfig(
        vocab_size=19, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=10, max_seq_len=4,
        norm="layernorm", mlp="swiglu", pos="rope", attn_bias=True, mlp_bias=True,
        tie_embeddings=False),
    "ln-gelu-learned-biases-gqa-untied": da.DecoderConfig(
        vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24, max_seq_len=5,
        norm="layernorm", mlp="gelu", pos="learned", attn_bias=True, mlp_bias=True,
        tie_embeddings=False),
    "ln-gelutanh-nopos-attnbias-tied": da.DecoderConfig(
        vocab_size=11, d_model=12, n_layers=3, n_heads=3, d_ff=20, max_seq_len=5,
        norm="layernorm", mlp="gelu_tanh", pos="none", attn_bias=True, tie_embeddings=True),
    "rms-relu-rope-mlpbias-tied": da.DecoderConfig(
        vocab_size=17, d_model=16, n_layers=2, n_heads=2, d_ff=12, max_seq_len=5,
        norm="rmsnorm", mlp="relu", pos="rope", rope_theta=500.0, mlp_bias=True,
        tie_embeddings=True),
    "ln-gelutanh-biases-tied": da.DecoderConfig(
        vocab_size=13, d_model=12, n_layers=3, n_heads=3, d_ff=20, max_seq_len=5,
        mlp="gelu_tanh", attn_bias=True, mlp_bias=True),
    # MQA (four query heads over one KV head) without positions, one layer: a minimal model.
    "mqa-nopos-tied": da.DecoderConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=4,
                                       n_kv_heads=1, d_ff=9, max_seq_len=3, norm="rmsnorm",
                                       mlp="gelu", pos="none", tie_embeddings=True),
    # MQA under RoPE with a ReLU MLP: FLOP accounting.
    "mqa-rope-relu": da.DecoderConfig(vocab_size=30, d_model=32, n_layers=3, n_heads=4,
                                      n_kv_heads=1, d_ff=24, max_seq_len=9, mlp="relu",
                                      pos="rope", norm="rmsnorm"),
    # GQA 6/3, GELU, every bias, untied: FLOP accounting.
    "gqa3-gelu-biases-untied": da.DecoderConfig(vocab_size=50, d_model=48, n_layers=2, n_heads=6,
                                                n_kv_heads=3, d_ff=40, max_seq_len=12, mlp="gelu",
                                                attn_bias=True, mlp_bias=True,
                                                tie_embeddings=False),
    # Long contexts: the gate samples cuts and lengths instead of trying every one.
    "long-context-40": da.DecoderConfig(vocab_size=7, d_model=12, n_layers=2, n_heads=6,
                                        n_kv_heads=3, d_ff=16, max_seq_len=40, mlp="swiglu",
                                        pos="rope", rope_theta=500.0, tie_embeddings=False),
    "long-context-200": da.DecoderConfig(vocab_size=9, d_model=8, n_layers=1, n_heads=2, d_ff=8,
                                         max_seq_len=200),
    # The torch.nn twin: every activation it can express, tied and untied, with and without
    # biases, a non-default norm_eps.
    "twin-gelutanh-biases-tied": da.DecoderConfig(**TWIN, n_layers=3, mlp="gelu_tanh",
                                                  attn_bias=True, mlp_bias=True,
                                                  tie_embeddings=True),
    "twin-gelu-nobias-untied": da.DecoderConfig(**TWIN, n_layers=2, mlp="gelu", attn_bias=False,
                                                mlp_bias=False, tie_embeddings=False,
                                                norm_eps=1e-3),
    "twin-relu-nopos-untied": da.DecoderConfig(**TWIN, n_layers=2, mlp="relu", pos="none",
                                               attn_bias=True, tie_embeddings=False),
    # RoPE rotating halves (Hugging Face Llama's pairs), GQA 4/2, untied; and with MHA, biases
    # and LayerNorm, tied.
    "rope-half-gqa": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                      n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                      mlp="swiglu", pos="rope", rope_theta=300.0,
                                      rope_layout="rotate_half", tie_embeddings=False),
    "rope-half-ln-biases-tied": da.DecoderConfig(vocab_size=11, d_model=12, n_layers=2, n_heads=2,
                                                 d_ff=20, max_seq_len=5, pos="rope",
                                                 rope_layout="rotate_half", attn_bias=True,
                                                 mlp_bias=True),
    # Qwen3's attention: a per-head RMSNorm on q and k before RoPE (rotating halves), GQA 4/2;
    # and Qwen2's: q/k/v biases, none on the output projection.
    "qk-norm-gqa": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                    n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                    mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                    qk_norm=True, norm_eps=1e-6, tie_embeddings=False),
    "qkv-bias-only": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                      n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                      mlp="swiglu", pos="rope", attn_bias=True,
                                      attn_output_bias=False, tie_embeddings=True),
    # Heads wider than D / H (Qwen3 0.6B, Gemma): 4 heads of 6 over a width of 16, GQA 4/2
    "wide-heads": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                                   head_width=6, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                   mlp="swiglu", pos="rope", qk_norm=True,
                                   rope_layout="rotate_half", tie_embeddings=False),
    "hf-llama-wide-heads": da.DecoderConfig(**HF, n_layers=2, n_kv_heads=2, head_width=8,
                                            norm="rmsnorm", mlp="swiglu", pos="rope",
                                            tie_embeddings=False),
    # Gemma's block: GeGLU, RMSNorm gains 1 + w, the embedding scaled by sqrt(D), heads wider
    # than D / H, rotate-half RoPE, tied
    "gemma-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
                                   head_width=12, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                   norm_eps=1e-6, norm_offset=1.0, embedding_scale=4.0,
                                   mlp="geglu", pos="rope", rope_layout="rotate_half",
                                   tie_embeddings=True),
    # GPT-NeoX's block: attention and MLP in parallel off the block's input, RoPE on the first
    # 4 of 8 features per head (rotating halves), LayerNorm and every bias, untied
    "neox-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                  max_seq_len=6, norm="layernorm", mlp="gelu", pos="rope",
                                  rope_layout="rotate_half", rotary_dim=4,
                                  parallel_residual=True, attn_bias=True, mlp_bias=True,
                                  tie_embeddings=False),
    # RoPE scaled for a longer context: Llama 3.1's rule (8 pairs across its three regimes:
    # wavelengths 6 to 6e3 against 64 / 4 and 64 / 1), linear positions with GQA, YaRN on a
    # partial rotary (interleaved pairs), and dynamic NTK past an original context of 4
    "rope-llama3": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=1, d_ff=24,
                                    max_seq_len=6, norm="rmsnorm", mlp="swiglu", pos="rope",
                                    rope_theta=3.0, rope_layout="rotate_half",
                                    rope_scaling={"type": "llama3", "factor": 8.0,
                                                  "original_max_seq_len": 64,
                                                  "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0},
                                    tie_embeddings=False),
    "rope-linear-gqa": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                        n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                        mlp="swiglu", pos="rope", rope_theta=50.0,
                                        rope_scaling={"type": "linear", "factor": 3.0}),
    "rope-yarn-partial": da.DecoderConfig(vocab_size=13, d_model=24, n_layers=2, n_heads=2,
                                          d_ff=24, max_seq_len=6, norm="rmsnorm", mlp="swiglu",
                                          pos="rope", rope_theta=100.0, rotary_dim=8,
                                          rope_scaling={"type": "yarn", "factor": 4.0,
                                                        "original_max_seq_len": 16},
                                          tie_embeddings=False),
    "rope-dynamic": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=1, n_heads=2, d_ff=24,
                                     max_seq_len=8, norm="rmsnorm", mlp="swiglu", pos="rope",
                                     rope_theta=100.0,
                                     rope_scaling={"type": "dynamic", "factor": 2.0,
                                                   "original_max_seq_len": 4}),
    # Gemma 2's block: sandwich norms, scores scaled by 1/sqrt(8) over heads of 12 and
    # soft-capped at 5, logits capped at 3, layer 0 windowed to 3 tokens; and Mistral's window
    # of 2 in every layer
    "gemma2-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                    n_kv_heads=1, head_width=12, d_ff=24, max_seq_len=7,
                                    norm="rmsnorm", norm_eps=1e-6, norm_offset=1.0,
                                    embedding_scale=4.0, mlp="geglu", pos="rope",
                                    rope_layout="rotate_half", sandwich_norm=True,
                                    attn_scale=8 ** -0.5, attn_softcap=5.0, logit_softcap=3.0,
                                    sliding_window=3, window_layers=(0,), tie_embeddings=True),
    "window-every-layer": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                           n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                           mlp="swiglu", pos="rope", sliding_window=2,
                                           tie_embeddings=False),
    # OLMo: LayerNorms that learn nothing; OLMo 2: no pre-norms, sandwich norms, q/k RMSNorm over
    # the whole projection (GQA 4/2); Gemma 3: per-head q/k norms (gains 1 + w), layer 1
    # windowed on its own RoPE base while the full layers' RoPE is linearly scaled
    "olmo-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                  max_seq_len=6, norm="layernorm", norm_affine=False,
                                  norm_bias=False, mlp="swiglu", pos="rope",
                                  rope_layout="rotate_half", tie_embeddings=False),
    "olmo2-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                   n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                   pre_norm=False, sandwich_norm=True, qk_norm=True,
                                   qk_norm_scope="projection", mlp="swiglu", pos="rope",
                                   rope_layout="rotate_half", tie_embeddings=False),
    "gemma3-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                    n_kv_heads=1, head_width=8, d_ff=24, max_seq_len=7,
                                    norm="rmsnorm", norm_eps=1e-6, norm_offset=1.0,
                                    embedding_scale=4.0, mlp="geglu", pos="rope",
                                    rope_theta=1e6, window_rope_theta=10.0,
                                    rope_scaling={"type": "linear", "factor": 8.0},
                                    rope_layout="rotate_half", sandwich_norm=True, qk_norm=True,
                                    attn_scale=0.25, sliding_window=3, window_layers=(1,),
                                    tie_embeddings=True),
    # Granite: the embedding, each sublayer's output and the logits scaled, the scores by a
    # multiplier of their own; GPT-J / Phi: a parallel block with one norm, partial rotary on
    # interleaved pairs, squared-ReLU MLP; SmolLM3: layer 1 rotates nothing (NoPE)
    "granite-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                     n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                     mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                     embedding_scale=12.0, residual_multiplier=0.22,
                                     attn_scale=0.0078125, logit_scale=0.125,
                                     tie_embeddings=True),
    "parallel-one-norm": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                          d_ff=24, max_seq_len=6, norm="layernorm",
                                          mlp="relu2", pos="rope", rotary_dim=4,
                                          parallel_residual=True, shared_norm=True,
                                          attn_bias=("q_proj", "k_proj", "v_proj"),
                                          mlp_bias=True, readout_bias=True,
                                          tie_embeddings=False),
    "nope-layer": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=3, n_heads=4,
                                   n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                   mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                   nope_layers=(1,), tie_embeddings=True),
    # ---- GPT-style families (helper fam-gpt) ----
    # OPT / BioGPT: a learned position table that keeps two rows before position 0's
    "opt-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, d_ff=24,
                                 max_seq_len=6, norm="layernorm", mlp="relu", pos="learned",
                                 position_offset=2, attn_bias=True, mlp_bias=True,
                                 tie_embeddings=True),
    # Apertus: a plain MLP whose xIELU learns its two numbers per layer, q/k norms per head
    "xielu-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                   n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                   mlp="xielu", pos="rope", rope_layout="rotate_half",
                                   qk_norm=True, tie_embeddings=False),
    # TransformerLens' readout: a bias on the logits, beside a tied matrix
    "readout-bias-tied": da.DecoderConfig(vocab_size=13, d_model=12, n_layers=2, n_heads=3,
                                          d_ff=20, max_seq_len=5, mlp="gelu_tanh",
                                          attn_bias=True, mlp_bias=True, readout_bias=True,
                                          tie_embeddings=True),
    # nanoGPT with bias=False: LayerNorm without a shift, no Linear biases, tied
    "ln-nobias-tied": da.DecoderConfig(vocab_size=13, d_model=12, n_layers=2, n_heads=3, d_ff=20,
                                       max_seq_len=5, norm="layernorm", norm_bias=False,
                                       mlp="gelu", tie_embeddings=True),
    # Routed experts (docs/experts.md). Mixtral / Qwen-MoE routing (softmax, then the top 2 of
    # 4, renormalised) with one shared expert of its own width after a dense first layer, GQA;
    # DeepSeek-V3's (sigmoid scores, a selection-only bias, weights times 2.5, two shared
    # experts); Mistral's reference order (top 2 of 5 logits, then their softmax) on ReLU
    # experts every second layer, unnormalised scores being the same as normalised there.
    "moe-softmax-shared": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=3, n_heads=4,
                                           n_kv_heads=2, d_ff=24, max_seq_len=7, norm="rmsnorm",
                                           mlp="swiglu", pos="rope", n_experts=4,
                                           experts_per_token=2, expert_width=10,
                                           n_shared_experts=1, shared_expert_width=6,
                                           first_dense_layers=1, tie_embeddings=False),
    "moe-sigmoid-bias": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                         d_ff=24, max_seq_len=6, norm="rmsnorm", mlp="swiglu",
                                         pos="rope", rope_layout="rotate_half", n_experts=5,
                                         experts_per_token=2, expert_width=6, n_shared_experts=2,
                                         router_scoring="sigmoid", router_selection_bias=True,
                                         routed_scaling=2.5, tie_embeddings=True),
    "moe-topk-softmax-relu": da.DecoderConfig(vocab_size=11, d_model=12, n_layers=2, n_heads=3,
                                              d_ff=20, max_seq_len=6, norm="layernorm",
                                              mlp="relu", pos="learned", n_experts=5,
                                              experts_per_token=2, expert_width=7,
                                              router_order="topk_score", normalize_topk=False,
                                              moe_every=2, tie_embeddings=True),
    # Qwen-MoE / OLMoE's unnormalised top-k weights (norm_topk_prob false)
    "moe-unnormalised": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                         d_ff=24, max_seq_len=6, norm="rmsnorm", mlp="swiglu",
                                         pos="rope", qk_norm=True, n_experts=4,
                                         experts_per_token=3, expert_width=5,
                                         normalize_topk=False, tie_embeddings=False),
    # Qwen2-MoE's block: unnormalised softmax weights of 2 of 4 experts, one shared expert of
    # its own width whose output a sigmoid gate scales, MoE every second layer
    "moe-shared-gate": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                                        n_kv_heads=1, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                        mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                        attn_bias=True, attn_output_bias=False, n_experts=4,
                                        experts_per_token=2, expert_width=5, normalize_topk=False,
                                        n_shared_experts=1, shared_expert_width=7,
                                        shared_expert_gate=True, moe_every=2,
                                        tie_embeddings=False),
    # Mixtral's block (every layer routed, experts as wide as d_ff, renormalised top 2 of 4)
    # and OLMoE's (unnormalised top 2, q/k norms over the whole projection)
    "mixtral-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                     n_kv_heads=2, d_ff=12, max_seq_len=6, norm="rmsnorm",
                                     mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                     n_experts=4, experts_per_token=2, tie_embeddings=False),
    "olmoe-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=10,
                                   max_seq_len=6, norm="rmsnorm", mlp="swiglu", pos="rope",
                                   rope_layout="rotate_half", qk_norm=True,
                                   qk_norm_scope="projection", n_experts=4, experts_per_token=2,
                                   normalize_topk=False, tie_embeddings=False),
    # DeepSeek's group-limited routing: 8 experts in 4 groups, a token's 2 from its best 2
    # groups, ranked by their two best biased sigmoid scores (V3) or their best (V2)
    "moe-grouped": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                    max_seq_len=6, norm="rmsnorm", mlp="swiglu", pos="rope",
                                    n_experts=8, experts_per_token=2, expert_width=4,
                                    expert_groups=4, groups_per_token=2,
                                    router_scoring="sigmoid", router_selection_bias=True,
                                    routed_scaling=2.5, n_shared_experts=1,
                                    tie_embeddings=False),
    "moe-grouped-max": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=1, n_heads=2,
                                        d_ff=24, max_seq_len=6, norm="rmsnorm", mlp="swiglu",
                                        pos="rope", n_experts=6, experts_per_token=3,
                                        expert_width=4, expert_groups=3, groups_per_token=2,
                                        group_score="max", tie_embeddings=False),
    # A model that drops tokens over an expert's capacity (Switch Transformer): not causal.
    "moe-capacity": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                     max_seq_len=8, norm="rmsnorm", mlp="swiglu", pos="rope",
                                     n_experts=4, experts_per_token=1, expert_width=6,
                                     capacity_factor=1.0, tie_embeddings=False),
    # Latent attention (DeepSeek-V2/V3's MLA): queries through their own latent, keys and
    # values from a latent of 10 with a rotary key of 4 shared by the heads, heads of 6 + 4,
    # values of 5; DeepSeek-V2-Lite's plain q_proj with routed experts and a dense first layer.
    "mla-q-latent": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=3, d_ff=24,
                                     max_seq_len=7, norm="rmsnorm", mlp="swiglu", pos="rope",
                                     kv_latent_rank=10, q_latent_rank=9, rope_head_width=4,
                                     nope_head_width=6, value_head_width=5,
                                     tie_embeddings=False),
    "mla-moe": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                max_seq_len=6, norm="rmsnorm", mlp="swiglu", pos="rope",
                                rope_layout="rotate_half", rope_theta=500.0, kv_latent_rank=8,
                                rope_head_width=2, nope_head_width=4, value_head_width=6,
                                n_experts=4, experts_per_token=2, expert_width=6,
                                n_shared_experts=1, first_dense_layers=1, router_scoring="sigmoid",
                                router_selection_bias=True, tie_embeddings=False),
    # Tiny shapes for Hugging Face conversion: two GPT-2 and two Llama (GQA 6/2 and 6/3).
    "hf-gpt-relu-mlpbias-tied": da.DecoderConfig(**HF, n_layers=2, mlp="relu", attn_bias=False,
                                                 mlp_bias=True),
    "hf-gpt-gelu-biases-untied": da.DecoderConfig(**HF, n_layers=2, mlp="gelu", attn_bias=True,
                                                  mlp_bias=True, tie_embeddings=False),
    "hf-llama-kv2-untied": da.DecoderConfig(**HF, n_layers=2, n_kv_heads=2, norm="rmsnorm",
                                            mlp="swiglu", pos="rope", rope_theta=10000.0,
                                            tie_embeddings=False),
    "hf-llama-kv3-tied": da.DecoderConfig(**HF, n_layers=3, n_kv_heads=3, norm="rmsnorm",
                                          mlp="swiglu", pos="rope", rope_theta=777.0,
                                          tie_embeddings=True),
    "hf-llama-kv2-rotate-half": da.DecoderConfig(**HF, n_layers=2, n_kv_heads=2, norm="rmsnorm",
                                                 mlp="swiglu", pos="rope", rope_theta=10000.0,
                                                 rope_layout="rotate_half",
                                                 tie_embeddings=False),
    # ---- routed families (helper fam-moe) ----
    # GLM-4.7-Flash / MiniCPM3: the latent norms on an eps of their own (transformers' 1e-6
    # beside the block norms' 1e-5; here 1e-2, so that the latents' mean square, ~6e-3 at
    # initialisation, feels it)
    "mla-latent-eps": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=3,
                                       d_ff=24, max_seq_len=7, norm="rmsnorm", mlp="swiglu",
                                       pos="rope", rope_layout="rotate_half", kv_latent_rank=10,
                                       q_latent_rank=9, rope_head_width=4, nope_head_width=6,
                                       value_head_width=5, latent_norm_eps=1e-2,
                                       tie_embeddings=True),
    # ---- position and norm placements (helper fam-positions) ----
    # BLOOM: ALiBi over 6 heads (not a power of two: Press's interleaved schedule), a norm of the
    # embeddings; MPT: ALiBi over 4 heads, LayerNorms without a shift, its own score scale;
    # XGLM: a sinusoidal table read from row t + 2 of an odd width, the embedding scaled;
    # GPT-1: post-norm blocks and no final norm; Persimmon: per-head LayerNorms of q and k
    # (BLOOM's, MPT's and GPT-1's MLPs are 4 D wide, so each family holds its config)
    "alibi-embedding-norm": da.DecoderConfig(vocab_size=13, d_model=18, n_layers=2, n_heads=6,
                                             d_ff=72, max_seq_len=6, norm="layernorm",
                                             mlp="gelu_tanh", pos="alibi", embedding_norm=True,
                                             attn_bias=True, mlp_bias=True, tie_embeddings=True),
    "alibi-no-shift": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                       d_ff=64, max_seq_len=6, norm="layernorm", norm_bias=False,
                                       mlp="gelu", pos="alibi", attn_scale=0.3,
                                       tie_embeddings=True),
    "sinusoidal-offset": da.DecoderConfig(vocab_size=13, d_model=15, n_layers=2, n_heads=3,
                                          d_ff=20, max_seq_len=6, norm="layernorm", mlp="gelu",
                                          pos="sinusoidal", position_offset=2,
                                          embedding_scale=15 ** 0.5, attn_bias=True,
                                          mlp_bias=True, tie_embeddings=True),
    "post-norm-no-final": da.DecoderConfig(vocab_size=13, d_model=12, n_layers=2, n_heads=3,
                                           d_ff=48, max_seq_len=5, norm="layernorm",
                                           mlp="gelu_tanh", pos="learned", pre_norm=False,
                                           post_norm=True, final_norm=False, attn_bias=True,
                                           mlp_bias=True, tie_embeddings=True),
    "qk-layernorm": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                     max_seq_len=6, norm="layernorm", mlp="relu2", pos="rope",
                                     rope_layout="rotate_half", rotary_dim=4, qk_norm=True,
                                     qk_norm_kind="layernorm", attn_bias=True, mlp_bias=True,
                                     tie_embeddings=False),
    # ---- attention sinks, the clamped SwiGLU, router and expert biases, q/k norms after RoPE,
    # position-scaled queries (helper fam-sinks) ----
    # Granite SWA / Flint: a sink logit per head in every softmax, layer 0 windowed to 3
    "sinks-windowed": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                       n_kv_heads=2, d_ff=24, max_seq_len=7, norm="rmsnorm",
                                       mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                       attn_sinks=True, sliding_window=3, window_layers=(0,),
                                       tie_embeddings=True),
    # GPT-OSS's block: sinks, biased attention, alternating windows, the router's bias, top 2
    # of 4 logits then their softmax, experts with biases on a clamped SwiGLU whose limit (0.05)
    # bites at initialisation
    "gpt-oss-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                     n_kv_heads=2, d_ff=24, max_seq_len=7, norm="rmsnorm",
                                     mlp="swiglu_clamped", swiglu_limit=0.05, pos="rope",
                                     rope_layout="rotate_half", attn_bias=True, attn_sinks=True,
                                     sliding_window=3, window_layers=(0,), n_experts=4,
                                     experts_per_token=2, expert_width=6,
                                     router_order="topk_score", router_bias=True,
                                     expert_bias=True, tie_embeddings=False),
    # Hunyuan: per-head q/k norms on the rotated heads, biased attention
    "qk-norm-after-rope": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                           n_kv_heads=2, d_ff=24, max_seq_len=6, norm="rmsnorm",
                                           mlp="swiglu", pos="rope", rope_layout="rotate_half",
                                           qk_norm=True, qk_norm_position="after_rope",
                                           attn_bias=True, tie_embeddings=False),
    # Ministral 3 / Llama 4: layer 0's queries times 1 + 0.5 ln(1 + floor((pos + 1) / 2))
    "query-position-scale": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                                             n_kv_heads=2, d_ff=24, max_seq_len=7,
                                             norm="rmsnorm", mlp="swiglu", pos="rope",
                                             rope_layout="rotate_half",
                                             query_position_scale={"beta": 0.5, "length": 2,
                                                                   "offset": 1, "layers": [0]},
                                             tie_embeddings=True),
    # Cohere 2 MoE: one shift-free LayerNorm before a parallel block, interleaved RoPE but in
    # the full NoPE layer 2, a dense first layer, top 2 of 4 logits then their softmax, one
    # shared expert averaged with the routed sum (both halved), logits times 0.25
    "cohere2-moe-like": da.DecoderConfig(vocab_size=13, d_model=16, n_layers=3, n_heads=4,
                                         n_kv_heads=2, d_ff=12, max_seq_len=7, norm="layernorm",
                                         norm_bias=False, mlp="swiglu", pos="rope",
                                         parallel_residual=True, shared_norm=True,
                                         sliding_window=3, window_layers=(1,), nope_layers=(2,),
                                         logit_scale=0.25, n_experts=4, experts_per_token=2,
                                         expert_width=8, n_shared_experts=1,
                                         router_order="topk_score", routed_scaling=0.5,
                                         shared_expert_scale=0.5, first_dense_layers=1,
                                         tie_embeddings=True),
}


def rope_only(head_dim: int, max_seq_len: int, rope_theta: float, n_heads: int = 1,
              ) -> da.DecoderConfig:
    """The smallest config whose RoPE table has this head width, length and base: for tests of
    `rope_rotations` / `apply_rope` on their own (its other widths are placeholders)."""
    return da.DecoderConfig(vocab_size=2, d_model=n_heads * head_dim, n_layers=1, n_heads=n_heads,
                            d_ff=2, max_seq_len=max_seq_len, pos="rope", rope_theta=rope_theta)


# ---- selection --------------------------------------------------------------------------------

def _all() -> dict[str, da.DecoderConfig]:
    return {**{entry.name: entry.config for entry in GRID}, **SPECIAL}


def named(name: str) -> da.DecoderConfig:
    """One config of the grid or the specials, by name."""
    known = _all()
    if name not in known:
        raise KeyError(f"no test config named {name!r}; known: {sorted(known)}")
    return known[name]


def entries(*names: str) -> list[Entry]:
    return [Entry(name, named(name)) for name in names]


def specials() -> list[Entry]:
    return [Entry(name, cfg) for name, cfg in SPECIAL.items()]


def everything() -> list[Entry]:
    """The grid and every special."""
    return grid() + specials()


def params(selection: Iterable[Entry]) -> list:
    """`pytest.param(config, id=name)` for each entry: `parametrize("cfg", params(...))`."""
    return [pytest.param(entry.config, id=entry.name) for entry in selection]


def ids(selection: Iterable[Entry]) -> list[str]:
    return [entry.name for entry in selection]
