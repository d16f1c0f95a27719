"""A checkpoint's tokenizer as Hugging Face reads it: the files `convert --to-hf` writes beside the
weights, so that `AutoTokenizer.from_pretrained(folder)` loads it offline, and the check that it
does (the same ids as ours on a probe text, the same end token).

What is written: the tokenizer's own defining files verbatim (tokenizer.json, or GPT-2's
vocab.json + merges.txt), special_tokens_map.json when it has one, and tokenizer_config.json: the
one it carries, with two keys added where absent. `tokenizer_class`, because without it
AutoTokenizer picks the class from the model's type, and a Llama folder's class cannot read
GPT-2's files; `eos_token`, so Hugging Face's end token is ours. The built-in tokenizers ("bytes",
"tiny-vocab") have no Hugging Face file and are not copied (`hf_tokenizer_files` says so).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..text.tokenizer import Tokenizer, read_json

# The class that reads each kind's files in transformers 4 and 5 alike (5 maps both names to its
# tokenizers-backed classes).
TOKENIZER_CLASS = {"tokenizer.json": "PreTrainedTokenizerFast", "gpt2-bpe": "GPT2TokenizerFast"}
CONFIG_FILE = "tokenizer_config.json"
# Words, digits, punctuation, a newline, a tab and bytes outside ASCII: a text that every merge
# table and byte fallback has something to say about.
PROBE_TEXT = "Hello, world! 12345 the cat\n\tsat on the mat: café, naïve ✓ 日本"


class TokenizerMismatch(Exception):
    """The tokenizer Hugging Face reads from the written folder is not the checkpoint's."""


def hf_tokenizer_files(tokenizer: Tokenizer) -> tuple[dict[str, bytes], str | None]:
    """name -> bytes of the files that make `tokenizer` a Hugging Face tokenizer, and None; or
    no files and why it cannot be copied."""
    if tokenizer.kind not in TOKENIZER_CLASS:
        return {}, (f"tokenizer {tokenizer.name} is built in and has no Hugging Face file; it was "
                    "not copied")
    defining = ("tokenizer.json",) if tokenizer.kind == "tokenizer.json" else (
        "vocab.json", "merges.txt")
    files = {name: tokenizer.files[name] for name in defining}
    if "special_tokens_map.json" in tokenizer.files:
        files["special_tokens_map.json"] = tokenizer.files["special_tokens_map.json"]
    files[CONFIG_FILE] = _tokenizer_config(tokenizer)
    return files, None


def _tokenizer_config(tokenizer: Tokenizer) -> bytes:
    """The tokenizer's own tokenizer_config.json (or {}) with tokenizer_class and eos_token added
    where it names none."""
    config: Any = {}
    if CONFIG_FILE in tokenizer.files:
        config = read_json(tokenizer.files[CONFIG_FILE], f"{CONFIG_FILE} of {tokenizer.name}")
        if not isinstance(config, dict):
            raise ConfigError(f"{CONFIG_FILE} of {tokenizer.name} must hold a JSON object, got "
                              f"{type(config).__name__}")
    config.pop("auto_map", None)  # never a pointer to code: the written folder loads without any
    config.setdefault("tokenizer_class", TOKENIZER_CLASS[tokenizer.kind])
    if tokenizer.eos_token is not None:
        config.setdefault("eos_token", tokenizer.eos_token)
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()


def check_hf_tokenizer(folder: str | Path, tokenizer: Tokenizer, transformers: Any) -> None:
    """TokenizerMismatch unless `AutoTokenizer.from_pretrained(folder)` (offline) encodes and
    decodes PROBE_TEXT as `tokenizer` does and has its end token."""
    try:
        theirs = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                            trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for unreadable files
        raise TokenizerMismatch(f"AutoTokenizer cannot load the written tokenizer: "
                                f"{type(exc).__name__}: {exc}") from exc
    text = PROBE_TEXT
    if tokenizer.eos_token is not None:
        text += tokenizer.eos_token
    ours_ids, their_ids = tokenizer.encode(text), list(theirs(text)["input_ids"])
    if ours_ids != their_ids:
        raise TokenizerMismatch(f"Hugging Face encodes {text!r} as {their_ids}, ours as "
                                f"{ours_ids}")
    if theirs.decode(their_ids) != tokenizer.decode(ours_ids):
        raise TokenizerMismatch(f"Hugging Face decodes {their_ids} as "
                                f"{theirs.decode(their_ids)!r}, ours as "
                                f"{tokenizer.decode(ours_ids)!r}")
    if tokenizer.eos_id is not None and theirs.eos_token_id != tokenizer.eos_id:
        raise TokenizerMismatch(f"Hugging Face's end token is id {theirs.eos_token_id}, ours "
                                f"{tokenizer.eos_id}")
