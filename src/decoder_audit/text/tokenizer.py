"""How ids read as text: one `Tokenizer` over four kinds, and the tiny teaching vocabulary.

    kind             ids                               files it is made of
    tiny-vocab       the 8 tokens below (V = 8)        none
    bytes            one id per UTF-8 byte (V = 256)   none
    tokenizer.json   a Hugging Face tokenizer          tokenizer.json (read by the `tokenizers`
                                                       library), beside it tokenizer_config.json
                                                       and special_tokens_map.json when present
    gpt2-bpe         GPT-2's byte-level BPE            vocab.json + merges.txt (run through
                                                       `tokenizers`' BPE model with GPT-2's
                                                       byte-level pre-tokenizer and decoder)

Every kind answers the same questions: `encode`, `decode`, `eos_id`, `vocab_size` (ids span
[0, vocab_size): the largest id + 1), `name` and `sha256` (a digest of what defines the ids, the
same wherever the files are). A tokenizer travels with a checkpoint or a prepared dataset as its
files, verbatim, plus a manifest (`MANIFEST_FILE`) naming the kind, each file's SHA-256, the
vocabulary size and the end-of-sequence id; `Tokenizer.from_folder` reads it back and refuses a
file whose digest changed. Each file kind is read into a `tokenizers.Tokenizer` (the library is
imported only when a file is read, and is needed only for the two file kinds: it comes with
transformers, the `hf` extra); every problem with a file is a ConfigError naming the file (and
the line, for merges.txt), a tokenizer without a single token among them. A tokenizer.json whose
pre-tokenizer is byte-level but which names no decoder (a pipeline assembled by hand) is given
the byte-level decoder, the exact inverse of that pre-tokenizer: its ids are untouched, and its
text reads "the cat", not "the Ġcat".

A long text is encoded in pieces of about PIECE_CHARS characters (`pieces`), cut only before a
single space between two non-space characters, and only for a pipeline that cannot tell such a
cut from none (`cut_safe`); each cut tokenizer is also checked once on the text's first two
pieces against encoding them whole. Why: the library keeps offsets, alignments and token strings
for the whole input, about 200 bytes a character (a 31 MB one-line file took 6.1 GB).

The tiny teaching vocabulary: 8 tokens, one per id of the tiny-368 model (V = 8).

    id:     0      1      2      3  4  5  6  7
    token:  <pad>  <bos>  <eos>  A  B  C  D  E

`<bos>` opens a sequence and `<eos>` closes it, so the seeds' aligned example

    sequence: <bos> A B C <eos>   (length T + 1 = 5)
    input:    <bos> A B C         (the first T ids)
    target:   A B C <eos>         (the last T ids)

encodes to [1, 3, 4, 5, 2]. `<pad>` is id 0 so a zero-filled tensor is padding, never a letter;
`E` is the eighth symbol that fills the vocabulary. Training data for the tiny model (the
letters A..E between <bos> and <eos>) is written in these tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

TINY_VOCAB: list[str] = ["<pad>", "<bos>", "<eos>", "A", "B", "C", "D", "E"]
PAD, BOS, EOS = 0, 1, 2
_ID_OF = {token: i for i, token in enumerate(TINY_VOCAB)}

BUILTIN_KINDS = ("tiny-vocab", "bytes")
FILE_KINDS = ("tokenizer.json", "gpt2-bpe")
# The file(s) that define each file kind's ids; the companions only carry settings (eos).
DEFINING_FILES = {"tokenizer.json": ("tokenizer.json",), "gpt2-bpe": ("vocab.json", "merges.txt")}
MANIFEST_FILE = "decoder_audit_tokenizer.json"
MANIFEST_FORMAT = 1


def encode(text: str) -> list[int]:
    """Whitespace-separated tokens -> ids, e.g. "<bos> A B" -> [1, 3, 4]. A word outside the
    vocabulary is a ConfigError naming it and where it starts (line, column, character)."""
    words = text.split()
    if all(word in _ID_OF for word in words):
        return [_ID_OF[word] for word in words]
    found = next(m for m in re.finditer(r"\S+", text) if m.group() not in _ID_OF)
    at = found.start()
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    raise ConfigError(f"token {found.group()!r} at line {line}, column {column} (character {at}) "
                      f"is not in the tiny vocabulary {TINY_VOCAB}; it reads space-separated "
                      "tokens, e.g. '<bos> A B'")


def decode(ids: Iterable[int]) -> str:
    """Ids -> whitespace-separated tokens, e.g. [1, 3, 4] -> "<bos> A B"."""
    tokens = []
    for i in ids:
        i = int(i)
        if not 0 <= i < len(TINY_VOCAB):
            raise ValueError(f"id {i} is outside the tiny vocabulary [0, {len(TINY_VOCAB)})")
        tokens.append(TINY_VOCAB[i])
    return " ".join(tokens)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- reading tokenizer files --------------------------------------------------------------------

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
    """A Hugging Face tokenizer.json's bytes -> tokenizers.Tokenizer; a byte-level one without a
    decoder gets the byte-level decoder (the module docstring says why)."""
    lib = tokenizers_lib()
    try:
        backend = lib.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception for bad files
        raise ConfigError(f"tokenizer.json {label!r} could not be read by the tokenizers "
                          f"library: {exc}") from None
    if backend.decoder is None and _byte_level(read_json(data, label).get("pre_tokenizer")):
        # without it the ids read back as their byte symbols: "the Ġcat Ġthe"
        backend.decoder = lib.decoders.ByteLevel()
    return backend


def _byte_level(pre_tokenizer: Any) -> bool:
    """Whether a tokenizer.json's pre_tokenizer is ByteLevel, or a Sequence holding one."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


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


