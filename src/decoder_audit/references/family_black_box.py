"""The Hugging Face families left black-box on purpose, each with what its decoder has that no
DecoderConfig expresses (`hf.hf_reference` says why; docs/conformance.md lists them). A family
joins the families table (`families.FAMILIES`), and leaves this one, when a DecoderConfig
expresses it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_HYBRID = "recurrent, convolutional or linear-attention layers beside (or instead of) attention"
_ENCODER = ("an encoder block run causally: LayerNorm after each residual add (post-norm), an "
            "embedding LayerNorm, token-type embeddings, an MLM head transform before the readout")
_SEQ2SEQ = ("the decoder of an encoder-decoder family: cross-attention blocks, an embedding "
            "LayerNorm, positions offset by 2 or sinusoidal")
_SPARSE_INDEX = ("a learned indexer choosing each query's keys (DeepSeek sparse attention), "
                 "beside latent attention")
_GEMMA_3N = "key/value sharing across layers, per-layer inputs and AltUp (Gemma 3n, Gemma 4)"

_LLAMA4 = ("chunked attention (its RoPE layers read only their own attention_chunk_size block), "
           "a weightless L2 norm of q and k in its RoPE layers only, experts fed the router's "
           "score times the token (router weight on the input), and a query temperature counted "
           "in cache slots, not positions")

BLACK_BOX: Mapping[str, str] = MappingProxyType({
    # hybrids, recurrent and state-space models
    **{t: _HYBRID for t in (
        "mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm", "jamba", "bamba",
        "zamba", "zamba2", "falcon_h1", "granitemoehybrid", "nemotron_h", "olmo_hybrid",
        "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp",
        "qwen4_exp_text", "lfm2", "lfm2_moe", "lfm3", "kimi_linear", "minimax", "lara_mini",
        "bailing_hybrid", "inkling_text", "inkling2_text", "inkling2_loop_text")},
    # encoder blocks run causally, and seq2seq decoders
    **{t: _ENCODER for t in (
        "bert", "bert-generation", "camembert", "data2vec-text", "electra", "ernie",
        "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
        "xlm-roberta", "xlm-roberta-xl", "xmod", "xlm")},
    **{t: _SEQ2SEQ for t in (
        "bart", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart",
        "trocr", "whisper")},
    **{t: _SPARSE_INDEX for t in ("deepseek_v32", "glm_moe_dsa", "axk2", "dots3_note",
                                  "dots3_note_text", "minimax_m3_vl_text")},
    **{t: _GEMMA_3N for t in ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                              "gemma4_assistant", "gemma4_unified", "gemma4_unified_text",
                              "gemma4_unified_assistant")},
    "big_bird": "block-sparse attention", "bigbird_pegasus": "block-sparse attention",
    "reformer": "LSH and chunked attention", "prophetnet": "n-gram prediction streams",
    "xlnet": "two-stream permutation attention", "blt": "byte latent patches",
    "cpmant": "a relative-position bucket bias on the scores (T5-style), prompt embeddings",
    "ctrl": "sinusoidal positions (sines of the even columns, cosines of the odd ones)",
    "diffllama": "differential attention (two softmax maps subtracted with a learned lambda)",
    "doge": "dynamic-mask attention (a value-dependent bias on every key)",
    "dory": "nGPT's normalised residual (unit-norm interpolation) and shared keys and values",
    "jetmoe": "a mixture of attention heads (routed q and o projections)",
    "longcat_flash": "two attention and MLP sublayers per layer with a shortcut MoE and zero "
                     "experts",
    "zaya": "convolution-mixed queries and keys (CCA) and delayed recurrent values",
    "hrm_text": "two weight-shared stacks iterated in cycles",
    "deepseek_v4": "hyper-connections and compressed keys and values",
    "hy_v4": "hyper-connections and compressed keys and values",
    "bitnet": "ternary quantised weights and activations, and norms inside attention and MLP",
    "phimoe": "sparsemixer routing (a masked two-stage top 2) and LongRoPE scaling",
    "dbrx": "q, k and v clamped (clip_qkv), experts renormalised by a p-norm",
    "afmoe": "a gated attention output (the heads times a sigmoid of x) and NoPE layers",
    "laguna": "a gated attention output, heads per layer, a soft-capped router",
    "mimo_v2_flash": "value heads of another width, a value scale, windowed layers with their "
                     "own key/value heads, attention sinks in the windowed layers only",
    "beam": "a gated attention output, query scaling by position, a depth-scaled residual",
    "axk1": "a norm on the routed MLP's output only",
    "nanochat": "norms without gains, a norm of the embeddings, RoPE turned the other way",
    "modernbert-decoder": "an embedding norm, a readout transform (dense, GELU, LayerNorm), no "
                          "attention norm in layer 0",
    **{t: "cross-attention layers to image features" for t in ("mllama", "mllama_text_model")},
    "gpt_neox_japanese": "an attention output bias in the last layer only, no bias on any other "
                         "projection",
    "gemma3": "the text model inside an image-text model (Gemma3ForConditionalGeneration)",
    "fuyu": "the text model inside an image-text model (FuyuForCausalLM)",
    "phi4_multimodal": "modality adapters around the text model",
    "git": "an image encoder in front", "got_ocr2": "an image encoder in front",
    "moss_transcribe_diarize": "an audio encoder in front",
    "moshi": "multi-codebook audio streams", "musicgen": "multi-codebook audio streams",
    "musicgen_melody": "multi-codebook audio streams",
    "csm": "two stacks fed by audio codebooks",
    # what Llama 4 has beyond NoPE layers, position-scaled queries, shared experts and experts
    # stored in -> out (all expressed)
    **{t: _LLAMA4 for t in ("llama4_text", "llama4")},
})
"""model_type -> what its decoder has that no DecoderConfig expresses: the families audited
black-box on purpose (`hf.hf_reference` says why; docs/conformance.md lists them). A family
joins FAMILIES, and leaves this table, when a DecoderConfig expresses it."""

