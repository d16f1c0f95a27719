"""The layouts: where a decoder someone else wrote keeps each weight, by our canonical names
(`layout_types.Layout`). `layouts.detect` finds a module's layout from its parameter names, and
places its weights on a spec's canonical names (`layouts.Placement`).

Layouts detected from the parameter names (`detect`):
    decoder-audit       token_embeddings, layers.{i}.attn.q_proj, ffn.w1 ... (our names)
    nanoGPT / GPT-2     transformer.wte, transformer.h.{i}.attn.c_attn (q, k, v fused), mlp.c_fc;
                        nn.Linear (out, in) or GPT-2's Conv1D (in, out), decided from the shapes
    litgpt              transformer.wte, transformer.h.{i}.norm_1, attn.qkv (q, k, v stacked: all
                        query heads, then the key heads, then the value heads, as litgpt 0.5
                        splits them), mlp.fc_1/fc_2/proj (LLaMAMLP) or mlp.fc/proj (GptNeoxMLP)
    Hugging Face Llama  model.embed_tokens, model.layers.{i}.self_attn.q_proj, mlp.gate_proj ...
                        (Llama, Mistral, Qwen2, Qwen3, Gemma, StableLM and every class with these
                        names)
    Hugging Face MoE    the same, with the router mlp.gate, the experts mlp.experts.{e}.gate_proj
                        ... (transformers 4) or mlp.experts.gate_up_proj (E, 2 Fe, D) and
                        down_proj (E, D, Fe) (transformers 5), Qwen2-MoE's mlp.shared_expert and
                        shared_expert_gate; Mixtral's block_sparse_moe.experts.{e}.w1 before 5
    Hugging Face        latent attention (self_attn.q_a_proj, q_a_layernorm, q_b_proj or q_proj,
      DeepSeek          kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), the router
                        mlp.gate (V3's selection bias its buffer e_score_correction_bias),
                        mlp.shared_experts, the experts fused as transformers 5 keeps them
    Hugging Face        the same names, with pre_feedforward_layernorm and the sandwich norms
      Gemma 2 / OLMo 2  (post_attention_layernorm on the attention output)
    Hugging Face Phi-3  the same names, with q/k/v fused in self_attn.qkv_proj and the gate and
                        up projections in mlp.gate_up_proj
    Hugging Face        gpt_neox.embed_in, gpt_neox.layers.{i}.attention.query_key_value (q, k,
      GPT-NeoX          v fused head by head), mlp.dense_h_to_4h, lm_head (embed_out before
                        transformers 5)
    torchtune           tok_embeddings, layers.{i}.attn.q_proj, sa_norm.scale, mlp.w1, output
    LLMs-from-scratch   tok_emb, trf_blocks.{i}.att.W_query, norm1.scale/shift, ff.layers.0
                        (its GPTModel), ff.fc1/fc2/fc3 with norm1.weight (its Llama models), and
                        with norm1.scale and att.q_norm/k_norm.scale (its Qwen3Model)
    Hugging Face        Llama's names with a plain MLP (mlp.up_proj, mlp.down_proj)
      Nemotron
    torchtitan Llama 3  tok_embeddings, layers.{i}.attention.qkv_linear.wq/wk/wv or the fused
                        wqkv (rows KV group by KV group), attention.wo, attention_norm,
                        feed_forward.w1/w2/w3, ffn_norm, norm, lm_head (torchtitan 0.3)
    TransformerLens     embed.W_E, blocks.{i}.attn.W_Q (H, D, Dh), W_O (H, Dh, D), b_Q (H, Dh),
                        mlp.W_in (D, F), unembed.W_U (D, V) and its bias b_U (HookedTransformer)
    Hugging Face MoE    Llama's attention names with DeepSeek's MoE names (mlp.gate and its
      (DeepSeek's       e_score_correction_bias, mlp.shared_experts, fused experts); variants
      names), ...       with the selection bias held by the block (MiniMax-M2, HY-V3) or as
                        Ernie 4.5's (1, E) mlp.gate.moe_statics Parameter, GLM-4's sandwich
                        norms (Kolibri 1), OLMo 2's norms (FlexOlmo), Aria's router mlp.router
                        and its experts stored in -> out, GraniteMoE's block_sparse_moe router
                        and experts with the shared MLP's gate and up fused in input_linear
    Hugging Face        Llama's attention and norms with a plain MLP mlp.c_fc -> mlp.c_proj
      Starcoder2
    Hugging Face GLM    Llama's attention and norms, gate and up fused in mlp.gate_up_proj
    Hugging Face GLM-4  GLM's, with post_self_attn_layernorm and post_mlp_layernorm after the
                        sublayers (post_attention_layernorm stays the MLP's input norm)
    Hugging Face        Llama's names with post_norm1 and post_norm2 after the sublayers
      HyperCLOVAX
    Hugging Face        Llama's attention, attention_layernorm and feedforward_layernorm, a plain
      Apertus           MLP up_proj -> down_proj whose xIELU learns mlp.act_fn.alpha_p, alpha_n
    Hugging Face BLOOM  transformer.word_embeddings and its word_embeddings_layernorm,
                        h.{i}.self_attention.query_key_value (q, k, v fused head by head)
    Hugging Face MPT    transformer.wte, blocks.{i}.attn.Wqkv (q, k, v stacked), norm_1 (no shift)
    Hugging Face XGLM   model.embed_tokens, layers.{i}.self_attn_layer_norm, fc1, fc2
    Hugging Face        transformer.tokens_embed, positions_embed, h.{i}.attn.c_attn (Conv1D),
      OpenAI GPT        ln_1 and ln_2 after the adds, no final norm
    Hugging Face        model.layers.{i}.self_attn.query_key_value (head by head),
      Persimmon         q_layernorm, k_layernorm, mlp.dense_h_to_4h
and the GPT-style and routed families' own (GPT-Neo, OPT, BioGPT, GPT-J, CodeGen, Phi, Falcon,
GPT-OSS, Hunyuan, Cohere 2 MoE; GPT-BigCode's only where its family's entry names it: its names
and shapes are GPT-2's, its rows in another order). Each is found under a wrapper's prefix
(`model.`, `net.`), and also without its root module (`embed_tokens`,
`layers.{i}.self_attn.q_proj`, `norm`, `lm_head` at the top: `layouts.rootless`).
TransformerLens' names are placed by `layouts` itself; anything else takes a user function
(`weights_map=`): state dict -> {canonical name: tensor}.
"""

