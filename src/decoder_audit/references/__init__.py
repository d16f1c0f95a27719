"""Independent references of our Decoder, and the layouts other code writes, mapped to ours.

    oracle.py        the slow float64 oracle: per-head, per-query-row loops sharing no code with
                     model/; reads weights by name, one stage at a time
    torch_twin.py    the torch.nn twin (stock modules only) and weight transfer both ways
    hf.py            Hugging Face GPT-2 and Llama, both ways, in memory and as folders; whether the
                     oracle can read a Hugging Face model (`hf_reference`)
    hf_config.py     Hugging Face configs <-> DecoderConfig, and what is refused
    families.py      the families table (FAMILIES): every family read as a spec, in the writer's
                     order; its entries written by group in families_llama.py (Llama's block
                     under other names), families_gpt.py (GPT-style blocks, other positions and
                     norm placements), families_routed.py (routed experts),
                     families_latent.py (DeepSeek's latent attention)
    family_entry.py  an entry of the table (`Family`, `llama()`), Llama's defaults, `takes`
    family_errors.py the two ways a family's config fails to be read
    family_black_box.py  the families left black-box on purpose, with what they lack
    hf_weights.py    Hugging Face state dicts <-> our tensors (the rename tables, RoPE rows)
    hf_models.py     any Hugging Face model: loading a folder, and the facts its config declares
    hf_tokenizer.py  a checkpoint's tokenizer as Hugging Face reads it

`transformers` is imported only when an `hf` function runs (it is the optional extra `hf`).
"""