# ---- long texts in pieces (the module docstring says why) ---------------------------------------

PIECE_CHARS = 1 << 18  # about 50 MB of the library's working memory per piece
# The one cut made: before a single space between two non-space characters.
_CUT = re.compile(r"(?<=\S) (?=\S)")
# What cannot see such a cut. Normalizers that act on each character alone (a space is a
# starter that composes with nothing, so NFC and its kin never join across it); pre-tokenizers
# that always split there (the two word regexes of GPT-2 and of cl100k / Llama 3 start a new
# piece at the space, and match nothing that ends in one after a non-space); pre-tokenizers that
# only split further inside the pieces they get; every model encodes piece by piece.
_LOCAL_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertNormalizer"}
_SPLITTERS = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "ByteLevel", "Metaspace",
              "Split"}
_WORD_REGEXES = {
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
     r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
_INSIDE = {"Digits", "Punctuation"}


def pieces(text: str, size: int) -> list[tuple[int, int]]:
    """Spans (start, end) tiling `text`, each at least `size` characters long (the last may be
    shorter), cut only before a single space between two non-space characters; a stretch with
    no such space stays whole."""
    spans, start = [], 0
    while len(text) - start > size:
        found = _CUT.search(text, start + size)
        if found is None:
            break
        spans.append((start, found.start()))
        start = found.start()
    spans.append((start, len(text)))
    return spans


def cut_safe(config: Mapping[str, Any]) -> bool:
    """Whether a tokenizer.json pipeline (`config`) encodes a text cut before a single space
    between two non-space characters as it encodes it whole: no truncation or padding, added
    tokens without whitespace that strip none, local normalizers, and a pre-tokenizer that
    splits at that space (see the notes above)."""
    if config.get("truncation") is not None or config.get("padding") is not None:
        return False
    for token in config.get("added_tokens") or []:
        content = str(token.get("content", ""))
        if token.get("lstrip") or token.get("rstrip") or any(c.isspace() for c in content):
            return False
    return _local_normalizer(config.get("normalizer")) and \
        _splits_at_spaces(config.get("pre_tokenizer"))


def _local_normalizer(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    if normalizer.get("type") == "Sequence":
        return all(_local_normalizer(n) for n in normalizer.get("normalizers", []))
    return normalizer.get("type") in _LOCAL_NORMALIZERS


def _splits_at_spaces(pre: Any) -> bool:
    """A pre-tokenizer that splits at the cut, or a Sequence of ones that split there or only
    inside their pieces, one at least splitting there."""
    if pre is None:
        return False  # the whole text is one piece: a model may merge across the space
    members = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    splitting = [m for m in members if _splits_there(m)]
    inside = [m for m in members if m.get("type") in _INSIDE
              or (m.get("type") == "ByteLevel" and not m.get("use_regex", True))]
    return bool(splitting) and len(splitting) + len(inside) == len(members)


def _splits_there(pre: Mapping[str, Any]) -> bool:
    kind = pre.get("type")
    if kind not in _SPLITTERS:
        return False
    if kind == "ByteLevel":
        return pre.get("use_regex", True)  # without its regex it only maps bytes to symbols
    if kind == "Metaspace":
        return pre.get("split", True)  # a piece starting with the space gets no extra prefix
    if kind == "Split":
        return (pre.get("pattern") or {}).get("Regex") in _WORD_REGEXES and \
            pre.get("behavior") == "Isolated" and not pre.get("invert")
    return True


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


class Tokenizer:
    """How a model's ids read as text (see the module docstring for the kinds).

    `Tokenizer("bytes")` and `Tokenizer("tiny-vocab")` need no files; the file kinds are made by
    `from_tokenizer_json`, `from_gpt2_files`, `from_spec` (what `--tokenizer` accepts) and
    `from_folder` (a checkpoint, prepared dataset or Hugging Face folder)."""

    def __init__(self, kind: str, *, files: Mapping[str, bytes] | None = None,
                 label: str | None = None, eos_id: int | None = None) -> None:
        if kind not in BUILTIN_KINDS + FILE_KINDS:
            raise ConfigError(f"unknown tokenizer {kind!r}; known: {BUILTIN_KINDS + FILE_KINDS}")
        self.kind = kind
        self.files = dict(files or {})
        self._backend = None
        self._cuts: bool | None = None  # whether long texts may be cut (`cut_safe`), once read
        if kind in BUILTIN_KINDS:
            self.name = kind
            self.vocab_size = len(TINY_VOCAB) if kind == "tiny-vocab" else 256
            self.eos_id = EOS if kind == "tiny-vocab" else None  # raw bytes have no end token
            return
        missing = [f for f in DEFINING_FILES[kind] if f not in self.files]
        if missing:
            raise ConfigError(f"a {kind} tokenizer needs the files {list(DEFINING_FILES[kind])}; "
                              f"missing {missing}")
        self.name = f"{kind}:{label}" if label else kind
        self._backend = (parse_tokenizer_json(self.files["tokenizer.json"], label)
                         if kind == "tokenizer.json" else
                         parse_gpt2(self.files["vocab.json"], self.files["merges.txt"], label))
        vocab = self._backend.get_vocab(with_added_tokens=True)
        if not vocab:  # no id could be encoded, and no model could be sized by it
            raise ConfigError(f"tokenizer {self.name} has no tokens: its vocabulary (and added "
                              f"tokens) are empty, so it encodes nothing; give a trained "
                              "tokenizer file")
        self.vocab_size = max(vocab.values()) + 1
        self.eos_id = eos_id if eos_id is not None else find_eos(vocab, self.files)
        if self.eos_id is not None and not 0 <= self.eos_id < self.vocab_size:
            raise ConfigError(f"tokenizer {self.name}: eos_id={self.eos_id} is outside its ids "
                              f"[0, {self.vocab_size})")

    # ------------------------------------------------------------------------------------------
    # Making one
    # ------------------------------------------------------------------------------------------

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike) -> "Tokenizer":
        """A Hugging Face tokenizer.json (any file name); companions beside it are kept."""
        path = Path(path)
        files = {"tokenizer.json": read_file(path), **companions(path.parent)}
        return cls("tokenizer.json", files=files, label=path.name)

    @classmethod
    def from_gpt2_files(cls, vocab: str | os.PathLike, merges: str | os.PathLike) -> "Tokenizer":
        """GPT-2's vocab.json + merges.txt (any file names)."""
        vocab, merges = Path(vocab), Path(merges)
        files = {"vocab.json": read_file(vocab), "merges.txt": read_file(merges),
                 **companions(vocab.parent)}
        return cls("gpt2-bpe", files=files, label=vocab.resolve().parent.name or vocab.name)

    @classmethod
    def from_spec(cls, spec: str | os.PathLike) -> "Tokenizer":
        """What `--tokenizer T` names: "bytes", "tiny-vocab", a tokenizer.json file, a GPT-2
        vocab.json (its merges beside it: merges.txt, or the name with vocab -> merges and
        .json -> .txt), or a folder holding one of those or a tokenizer manifest (a checkpoint,
        a training run folder, a prepared dataset, a Hugging Face model folder)."""
        if str(spec) in BUILTIN_KINDS:
            return cls(str(spec))
        path = Path(spec)
        if path.is_dir():
            found = cls.from_folder(path)
            if found is None:
                raise ConfigError(
                    f"--tokenizer folder {str(path)!r} holds no tokenizer: looked for "
                    f"{MANIFEST_FILE}, tokenizer.json, vocab.json + merges.txt (also in "
                    f"checkpoint/)")
            return found
        if not path.is_file():
            raise ConfigError(f"--tokenizer {str(spec)!r} is neither {' nor '.join(BUILTIN_KINDS)}"
                              " nor an existing file or folder")
        content = read_json(read_file(path), path)
        if isinstance(content, dict) and isinstance(content.get("model"), dict):
            return cls.from_tokenizer_json(path)
        if isinstance(content, dict) and all(isinstance(v, int) for v in content.values()):
            return cls.from_gpt2_files(path, merges_beside(path))
        raise ConfigError(f"--tokenizer file {str(path)!r} is neither a tokenizer.json (it has "
                          "no 'model') nor a GPT-2 vocab.json (token -> id)")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> "Tokenizer | None":
        """The tokenizer a folder carries, or None: its manifest (file digests checked), else a
        tokenizer.json, else vocab.json + merges.txt; a run folder's checkpoint/ is looked in
        too."""
        folder = Path(folder)
        if (folder / MANIFEST_FILE).is_file():
            return cls._from_manifest(folder)
        if (folder / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(folder / "tokenizer.json")
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            return cls.from_gpt2_files(folder / "vocab.json", folder / "merges.txt")
        if (folder / "checkpoint").is_dir():
            return cls.from_folder(folder / "checkpoint")
        return None

    @classmethod
    def _from_manifest(cls, folder: Path) -> "Tokenizer":
        path = folder / MANIFEST_FILE
        manifest = read_json(read_file(path), path)
        try:
            kind, digests = manifest["kind"], dict(manifest.get("files", {}))
        except (TypeError, KeyError) as exc:
            raise ConfigError(f"{str(path)!r} is not a tokenizer manifest (no {exc})") from None
        if kind in BUILTIN_KINDS:
            tokenizer = cls(kind)
        else:
            files = {}
            for name, digest in digests.items():
                files[name] = read_file(folder / name)
                if _sha256(files[name]) != digest:
                    raise ConfigError(f"tokenizer file {str(folder / name)!r} changed: its "
                                      f"SHA-256 differs from the one {MANIFEST_FILE} recorded")
            label = str(manifest.get("name", kind)).partition(":")[2] or None
            tokenizer = cls(kind, files=files, label=label, eos_id=manifest.get("eos_id"))
        if manifest.get("vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
            raise ConfigError(f"{str(path)!r} records vocab_size={manifest['vocab_size']} but "
                              f"the tokenizer's ids span {tokenizer.vocab_size}")
        return tokenizer

    @classmethod
    def for_vocab_size(cls, vocab_size: int, declared: str | None = None) -> "Tokenizer":
        """The built-in tokenizer a checkpoint declares, else the one its vocabulary size
        implies (checkpoints that carry no tokenizer files)."""
        if declared is not None:
            if declared not in BUILTIN_KINDS:
                raise ConfigError(f"the checkpoint declares tokenizer {declared!r} but carries "
                                  f"no {MANIFEST_FILE}; name one with --tokenizer")
            return cls(declared)
        if vocab_size == len(TINY_VOCAB):
            return cls("tiny-vocab")
        if vocab_size == 256:
            return cls("bytes")
        # Any other V is some other tokenizer's: reading its ids as bytes would print U+FFFD.
        raise ConfigError(f"no tokenizer for vocab_size={vocab_size}: the checkpoint carries none "
                          f"and only V={len(TINY_VOCAB)} (tiny-vocab) and V=256 (bytes) imply "
                          "one; pass --tokenizer with the model's tokenizer.json, GPT-2 "
                          "vocab.json or a folder holding one (or --tokenizer bytes for a "
                          "byte-level model)")

    @classmethod
    def for_checkpoint(cls, folder: str | os.PathLike, vocab_size: int, *,
                       declared: str | None = None,
                       override: str | os.PathLike | None = None) -> "Tokenizer":
        """The tokenizer to read a checkpoint's model with: `override` (--tokenizer) if given,
        else the one the checkpoint carries, else the built-in one `declared` (trainer.json) or
        `vocab_size` implies. It must fit the model (`check_fits`)."""
        tokenizer = (cls.from_spec(override) if override is not None
                     else cls.from_folder(folder) or cls.for_vocab_size(vocab_size, declared))
        tokenizer.check_fits(vocab_size, f"the model in {str(folder)!r}")
        return tokenizer

    # ------------------------------------------------------------------------------------------
    # Using one
    # ------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text -> ids. File kinds apply the tokenizer's own post-processing (e.g. a leading
        <s> for Llama); GPT-2 adds nothing. A long text goes in pieces where its pipeline allows
        (the module docstring), to the ids of the whole."""
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        if self.kind == "tiny-vocab":
            return encode(text)
        spans = pieces(text, PIECE_CHARS)
        if len(spans) > 1 and self._cut_safe():
            ids = self._encode_pieces(text, spans)
            if ids is not None:
                return ids
        return list(self._backend.encode(text).ids)

    def _cut_safe(self) -> bool:
        """`cut_safe` of this tokenizer's pipeline (read once)."""
        if self._cuts is None:
            self._cuts = cut_safe(json.loads(self._backend.to_str()))
        return self._cuts

    def _encode_pieces(self, text: str, spans: list[tuple[int, int]]) -> list[int] | None:
        """The ids of `text` encoded piece by piece, with the specials the post-processor puts
        around a whole text; None when the first two pieces, encoded whole, say otherwise."""
        backend = self._backend

        def body(span: tuple[int, int]) -> list[int]:
            return backend.encode(text[span[0]:span[1]], add_special_tokens=False).ids

        # the post-processor's specials (a <s> before, a </s> after), read off the first piece
        first = backend.encode(text[spans[0][0]:spans[0][1]], add_special_tokens=False)
        head, whole = first.ids, backend.post_process(first, None, True).ids
        extra = len(whole) - len(head)
        starts = [k for k in range(extra + 1) if whole[k:k + len(head)] == head]
        if len(starts) != 1:
            return None
        before, after = whole[:starts[0]], whole[starts[0] + len(head):]
        second = body(spans[1])
        if backend.encode(text[spans[0][0]:spans[1][1]]).ids != before + head + second + after:
            return None  # a pipeline that sees the cut after all: encode the text whole
        ids = before + head + second
        for span in spans[2:]:
            ids.extend(body(span))
        ids.extend(after)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, special tokens included. Ids the tokenizer lacks (a model's V may be
        padded past it) are left out."""
        ids = [int(i) for i in ids]
        if self.kind == "bytes":
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        if self.kind == "tiny-vocab":
            return decode(ids)
        return self._backend.decode([i for i in ids if 0 <= i < self.vocab_size],
                                    skip_special_tokens=False)

    @property
    def eos_token(self) -> str | None:
        """The vocabulary entry of `eos_id` (None when there is no end token or, for raw bytes,
        no entry)."""
        if self.eos_id is None or self.kind == "bytes":
            return None
        if self.kind == "tiny-vocab":
            return TINY_VOCAB[self.eos_id]
        return self._backend.id_to_token(self.eos_id)

    def check_fits(self, vocab_size: int, where: str) -> None:
        """ConfigError unless every id of this tokenizer is < `vocab_size` (a model's V)."""
        if self.vocab_size > vocab_size:
            raise ConfigError(f"tokenizer {self.name} has ids 0..{self.vocab_size - 1} "
                              f"(vocab_size={self.vocab_size}) but {where} has "
                              f"vocab_size={vocab_size}: its ids would not fit")

    @property
    def sha256(self) -> str:
        """Digest of what defines the ids: the kind, the defining files' digests, eos_id (the
        same wherever the files lie, whatever they are named on disk)."""
        defining = {name: _sha256(self.files[name]) for name in DEFINING_FILES.get(self.kind, ())}
        key = {"kind": self.kind, "files": defining, "eos_id": self.eos_id}
        if self.kind == "tiny-vocab":
            key["vocab"] = TINY_VOCAB
        return _sha256(json.dumps(key, sort_keys=True).encode())

    def manifest(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT, "kind": self.kind, "name": self.name,
                "sha256": self.sha256, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "files": {name: _sha256(data) for name, data in sorted(self.files.items())}}

    def folder_files(self) -> dict[str, bytes]:
        """name -> bytes to write beside a checkpoint's weights or a dataset's tokens: the
        tokenizer's files verbatim and the manifest."""
        manifest = (json.dumps(self.manifest(), indent=2) + "\n").encode()
        return {**self.files, MANIFEST_FILE: manifest}

    def save(self, folder: str | os.PathLike) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self.folder_files().items():
            (folder / name).write_bytes(data)
        return folder

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"
