"""Independent references of our Decoder, and the layouts other code writes, mapped to ours.

    oracle.py        the slow float64 oracle: per-head, per-query-row loops sharing no code with
                     model/; reads weights by name, one stage at a time
    torch_twin.py    the torch.nn twin (stock modules only) and weight transfer both ways

Hugging Face models:
    hf.py            Hugging Face GPT-2 and Llama, both ways, in memory and as folders; whether the
                     oracle can read a Hugging Face model (`hf_reference`)
    hf_config.py     Hugging Face configs <-> DecoderConfig (the one reader), and what is refused
    hf_rope.py       RoPE in a config, both ways, in every form the releases hold it
    hf_windows.py    the sliding windows a config declares, layer by layer
    hf_latent.py     latent attention's families (DeepSeek) read as DecoderConfig fields
    hf_families.py   a family's model both ways through the layouts (the writer: the entry read
                     backwards)
    hf_weights.py    Hugging Face state dicts <-> our tensors (the rename tables, RoPE rows)
    hf_models.py     any Hugging Face model: loading a folder, and the facts its config declares
    hf_caches.py     the caches a caller builds for a Hugging Face model before its first step
    hf_tokenizer.py  a checkpoint's tokenizer as Hugging Face reads it

The families table:
    families.py      FAMILIES: every family read as a spec, in the writer's order
    family_entry.py  an entry (`Family`, `llama()`), Llama's defaults, the shared activations
    families_llama.py    Llama's block under other names (Qwen2, Gemma, Granite, Cohere, ...)
    families_gpt.py      GPT-style blocks (GPT-2, GPT-NeoX, OPT, Falcon, ...), other positions and
                         norm placements (BLOOM, MPT, XGLM, GPT-1, Persimmon)
    families_routed.py   routed experts behind Llama's attention (Mixtral, Qwen-MoE, GPT-OSS, ...)
    families_latent.py   DeepSeek's latent attention (DeepSeek V2 / V3, MiniCPM3, ...)
    family_errors.py     the two ways a family's config fails to be read
    family_black_box.py  the families left black-box on purpose, with what they lack

Where a module someone else wrote keeps each weight of a declared spec:
    layouts.py       `detect` and `place`: a `Placement` of views of its tensors
    layout_table.py  LAYOUTS: nanoGPT, litgpt, the Hugging Face families, torchtune, torchtitan, ...
    layout_types.py  `Layout` (one way of naming a decoder's weights), `Spot` (where one lies)
    spec_weights.py  the canonical weights a spec has (`expected_weights`), and what misfits
    weights_map.py   a user's weights_map, run guarded

Peer libraries' models read as a spec:
    peer_configs.py  `peer_spec`: TransformerLens, litgpt, nanoGPT, torchtune, x-transformers
    peer_torchtune.py, peer_xtransformers.py   the readers of the two that keep no config
    peer_record.py   what reading one gives (`PeerSpec`)

`transformers` is imported only when an `hf` function runs (it is the optional extra `hf`).
"""
