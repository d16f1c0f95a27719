"""The museum's models: each builder makes one tiny random-init model in the release it runs
under (the buggy one or its first fixed one: the same code builds both), seeded, on CPU.

A builder returns the model and its vocabulary V. It runs inside a release's environment, so it
imports only that release's library and torch, and writes code that reads the same on both
releases of its entry (the fields a config takes are given by name, never by position).

Sizes: hidden 32, 4 heads (2 key/value heads where the family has GQA), 2 layers unless the
symptom needs one (a window is read from a single layer), V = 96.
"""

from __future__ import annotations

import torch
from torch import nn

V = 96
HIDDEN = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _seeded(make) -> nn.Module:
    torch.manual_seed(0)
    return make()


def _hf(family: str, *, layers: int = 2, attn: str | None = None, **fields) -> nn.Module:
    """transformers' `{family}ForCausalLM` over `{family}Config(**HIDDEN, **fields)`, built with
    the attention implementation `attn` (None: the release's default, what a user gets)."""
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=V, num_hidden_layers=layers, **{**HIDDEN, **fields})
    if attn is not None:
        config._attn_implementation = attn
    return _seeded(lambda: getattr(transformers, f"{family}ForCausalLM")(config))


# --- transformers: BERT-style encoders used as causal decoders (is_decoder=True) --------------

def roformer_decoder():
    return _hf("RoFormer", is_decoder=True, embedding_size=32), V


def megatron_bert_decoder():
    return _hf("MegatronBert", is_decoder=True), V


def bigbird_decoder():
    return _hf("BigBird", is_decoder=True, attention_type="original_full"), V


def rembert_decoder():
    return _hf("RemBert", is_decoder=True, input_embedding_size=16, output_embedding_size=16), V


# --- transformers: windowed attention (one layer: its window is read directly) -------------
WINDOW = 4  # keys a windowed query reads, its own included


def phi3_windowed():
    return _hf("Phi3", layers=1, num_key_value_heads=2, sliding_window=WINDOW), V


def qwen2_windowed():
    """Qwen2 with its window switched on for every layer (max_window_layers=0 full layers)."""
    return _hf("Qwen2", layers=1, num_key_value_heads=2, sliding_window=WINDOW,
               use_sliding_window=True, max_window_layers=0), V


def qwen2_full_declared():
    """Qwen2 with its window switched on but layer 0 below max_window_layers=1: declared full
    attention (windowed layers are those at index >= max_window_layers)."""
    return _hf("Qwen2", layers=1, num_key_value_heads=2, sliding_window=WINDOW,
               use_sliding_window=True, max_window_layers=1), V


def qwen3_full_declared():
    """Qwen3, declared as qwen2_full_declared."""
    return _hf("Qwen3", layers=1, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
               use_sliding_window=True, max_window_layers=1), V


def starcoder2_windowed():
    return _hf("Starcoder2", layers=1, num_key_value_heads=2, sliding_window=WINDOW), V


def gemma2_windowed():
    """Gemma 2's alternation: layer 0 windowed, layer 1 full."""
    return _hf("Gemma2", num_key_value_heads=2, head_dim=8, sliding_window=WINDOW), V


def opt_lm():
    return _hf("OPT", ffn_dim=64, word_embed_proj_dim=32), V


def gpt_bigcode_lm():
    """StarCoder's block (multi-query attention: one key/value head)."""
    return _hf("GPTBigCode", n_embd=32, n_head=4, n_inner=64, n_layer=2, n_positions=128), V


def phi_lm():
    """Phi-1/1.5/2's block (parallel attention and MLP, partial rotary, a readout bias)."""
    return _hf("Phi", num_key_value_heads=4), V


def cohere2_windowed():
    """Cohere 2's alternation (sliding_window_pattern 2): layer 0 windowed, layer 1 full."""
    return _hf("Cohere2", num_key_value_heads=2, sliding_window=WINDOW,
               sliding_window_pattern=2), V


def vaultgemma_lm():
    """VaultGemma: Gemma 2's soft-capped attention (attn_logit_softcapping 50 by default)."""
    return _hf("VaultGemma", num_key_value_heads=2, head_dim=8), V


def nemotron_lm():
    return _hf("Nemotron", num_key_value_heads=2), V


# --- transformers: hybrid Mamba-2 / attention decoders ----------------------------------------
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
              mamba_chunk_size=4, mamba_expand=2, mamba_d_conv=4)


def granite_moe_hybrid_lm():
    """Layer 0 a Mamba-2 mixer, layer 1 attention; 4 experts, 2 per token."""
    return _hf("GraniteMoeHybrid", num_key_value_heads=2, layer_types=["mamba", "attention"],
               num_local_experts=4, num_experts_per_tok=2, **MAMBA2), V