from __future__ import annotations

from .layout_types import Layout

_OURS = {part: part for part in ("ln1", "ln2", "ln1_post", "ln2_post", "attn", "attn.q_proj",
                                 "attn.k_proj", "attn.v_proj",
                                 "attn.output_proj", "attn.q_norm", "attn.k_norm", "ffn.w1",
                                 "ffn.w2", "ffn.w3",
                                 # routed experts (expert {e}) and latent attention
                                 "ffn.router", "ffn.shared_gate", "ffn.experts.{e}.w1",
                                 "ffn.experts.{e}.w2", "ffn.experts.{e}.w3", "ffn.shared.w1",
                                 "ffn.shared.w2", "ffn.shared.w3", "attn.q_a_proj", "attn.q_a_norm",
                                 "attn.q_b_proj", "attn.kv_a_proj", "attn.kv_a_norm",
                                 "attn.kv_b_proj", "ffn.act")}
_HF_LLAMA = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
             "attn": "self_attn",  # the attention module's own parameters: sinks
             "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
             "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.o_proj",
             "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
             "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj"}
# Llama's norms and attention without its MLP (families whose MLP is named otherwise)
_HF_LLAMA_ATTN = {k: v for k, v in _HF_LLAMA.items() if not k.startswith("ffn.")}
# transformers' routed layers (Mixtral from 5.0, Qwen2-MoE, Qwen3-MoE, OLMoE): the router in
# mlp.gate, Qwen2-MoE's shared expert and its gate; each expert a module of its own before
# transformers 5, all of them in two tensors from it (Layout.fused_experts)
_HF_MOE = {**_HF_LLAMA, "ffn.router": "mlp.gate", "ffn.shared.w1": "mlp.shared_expert.gate_proj",
           "ffn.shared.w3": "mlp.shared_expert.up_proj",
           "ffn.shared.w2": "mlp.shared_expert.down_proj",
           "ffn.shared_gate": "mlp.shared_expert_gate",
           "ffn.experts.{e}.w1": "mlp.experts.{e}.gate_proj",
           "ffn.experts.{e}.w3": "mlp.experts.{e}.up_proj",
           "ffn.experts.{e}.w2": "mlp.experts.{e}.down_proj"}
