"""The configurable pre-norm causal decoder, read top to bottom.

    decoder.py     Decoder: ids (B, T) -> logits (B, T, V); the MLP, the block, the input contract
    attention.py   grouped-query causal attention and RoPE: the fused and the eager path
    layers.py      the parameterised primitives (Linear, Embedding, LayerNorm, RMSNorm)
    cache.py       the static KV cache and the masks of the generation path
    trace.py       the named trace sites and their declared shapes (the shape ledger)
    presets.py     the named configurations, from tiny-368 to GPT-2 XL and Llama shapes
"""
