"""Bugs the museum's authors read and did not rebuild, each with why (below the declared floor,
no fixed release to be the control, fixed before any release, not a decoder a user audits, ...):
listed on docs/museum.md so that nobody reads them again for nothing. (ref, why)."""

from __future__ import annotations

NOT_REBUILT: tuple[tuple[str, str], ...] = (
    ("huggingface/transformers#28980 (fix #30127, 4.40.0)",
     "Mistral's SDPA path without its window: rebuilt and shown (4.39.3 reads token 0 past the "
     "window), but below the declared floor, where the gate does not run even with branch "
     "range (its floor is 4.45), so not a row"),
    ("huggingface/transformers#32330, #29402, #21381, #26221",
     "llama3 RoPE frequencies (4.43), Gemma's exact GELU (4.38), reentrant checkpointing with "
     "frozen inputs (4.2x-4.35): all fixed below the declared floor"),
    ("huggingface/transformers#34191, #35438, #37766",
     "the Trainer's normalisation under gradient accumulation: the Trainer's code, not the "
     "model's; the model's half is rebuilt (gpt-neox-items-dropped, xglm-items-dropped, "
     "mamba-items-dropped)"),
    ("huggingface/transformers#23530, huggingface/trl#3067, #1230, #2834",
     "labels built by a collator, packing done by TRL's trainer: data and trainer code, which "
     "audit_batch and the packing check see, not a decoder release"),
    ("huggingface/transformers#46634",
     "a 2-D all-ones attention_mask disables packed-sequence detection: the PR was closed "
     "unmerged and the leak is in every release through 5.24, so there is no fixed release to "
     "be the control"),
    ("position ids only, default use_cache (found here)",
     "Llama with packed rows told apart by position ids and the default use_cache leaks across "
     "documents in every release through 5.24 (the cache turns the boundary detection off): no "
     "fixed release; the use_cache=False form is the row llama-packed-position-ids"),
    ("modelscope/ms-swift#9618",
     "Qwen3.5 / Qwen3-Next gated-delta-net layers leak across packed documents: measured here "
     "on the CPU torch path in 5.8.1 through 5.24 (0.023 with use_cache=False), no fixed release"),
    ("huggingface/transformers#42801, #31887 (flash-attention soft-cap)",
     "flash-attention kernels (packed position ids, soft-capping): GPU-only kernels, not "
     "installable here"),
    ("sgl-project/sglang#33915, #33558, #22711; vllm-project/vllm#41236, #43770, #16976",
     "inference servers and their GPU kernels (YaRN mscale, dynamic NTK, partial rotary, a "
     "doubled BOS): not a decoder a user audits with da.audit, and not runnable on CPU"),
    ("lucidrains/x-transformers#311",
     "cached decoding of a cross-attending decoder: an encoder-decoder, outside the gate's "
     "decoder-only contract"),
    ("TransformerLensOrg/TransformerLens#1681",
     "Gemma-2 windowed on the wrong half of its layers, T5's unmasked decoder: in the "
     "conversion of a hub checkpoint's config (from_pretrained), which needs the checkpoint"),
    ("huggingface/transformers#39581",
     "Ernie 4.5 MoE's selection bias (moe_statics) added to the routing weights: fixed before "
     "the first release holding the family (4.54.0 already gathers the unbiased weights)"),
    ("huggingface/transformers#41647, #41663",
     "DeepSeek-V3's and Dots1's gating weights taken from the biased scores (introduced by "
     "#40132): fixed on main before any release (4.57.x and 5.0.0 gather the unbiased scores)"),
    ("huggingface/transformers#45945, allenai/OLMo-core#685",
     "OLMo 3's YaRN applied to its windowed layers too: the PR was closed unmerged, the code is "
     "unchanged through 5.25, and whether the windowed layers should be scaled is disputed "
     "(vllm-project/vllm#43419): no fixed release"),
    ("huggingface/transformers#43756",
     "SmolLM3's no_rope_layers read as use_rope: open, the convention disputed, no release "
     "changes it"),
    ("huggingface/transformers#36150",
     "cited in DEFECTS.md as a config field ignored by a backend; not reproduced in the time "
     "given"),
)
