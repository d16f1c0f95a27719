"""A tiny Llama, a word-level tokenizer and random documents, so each example here runs on a
laptop CPU in seconds. Replace them with your model, tokenizer and data."""

from __future__ import annotations

import torch
import transformers as tf

V = 37  # 36 words and </s>
EOS = V - 1


def tiny_llama(**config) -> tf.LlamaForCausalLM:
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        eos_token_id=EOS, bos_token_id=None, pad_token_id=None, use_cache=False, **config))


def tokenizer(*, pad_is_eos: bool = False) -> tf.PreTrainedTokenizerFast:
    import tokenizers

    words = [f"w{i}" for i in range(V - 1)] + ["</s>"]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    tok.pad_token = tok.eos_token if pad_is_eos else "w0"
    return tok


def documents(count: int = 32, seed: int = 0, lengths: tuple[int, int] = (6, 12)) -> list[dict]:
    """Documents of 6 to 12 (or `lengths`) random words, each ended by </s>, as token ids."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=gen).tolist()
    return [{"input_ids": torch.randint(1, EOS, (n - 1,), generator=gen).tolist() + [EOS]}
            for n in lengths]
