"""Independent references of our Decoder, and the layouts other code writes, mapped to ours.

    oracle.py        the slow float64 oracle: per-head, per-query-row loops sharing no code with
                     model/; reads weights by name, one stage at a time
    torch_twin.py    the torch.nn twin (stock modules only) and weight transfer both ways
    hf.py            Hugging Face GPT-2 and Llama, both ways, in memory and as folders; whether the
                     oracle can read a Hugging Face model (`hf_reference`)
    hf_config.py     Hugging Face configs <-> DecoderConfig, and what is refused
    hf_weights.py    Hugging Face state dicts <-> our tensors (the rename tables, RoPE rows)
    hf_models.py     any Hugging Face model: loading a folder, and the facts its config declares
    hf_tokenizer.py  a checkpoint's tokenizer as Hugging Face reads it

`transformers` is imported only when an `hf` function runs (it is the optional extra `hf`).
"""