# DeepSeek-V2 and V3 (transformers 5): latent attention, the dense first layers' MLP in mlp.*,
# the routed layers' router in mlp.gate (V3's selection bias its buffer e_score_correction_bias),
# their shared experts as one MLP in mlp.shared_experts, the experts fused (Layout.fused_experts)
_HF_DEEPSEEK = {**{k: v for k, v in _HF_LLAMA.items() if not k.startswith("attn.")},
                "attn.q_proj": "self_attn.q_proj", "attn.q_a_proj": "self_attn.q_a_proj",
                "attn.q_a_norm": "self_attn.q_a_layernorm", "attn.q_b_proj": "self_attn.q_b_proj",
                "attn.kv_a_proj": "self_attn.kv_a_proj_with_mqa",
                "attn.kv_a_norm": "self_attn.kv_a_layernorm",
                "attn.kv_b_proj": "self_attn.kv_b_proj", "attn.output_proj": "self_attn.o_proj",
                "ffn.router": "mlp.gate", "ffn.shared.w1": "mlp.shared_experts.gate_proj",
                "ffn.shared.w3": "mlp.shared_experts.up_proj",
                "ffn.shared.w2": "mlp.shared_experts.down_proj",
                # releases whose experts are one module each, as _HF_MOE names them
                **{k: v for k, v in _HF_MOE.items() if k.startswith("ffn.experts.")}}
# ---- routed families (helper fam-moe) ----
_FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# Llama's attention (and q/k norms) with DeepSeek's MoE names: the router mlp.gate, the shared
# experts as one MLP in mlp.shared_experts, a dense layer's MLP in mlp.*, the experts fused
_HF_SHARED_EXPERTS = {**_HF_LLAMA, "ffn.router": "mlp.gate",
                      **{k: v for k, v in _HF_DEEPSEEK.items() if k.startswith("ffn.shared.")}}
_FROM_SCRATCH_ATTN = {"ln1": "norm1", "ln2": "norm2", "attn.q_proj": "att.W_query",
                      "attn.k_proj": "att.W_key", "attn.v_proj": "att.W_value",
                      "attn.output_proj": "att.out_proj"}

_LITGPT_ATTN = {"ln1": "norm_1", "ln2": "norm_2", "attn.output_proj": "attn.proj",
                "attn.q_norm": "attn.norm_q", "attn.k_norm": "attn.norm_k"}

# ---- GPT-style families (helper fam-gpt) ----
# fairseq's decoder layer (OPT, BioGPT): self_attn_layer_norm before attention,
# final_layer_norm before the MLP fc1 -> fc2
_FAIRSEQ = {"ln1": "self_attn_layer_norm", "ln2": "final_layer_norm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
            "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.out_proj",
            "ffn.w1": "fc1", "ffn.w2": "fc2"}
_GPTJ = {"ln1": "ln_1", "attn.output_proj": "attn.out_proj", "ffn.w1": "mlp.fc_in",
         "ffn.w2": "mlp.fc_out"}
_FALCON = {"attn.output_proj": "self_attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
           "ffn.w2": "mlp.dense_4h_to_h"}

