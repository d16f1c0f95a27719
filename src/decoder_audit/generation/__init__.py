"""Continuing prompts: how a model is called step by step, and generation itself.

    convention.py  the call conventions (our Decoder, Hugging Face, plain), `Stepper`, which feeds
                   a padded batch through a cache, and where a padded row's positions start
    generate.py    `generate`: ragged prompts, the KV cache, greedy, temperature, top-k, top-p
"""
