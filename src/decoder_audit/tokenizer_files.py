"""Reading tokenizer files: a Hugging Face tokenizer.json and GPT-2's vocab.json + merges.txt,
each into a `tokenizers.Tokenizer` (the library is imported only here, when a file is read), and
the end-of-sequence token they declare. Every problem is a ConfigError naming the file (and the
line, for merges.txt). `decoder_audit.tokenizer.Tokenizer` is the interface; this is its reader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError

# Files beside a tokenizer.json or vocab.json that carry its settings (the end token); kept with it.
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# End-of-sequence tokens by convention (GPT-2, Llama/SentencePiece, Gemma, Llama 3), used when
# no tokenizer_config.json names one.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
INSTALL_HINT = "pip install tokenizers (it also comes with: pip install 'decoder-audit[hf]')"


def tokenizers_lib() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(f"reading tokenizer files needs the `tokenizers` library: "
                          f"{INSTALL_HINT}") from exc
    return tokenizers


def read_file(path: Path) -> bytes:
    """The bytes of a tokenizer file; ConfigError naming it if it does not exist."""
    if not path.is_file():
        raise ConfigError(f"tokenizer file {str(path)!r} does not exist")
    return path.read_bytes()


def read_json(data: bytes, where: Path | str | None) -> Any:
    """Parsed JSON; ConfigError naming `where` if it is not JSON."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"tokenizer file {str(where)!r} is not valid JSON: {exc}") from None


def companions(folder: Path) -> dict[str, bytes]:
    """The settings files (COMPANION_FILES) present in `folder`, name -> bytes."""
    return {name: (folder / name).read_bytes() for name in COMPANION_FILES
            if (folder / name).is_file()}


def merges_beside(vocab: Path) -> Path:
    """GPT-2's merges file for a vocab.json: `gpt2-vocab.json` -> `gpt2-merges.txt`, else
    `merges.txt` in the same folder."""
    guesses = [vocab.parent / "merges.txt"]
    if "vocab" in vocab.stem:
        guesses.insert(0, vocab.with_name(vocab.stem.replace("vocab", "merges") + ".txt"))
    for guess in guesses:
        if guess.is_file():
            return guess
    raise ConfigError(f"GPT-2 vocabulary {str(vocab)!r} has no merges file beside it (looked "
                      f"for {', '.join(repr(g.name) for g in guesses)})")


def parse_tokenizer_json(data: bytes, label: str | None) -> Any:
    """A Hugging Face tokenizer.json's bytes -> tokenizers.Tokenizer."""
    lib = tokenizers_lib()
    try:
        return lib.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception for bad files
        raise ConfigError(f"tokenizer.json {label!r} could not be read by the tokenizers "
                          f"library: {exc}") from None


def parse_gpt2(vocab_data: bytes, merges_data: bytes, label: str | None) -> Any:
    """GPT-2's byte-level BPE: the merges applied in file order within each pre-token of GPT-2's
    regex split, every byte first mapped to one of 256 printable symbols (space -> 'Ġ')."""
    lib = tokenizers_lib()
    vocab = read_json(vocab_data, f"vocab.json of {label}")
    if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in vocab.items()):
        raise ConfigError(f"vocab.json of {label!r} must map tokens to non-negative integer ids")
    missing = sorted(set(lib.pre_tokenizers.ByteLevel.alphabet()) - set(vocab))
    if missing:  # without them, the BPE model silently drops the bytes it cannot spell
        raise ConfigError(f"vocab.json of {label!r} lacks {len(missing)} of the 256 byte-level "
                          f"symbols (e.g. {missing[:5]}); a byte-level BPE vocabulary holds "
                          "every byte")
    merges = []
    for number, line in enumerate(merges_data.decode("utf-8").splitlines(), start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"merges.txt of {label!r}, line {number}: {line!r} is not two "
                              "tokens separated by one space")
        unknown = [t for t in (*parts, parts[0] + parts[1]) if t not in vocab]
        if unknown:  # checked here: the library panics on a merged token missing from vocab
            raise ConfigError(f"merges.txt of {label!r}, line {number}: {line!r} uses "
                              f"{unknown}, not in vocab.json")
        merges.append((parts[0], parts[1]))
    backend = lib.Tokenizer(lib.models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = lib.decoders.ByteLevel()
    specials = [t for t in EOS_CANDIDATES if t in vocab]
    if specials:  # so "<|endoftext|>" in text is that one id, as in GPT-2
        backend.add_special_tokens([lib.AddedToken(t, special=True) for t in specials])
    return backend


def find_eos(vocab: Mapping[str, int], files: Mapping[str, bytes]) -> int | None:
    """The end-of-sequence id: tokenizer_config.json's eos_token if there is one, else the first
    conventional end token the vocabulary holds, else None."""
    if "tokenizer_config.json" in files:
        config = read_json(files["tokenizer_config.json"], "tokenizer_config.json")
        token = config.get("eos_token") if isinstance(config, dict) else None
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None:
            if token not in vocab:
                raise ConfigError(f"tokenizer_config.json names eos_token={token!r}, which the "
                                  "tokenizer does not have")
            return vocab[token]
    return next((vocab[t] for t in EOS_CANDIDATES if t in vocab), None)