LAYOUTS: tuple[Layout, ...] = (
    Layout("decoder-audit", "token_embeddings", "position_embeddings", "layers.{i}", "ln_final",
           "lm_head", _OURS),
    Layout("nanoGPT / GPT-2", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn"),
    Layout("litgpt (LLaMAMLP)", "transformer.wte", None, "transformer.h.{i}", "transformer.ln_f",
           "lm_head", _LITGPT_ATTN | {"ffn.w1": "mlp.fc_1", "ffn.w3": "mlp.fc_2",
                                      "ffn.w2": "mlp.proj"}, fused_qkv="attn.qkv"),
    Layout("litgpt (GptNeoxMLP)", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", _LITGPT_ATTN | {"ffn.w1": "mlp.fc", "ffn.w2": "mlp.proj"},
           fused_qkv="attn.qkv"),
    Layout("Hugging Face Llama", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_LLAMA),
    Layout("Hugging Face MoE", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_MOE, fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    Layout("Hugging Face DeepSeek", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_DEEPSEEK,
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
           selection_bias="e_score_correction_bias"),
    # Mixtral before transformers 5: block_sparse_moe, experts.{e}.w1 (gate), w3 (up), w2 (down)
    Layout("Hugging Face Mixtral (transformers 4)", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "block_sparse_moe.gate",
            **{f"ffn.experts.{{e}}.{w}": f"block_sparse_moe.experts.{{e}}.{w}"
               for w in ("w1", "w2", "w3")}}),
    # Gemma 2 and 3, OLMo 2: post_attention_layernorm is the attention output's norm
    # (ln1_post), not the MLP's input norm as in Llama
    Layout("Hugging Face Gemma 2 / OLMo 2", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "ln1_post": "post_attention_layernorm",
                       "ln2": "pre_feedforward_layernorm",
                       "ln2_post": "post_feedforward_layernorm"}),
    Layout("Hugging Face Phi-3", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
                       "attn.output_proj": "self_attn.o_proj", "ffn.w2": "mlp.down_proj"},
           fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj"),
    Layout("Hugging Face GPT-NeoX", "gpt_neox.embed_in", None, "gpt_neox.layers.{i}",
           "gpt_neox.final_layer_norm", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="attention.query_key_value",
           qkv_per_head=True, head_aliases=("embed_out",)),  # its head before transformers 5
    Layout("torchtune", "tok_embeddings", None, "layers.{i}", "norm", "output",
           {"ln1": "sa_norm", "ln2": "mlp_norm", "attn.q_proj": "attn.q_proj",
            "attn.k_proj": "attn.k_proj", "attn.v_proj": "attn.v_proj",
            "attn.output_proj": "attn.output_proj", "attn.q_norm": "attn.q_norm",
            "attn.k_norm": "attn.k_norm", "ffn.w1": "mlp.w1", "ffn.w2": "mlp.w2",
            "ffn.w3": "mlp.w3"}, norm_params=("scale", None)),
    Layout("LLMs-from-scratch GPT", "tok_emb", "pos_emb", "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "ffn.w1": "ff.layers.0", "ffn.w2": "ff.layers.2"},
           norm_params=("scale", "shift")),
    Layout("LLMs-from-scratch Llama", "tok_emb", None, "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "ffn.w1": "ff.fc1", "ffn.w3": "ff.fc2",
                        "ffn.w2": "ff.fc3"}, norm_params=("weight", None)),
    # its Qwen3Model: the Llama names, with its own RMSNorm (scale, and a shift it may have) and
    # the per-head q/k norms att.q_norm, att.k_norm
    Layout("LLMs-from-scratch Qwen3", "tok_emb", None, "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "attn.q_norm": "att.q_norm",
                        "attn.k_norm": "att.k_norm", "ffn.w1": "ff.fc1", "ffn.w3": "ff.fc2",
                        "ffn.w2": "ff.fc3"}, norm_params=("scale", "shift")),
    # Nemotron: Llama's names with a plain MLP, up_proj -> down_proj (no gate), and LayerNorm1P
    # norms (gain 1 + w: norm_offset 1)
    Layout("Hugging Face Nemotron", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**{k: v for k, v in _HF_LLAMA.items() if k != "ffn.w3"},
                       "ffn.w1": "mlp.up_proj"}),
    # torchtitan 0.3's Llama 3 (models/common/decoder.py): q/k/v in attention.qkv_linear, three
    # Linears (wq, wk, wv) or one fused wqkv whose rows go KV group by KV group (the group's
    # query heads, its key head, its value head); the head is lm_head (`output` before 0.3)
    Layout("torchtitan Llama 3", "tok_embeddings", None, "layers.{i}", "norm", "lm_head",
           {"ln1": "attention_norm", "ln2": "ffn_norm", "attn.q_proj": "attention.qkv_linear.wq",
            "attn.k_proj": "attention.qkv_linear.wk", "attn.v_proj": "attention.qkv_linear.wv",
            "attn.output_proj": "attention.wo", "attn.q_norm": "attention.q_norm",
            "attn.k_norm": "attention.k_norm", "ffn.w1": "feed_forward.w1",
            "ffn.w2": "feed_forward.w2", "ffn.w3": "feed_forward.w3"},
           fused_qkv="attention.qkv_linear.wqkv", qkv_per_head=True, norm_params=("weight", None)),
    # ---- GPT-style families (helper fam-gpt) ----
    # GPT-BigCode: GPT-2's names and c_attn's shape (an nn.Linear), its rows KV group by KV
    # group: with multi_query every q row then one k and one v head (GPT-2's order), without it
    # head by head (q, k, v of head 0, then head 1, ...). Named by its family's entry, never
    # detected: the names and shapes are GPT-2's, whose rows are q, k, v whole
    Layout("Hugging Face GPT-BigCode", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn",
           qkv_per_head=True, detected=False),
    Layout("Hugging Face GPT-Neo", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.q_proj": "attn.attention.q_proj",
            "attn.k_proj": "attn.attention.k_proj", "attn.v_proj": "attn.attention.v_proj",
            "attn.output_proj": "attn.attention.out_proj", "ffn.w1": "mlp.c_fc",
            "ffn.w2": "mlp.c_proj"}),
    # OPT and BioGPT: fairseq's names (their position tables keep two rows before position 0's:
    # the spec's position_offset)
    Layout("Hugging Face OPT", "model.decoder.embed_tokens", "model.decoder.embed_positions",
           "model.decoder.layers.{i}", "model.decoder.final_layer_norm", "lm_head", _FAIRSEQ),
    Layout("Hugging Face BioGPT", "biogpt.embed_tokens", "biogpt.embed_positions",
           "biogpt.layers.{i}", "biogpt.layer_norm", "output_projection", _FAIRSEQ),
    # GPT-J and CodeGen: one norm ln_1 in front of a parallel block; CodeGen fuses q, k, v in
    # qkv_proj as 4 shards (its mp_num) of q, v, k rows
    Layout("Hugging Face GPT-J", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", {**_GPTJ, "attn.q_proj": "attn.q_proj",
                                           "attn.k_proj": "attn.k_proj",
                                           "attn.v_proj": "attn.v_proj"}),
    Layout("Hugging Face CodeGen", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", _GPTJ, fused_qkv="attn.qkv_proj", qkv_shards=4,
           qkv_order=("q_proj", "v_proj", "k_proj")),
    Layout("Hugging Face Phi", "model.embed_tokens", None, "model.layers.{i}",
           "model.final_layernorm", "lm_head",
           {"ln1": "input_layernorm", "attn.q_proj": "self_attn.q_proj",
            "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
            "attn.output_proj": "self_attn.dense", "attn.q_norm": "self_attn.q_layernorm",
            "attn.k_norm": "self_attn.k_layernorm", "ffn.w1": "mlp.fc1", "ffn.w2": "mlp.fc2"}),
    # Falcon: query_key_value KV group by KV group (the new architecture's (Hkv, H/Hkv + 2, Dh);
    # multi_query's q, k, v is one group, the MHA's (H, 3, Dh) one group a head); its norms
    # input_layernorm (the only one of a parallel block that shares it) and
    # post_attention_layernorm, or ln_attn and ln_mlp beside each other (the new architecture's)
    Layout("Hugging Face Falcon", "transformer.word_embeddings", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {**_FALCON, "ln1": "input_layernorm", "ln2": "post_attention_layernorm"},
           fused_qkv="self_attention.query_key_value", qkv_per_head=True),
    Layout("Hugging Face Falcon (two parallel norms)", "transformer.word_embeddings", None,
           "transformer.h.{i}", "transformer.ln_f", "lm_head",
           {**_FALCON, "ln1": "ln_attn", "ln2": "ln_mlp"},
           fused_qkv="self_attention.query_key_value", qkv_per_head=True),
    # ---- routed families (helper fam-moe) ----
    # DeepSeek's MoE names behind Llama's attention (Dots1, GLM-4.5, Solar Open, EXAONE MoE)
    Layout("Hugging Face MoE, DeepSeek's names", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", _HF_SHARED_EXPERTS, fused_experts=_FUSED_EXPERTS,
           selection_bias="e_score_correction_bias"),
    # MiniMax-M2 and HY-V3: the selection bias a buffer of the block, handed to its router
    Layout("Hugging Face MoE, the selection bias on the block", "model.embed_tokens", None,
           "model.layers.{i}", "model.norm", "lm_head", _HF_SHARED_EXPERTS,
           fused_experts=_FUSED_EXPERTS, selection_bias_at="mlp.e_score_correction_bias"),
    # Ernie 4.5 MoE: the selection bias a (1, E) Parameter of the router's moe_statics
    Layout("Hugging Face Ernie 4.5 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", _HF_SHARED_EXPERTS, fused_experts=_FUSED_EXPERTS,
           selection_bias_at="mlp.gate.moe_statics.e_score_correction_bias"),
    # Kolibri 1: GLM-4's sandwich block (post_self_attn_layernorm on the attention output,
    # post_attention_layernorm the MLP's input norm, post_mlp_layernorm on its output)
    Layout("Hugging Face GLM-4 sandwich MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_SHARED_EXPERTS, "ln1_post": "post_self_attn_layernorm",
            "ln2_post": "post_mlp_layernorm"}, fused_experts=_FUSED_EXPERTS,
           selection_bias="e_score_correction_bias"),
    # FlexOlmo: OLMo 2's norms after the sublayers, OLMoE's router and experts
    Layout("Hugging Face OLMo 2 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_MOE, "ln1_post": "post_attention_layernorm", "ln2": "pre_feedforward_layernorm",
            "ln2_post": "post_feedforward_layernorm"}, fused_experts=_FUSED_EXPERTS),
    # Aria's text model: the router mlp.router, the experts stored in -> out
    Layout("Hugging Face Aria", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_SHARED_EXPERTS, "ffn.router": "mlp.router"},
           fused_experts=_FUSED_EXPERTS, experts_transposed=True),
    # GraniteMoE (and GraniteMoeShared): block_sparse_moe's router and fused experts, the shared
    # MLP's gate and up rows fused in shared_mlp.input_linear
    Layout("Hugging Face GraniteMoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "block_sparse_moe.router",
            "ffn.shared.w2": "shared_mlp.output_linear"},
           fused_experts=("block_sparse_moe.experts.gate_up_proj",
                          "block_sparse_moe.experts.down_proj"),
           fused_shared_gate_up="shared_mlp.input_linear"),
    # ---- dense Llama-named families (helper fam-llama) ----
    # Starcoder2: Llama's attention, a plain MLP c_fc -> c_proj, LayerNorms with a shift
    Layout("Hugging Face Starcoder2", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}),
    # GLM: Llama's attention, Phi-3's MLP (gate rows then up rows in mlp.gate_up_proj)
    Layout("Hugging Face GLM", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w2": "mlp.down_proj"},
           fused_gate_up="mlp.gate_up_proj"),
    # GLM-4: GLM's with sandwich norms; post_attention_layernorm keeps Llama's meaning (the
    # MLP's input norm), the sublayers' outputs normalised by post_self_attn / post_mlp
    Layout("Hugging Face GLM-4", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w2": "mlp.down_proj",
                       "ln1_post": "post_self_attn_layernorm", "ln2_post": "post_mlp_layernorm"},
           fused_gate_up="mlp.gate_up_proj"),
    # HyperCLOVAX: Llama's names with its post norms (post_norm1 after attention, post_norm2
    # after the MLP)
    Layout("Hugging Face HyperCLOVAX", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", {**_HF_LLAMA, "ln1_post": "post_norm1",
                                     "ln2_post": "post_norm2"}),
    # Apertus: Llama's attention (q/k norms), its own norms' names, a plain MLP whose xIELU
    # learns alpha_p and alpha_n
    Layout("Hugging Face Apertus", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ln1": "attention_layernorm",
                       "ln2": "feedforward_layernorm", "ffn.w1": "mlp.up_proj",
                       "ffn.w2": "mlp.down_proj", "ffn.act": "mlp.act_fn"}),
    # ---- position and norm placements (helper fam-positions) ----
    # BLOOM: q, k, v fused head by head ((H, 3, Dh) rows, as GPT-NeoX), its embedding norm
    Layout("Hugging Face BLOOM", "transformer.word_embeddings", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "self_attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="self_attention.query_key_value",
           qkv_per_head=True, embedding_norm="transformer.word_embeddings_layernorm"),
    # MPT: q, k, v stacked in Wqkv (all q rows, then k, then v: its chunk(3)); norms without a
    # shift (their bias set to None)
    Layout("Hugging Face MPT", "transformer.wte", None, "transformer.blocks.{i}",
           "transformer.norm_f", "lm_head",
           {"ln1": "norm_1", "ln2": "norm_2", "attn.output_proj": "attn.out_proj",
            "ffn.w1": "ffn.up_proj", "ffn.w2": "ffn.down_proj"}, fused_qkv="attn.Wqkv"),
    # XGLM (fairseq's names): the norms before attention and the MLP, fc1 / fc2
    Layout("Hugging Face XGLM", "model.embed_tokens", None, "model.layers.{i}", "model.layer_norm",
           "lm_head",
           {"ln1": "self_attn_layer_norm", "ln2": "final_layer_norm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
            "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.out_proj",
            "ffn.w1": "fc1", "ffn.w2": "fc2"}),
    # GPT-1: GPT-2's block names and Conv1D weights, its own embedding names, no final norm
    Layout("Hugging Face OpenAI GPT", "transformer.tokens_embed", "transformer.positions_embed",
           "transformer.h.{i}", None, "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn"),
    # Persimmon: Llama's norm names, q, k, v fused head by head, per-head q/k LayerNorms
    Layout("Hugging Face Persimmon", "model.embed_tokens", None, "model.layers.{i}",
           "model.final_layernorm", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "self_attn.dense", "attn.q_norm": "self_attn.q_layernorm",
            "attn.k_norm": "self_attn.k_layernorm", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="self_attn.query_key_value",
           qkv_per_head=True),
    # ---- GPT-OSS, Hunyuan, Cohere 2 MoE (helper fam-sinks) ----
    # GPT-OSS: the router mlp.router (weight and bias), the experts fused in -> out with
    # interleaved gate/up units and their biases; sinks under self_attn (as _HF_LLAMA's)
    Layout("Hugging Face GPT-OSS", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "ffn.router": "mlp.router"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
           experts_transposed=True, gate_up_interleaved=True,
           fused_expert_biases=("mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias")),
    # Hunyuan: per-head q/k norms named query_layernorm / key_layernorm; its MoE layers' router
    # mlp.gate.wg, shared MLP mlp.shared_mlp, experts fused as transformers 5 keeps them
    Layout("Hugging Face Hunyuan", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "attn.q_norm": "self_attn.query_layernorm",
                       "attn.k_norm": "self_attn.key_layernorm", "ffn.router": "mlp.gate.wg",
                       "ffn.shared.w1": "mlp.shared_mlp.gate_proj",
                       "ffn.shared.w3": "mlp.shared_mlp.up_proj",
                       "ffn.shared.w2": "mlp.shared_mlp.down_proj"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    # Cohere 2 MoE: Llama's attention names, one norm (input_layernorm), the router mlp.gate,
    # the shared experts as one MLP in mlp.shared_experts, the experts fused
    Layout("Hugging Face Cohere 2 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "mlp.gate",
            "ffn.shared.w1": "mlp.shared_experts.gate_proj",
            "ffn.shared.w3": "mlp.shared_experts.up_proj",
            "ffn.shared.w2": "mlp.shared_experts.down_proj"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
)