def nemotron_h_lm():
    """hybrid_override_pattern "M*": a Mamba-2 layer, then an attention layer."""
    return _hf("NemotronH", num_key_value_heads=2, hybrid_override_pattern="M*",
               mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=1,
               chunk_size=4, **MAMBA2), V


def zamba2_lm():
    """A Mamba-2 layer, then a hybrid layer (Mamba-2 with the shared attention block)."""
    return _hf("Zamba2", num_key_value_heads=2, mamba_headdim=16, n_mamba_heads=4,
               layers_block_type=["mamba", "hybrid"], **MAMBA2), V


# --- transformers: routed experts ------------------------------------------------------------
EXPERTS = dict(num_key_value_heads=2, num_experts_per_tok=2)  # 4 experts, 2 chosen per token


def mixtral_moe():
    return _hf("Mixtral", num_local_experts=4, **EXPERTS), V


def flex_olmo_moe():
    return _hf("FlexOlmo", num_experts=4, **EXPERTS), V


def glm4_moe_grouped():
    """GLM-4.5's MoE (Glm4Moe) routing by groups: 4 experts in 2 groups, the best group chosen
    per token, then 2 experts inside it; every layer routed, one shared expert. The selection
    bias (e_score_correction_bias, zeros at init) is set below zero as an aux-loss-free balancer
    leaves it when it has pushed down overloaded experts: sigmoid(logit) + bias < 0."""
    model = _hf("Glm4Moe", head_dim=8, n_routed_experts=4, n_group=2,
                topk_group=1, first_k_dense_replace=0, n_shared_experts=1,
                moe_intermediate_size=16, **EXPERTS)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.copy_(torch.linspace(-1.2, -0.8, 4))
    return model, V


def minimax_m2_legacy_rotary():
    """MiniMax-M2 configured as its released checkpoints' config.json says it: partial RoPE
    given by the legacy field rotary_dim (here 4 of head_dim 8; the checkpoints: 64 of 128)."""
    return _hf("MiniMaxM2", head_dim=8, rotary_dim=4, num_local_experts=4, **EXPERTS), V


# --- transformers: the loss a model computes from labels= -----------------------------------

def bloom_lm():
    return _hf("Bloom"), V


def xglm_lm():
    return _hf("XGLM", d_model=32, ffn_dim=64, attention_heads=4, num_layers=2), V


def gpt_neox_lm():
    return _hf("GPTNeoX"), V


def mamba_lm():
    return _hf("Mamba", state_size=4, expand=2), V


def llama_lm():
    return _hf("Llama", num_key_value_heads=2), V


def llama_padding_free():
    """A Llama as padding-free trainers run it: no cache (config.use_cache=False), so the
    documents of a row are told apart by its position ids alone."""
    return _hf("Llama", num_key_value_heads=2, use_cache=False), V


# --- litgpt -----------------------------------------------------------------------------------

def litgpt_gemma_windowed():
    """A Gemma-style litgpt GPT whose layer 0 is windowed (sliding_window_indices [1, 0])."""
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(name="museum-tiny", block_size=64, vocab_size=V, padded_vocab_size=V,
                    n_layer=2, n_head=4, n_query_groups=2, n_embd=32, head_size=8,
                    intermediate_size=64, mlp_class_name="GemmaMLP", norm_class_name="RMSNorm",
                    bias=False, parallel_residual=False, rotary_percentage=1.0,
                    sliding_window_size=WINDOW, sliding_window_indices=[1, 0])
    return _seeded(lambda: GPT(config)), V


# --- TransformerLens --------------------------------------------------------------------------

def lens_alibi():
    """A HookedTransformer with ALiBi positions (the Bloom family's), built from its config."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    config = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_head=8, n_heads=4,
                                     d_mlp=64, d_vocab=V, act_fn="gelu", normalization_type="LN",
                                     positional_embedding_type="alibi", device="cpu", seed=0)
    return _seeded(lambda: HookedTransformer(config)), V


# --- x-transformers ---------------------------------------------------------------------------

def x_transformers_qk_norm_dim_scale():
    """A decoder with qk-norm and its learned per-dimension scales (attn_qk_norm_dim_scale)."""
    import x_transformers as xt

    def make():
        layers = xt.Decoder(dim=32, depth=2, heads=4, rotary_pos_emb=True, attn_qk_norm=True,
                            attn_qk_norm_dim_scale=True)
        return xt.TransformerWrapper(num_tokens=V, max_seq_len=64, attn_layers=layers,
                                     use_abs_pos_emb=False)
    return _seeded(make), V
