"""Text and the ids a model reads.

    tokenizer.py   one Tokenizer over four kinds (tiny-vocab, bytes, tokenizer.json, GPT-2 BPE),
                   the files they are read from, and the tiny teaching vocabulary
    tasks.py       training tasks: the counting task, byte-level and tokenized text
    datasets.py    prepared token datasets: `prepare_dataset` writes one, `TokenDataset` reads it
"""
