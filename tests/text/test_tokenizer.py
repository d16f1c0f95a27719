"""Tokenizers: GPT-2 vocab.json + merges.txt written by hand, a BPE tokenizer trained here with the
`tokenizers` library, the built-in kinds, the manifest a checkpoint carries, and typed errors.

Expected ids come from the files the tests write (which id each token was given, which merges
exist and in what order), never from the code under test."""

from __future__ import annotations

import json
import re

import pytest
from helpers import trained_bpe

import decoder_audit as da
from decoder_audit.errors import ConfigError
from decoder_audit.text.tokenizer import MANIFEST_FILE, Tokenizer

tokenizers = pytest.importorskip("tokenizers")


def gpt2_byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-symbol table, written from its definition: the 188 printable
    bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes, in increasing
    order, take the characters 256, 257, ... (so the space, byte 32, is chr(288) = 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


SYMBOL = gpt2_byte_symbols()
# Each byte's symbol gets the byte's value as its id; then three merges and the end token.
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]  # in rank order
MERGED_IDS = {"Ġt": 256, "he": 257, "Ġthe": 258}
ENDOFTEXT = 259


@pytest.fixture
def gpt2_folder(tmp_path):
    vocab = {SYMBOL[b]: b for b in range(256)} | MERGED_IDS | {"<|endoftext|>": ENDOFTEXT}
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return folder


def test_gpt2_byte_table_matches_the_library_alphabet():
    # the table above is the published one: the same 256 symbols the library uses
    assert SYMBOL[32] == "Ġ" and SYMBOL[10] == "Ċ"
    assert set(SYMBOL.values()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())


def test_gpt2_vocab_and_merges_encode_as_the_merges_say(gpt2_folder):
    tok = Tokenizer.from_spec(gpt2_folder)
    assert tok.kind == "gpt2-bpe" and tok.vocab_size == 260 and tok.eos_id == ENDOFTEXT
    # "the": t h e -> only (h, e) applies -> [t, he]
    # " the": Ġ t h e -> (Ġ,t) rank 0 -> Ġt h e -> (h,e) rank 1 -> Ġt he -> (Ġt,he) -> Ġthe
    assert tok.encode("the the") == [ord("t"), MERGED_IDS["he"], MERGED_IDS["Ġthe"]]
    # no merge covers "ht" or " h": bytes stay bytes
    assert tok.encode("ht h") == [ord("h"), ord("t"), 32, ord("h")]
    # the end token in text is that one id; "é" is its two UTF-8 bytes
    assert tok.encode("é<|endoftext|>") == [0xC3, 0xA9, ENDOFTEXT]
    text = "the théâtre\n\tthe end<|endoftext|>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([ord("t"), MERGED_IDS["he"], MERGED_IDS["Ġthe"]]) == "the the"


def test_gpt2_files_by_other_names_and_by_vocab_file(gpt2_folder, tmp_path):
    (tmp_path / "gpt2-vocab.json").write_bytes((gpt2_folder / "vocab.json").read_bytes())
    (tmp_path / "gpt2-merges.txt").write_bytes((gpt2_folder / "merges.txt").read_bytes())
    renamed = Tokenizer.from_spec(tmp_path / "gpt2-vocab.json")
    original = Tokenizer.from_spec(gpt2_folder / "vocab.json")
    assert renamed.encode("the the") == original.encode("the the") == [116, 257, 258]
    # the digest names what defines the ids, not where the files lie or what they are called
    assert renamed.sha256 == original.sha256


def test_bpe_trained_here_round_trips_and_finds_its_end_token(tmp_path):
    backend = trained_bpe()
    backend.save(str(tmp_path / "tok.json"))

    tok = Tokenizer.from_spec(tmp_path / "tok.json")
    assert tok.kind == "tokenizer.json" and tok.eos_id == 0  # the first special token
    vocab = json.loads((tmp_path / "tok.json").read_text())["model"]["vocab"]
    assert tok.vocab_size == max(vocab.values()) + 1
    ids = tok.encode("the cat ate the mat")
    # a learned merge: " the" (space included) is one token of the file's vocabulary
    assert vocab["Ġthe"] in ids and len(ids) < len("the cat ate the mat")
    for text in ("the cat ate the mat", "unseen wörds ✓ and\nnewlines  "):
        assert tok.decode(tok.encode(text)) == text


def test_tokenizer_config_names_the_end_token(tmp_path):
    vocab = {"[UNK]": 0, "<eos>": 1, "</s>": 2, "a": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.save(str(tmp_path / "tokenizer.json"))
    assert Tokenizer.from_folder(tmp_path).eos_id == 2  # "</s>" comes before "<eos>" by convention
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<eos>"}}))
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.eos_id == 1 and "tokenizer_config.json" in tok.files
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(ConfigError, match="<nope>"):
        Tokenizer.from_folder(tmp_path)


def test_manifest_round_trip_and_a_changed_file_is_refused(gpt2_folder, tmp_path):
    tok = Tokenizer.from_spec(gpt2_folder)
    saved = tok.save(tmp_path / "ckpt")
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    assert manifest["kind"] == "gpt2-bpe" and manifest["vocab_size"] == 260
    assert manifest["eos_id"] == ENDOFTEXT and set(manifest["files"]) == {"vocab.json",
                                                                          "merges.txt"}
    back = Tokenizer.from_folder(saved)
    assert back.sha256 == tok.sha256 and back.name == tok.name
    assert back.encode("the the") == [116, 257, 258]
    (saved / "merges.txt").write_text("#version: 0.2\nh e\n")  # a different tokenizer now
    with pytest.raises(ConfigError, match="merges.txt"):
        Tokenizer.from_folder(saved)


@pytest.mark.parametrize("kind, vocab_size, eos_id", [("bytes", 256, None),
                                                      ("tiny-vocab", 8, 2)])
def test_builtin_kinds_travel_as_a_manifest(tmp_path, kind, vocab_size, eos_id):
    tok = Tokenizer.from_spec(kind)
    assert (tok.vocab_size, tok.eos_id) == (vocab_size, eos_id)
    assert set(tok.folder_files()) == {MANIFEST_FILE}
    back = Tokenizer.from_folder(tok.save(tmp_path))
    assert back.kind == kind and back.sha256 == tok.sha256
    assert Tokenizer.from_spec("bytes").sha256 != Tokenizer.from_spec("tiny-vocab").sha256


def test_checkpoint_tokenizer_falls_back_to_the_vocabulary_size(tmp_path):
    assert Tokenizer.for_checkpoint(tmp_path, 256).kind == "bytes"
    # Any other V belongs to some other tokenizer: its ids read as bytes would print U+FFFD
    # (issue 14), so without files or --tokenizer it is refused.
    with pytest.raises(ConfigError, match="no tokenizer for vocab_size=300"):
        Tokenizer.for_checkpoint(tmp_path, 300)
    assert Tokenizer.for_checkpoint(tmp_path, 8, declared="tiny-vocab").kind == "tiny-vocab"
    with pytest.raises(ConfigError, match="carries no"):
        Tokenizer.for_checkpoint(tmp_path, 300, declared="tokenizer.json:tok.json")


def test_a_tokenizer_larger_than_the_model_is_refused(gpt2_folder, tmp_path):
    tok = Tokenizer.from_spec(gpt2_folder)
    tok.check_fits(260, "a model")  # ids 0..259 fit V = 260
    with pytest.raises(ConfigError, match=r"ids 0\.\.259 .*vocab_size=259"):
        tok.check_fits(259, "a model")
    with pytest.raises(ConfigError, match="vocab_size=256"):
        Tokenizer.for_checkpoint(tmp_path, 256, override=str(gpt2_folder))


def test_bad_files_raise_config_errors_naming_them(gpt2_folder, tmp_path):
    (gpt2_folder / "merges.txt").write_text("#version: 0.2\nĠ t\nt x y\n")
    with pytest.raises(ConfigError, match="line 3"):
        Tokenizer.from_spec(gpt2_folder)
    # a merge whose parts or result the vocabulary lacks (the library would panic on it)
    (gpt2_folder / "merges.txt").write_text("#version: 0.2\nt h\n")
    with pytest.raises(ConfigError, match=r"line 2: 't h' uses \['th'\]"):
        Tokenizer.from_spec(gpt2_folder)
    # a byte-level vocabulary must spell every byte, else text would be dropped silently
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1}))
    (tmp_path / "merges.txt").write_text("")
    with pytest.raises(ConfigError, match="lacks 254 of the 256"):
        Tokenizer.from_spec(tmp_path / "vocab.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json"):
        Tokenizer.from_spec(tmp_path / "broken.json")
    (tmp_path / "odd.json").write_text(json.dumps({"model": {"type": "Nonsense"}}))
    with pytest.raises(ConfigError, match="odd.json"):
        Tokenizer.from_spec(tmp_path / "odd.json")
    with pytest.raises(ConfigError, match="no-such"):
        Tokenizer.from_spec(tmp_path / "no-such")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no tokenizer"):
        Tokenizer.from_spec(tmp_path / "empty")


def test_gpt2_files_read_as_the_library_reads_its_own_byte_level_bpe(tmp_path):
    # The library's ByteLevelBPETokenizer writes the same learned BPE twice: as a tokenizer.json
    # (its own pipeline, the reference) and as GPT-2's vocab.json + merges.txt, which we
    # assemble ourselves; both must give the same ids and text.
    corpus = ("The assert statement is a convenient way to insert debugging assertions.\n"
              "  if __debug__:\n\tif not expression: raise AssertionError  # naïve ✓\n") * 30
    trained = tokenizers.ByteLevelBPETokenizer()
    trained.train_from_iterator([corpus], vocab_size=400, special_tokens=["<|endoftext|>"],
                                show_progress=False)
    trained.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "gpt2").mkdir()
    trained.save_model(str(tmp_path / "gpt2"))
    reference = Tokenizer.from_spec(tmp_path / "tokenizer.json")
    ours = Tokenizer.from_spec(tmp_path / "gpt2")
    assert ours.kind == "gpt2-bpe" and ours.vocab_size == reference.vocab_size
    text = corpus[:400] + "unseen: Ωmega 3.14 <|endoftext|> tail"
    assert ours.encode(text) == reference.encode(text) == trained.encode(text).ids
    assert ours.decode(ours.encode(text)) == text


def test_sampling_needs_a_tokenizer_for_the_vocabulary():
    assert Tokenizer.for_vocab_size(256).kind == "bytes"
    assert Tokenizer.for_vocab_size(8).kind == "tiny-vocab"
    with pytest.raises(da.ConfigError, match=r"no tokenizer for vocab_size=2048.*pass "
                                             r"--tokenizer"):
        Tokenizer.for_vocab_size(2048)


def test_tokenizers():
    tiny = Tokenizer.for_vocab_size(8)
    assert tiny.encode("<bos> A B") == [1, 3, 4] and tiny.eos_id == 2
    assert tiny.decode([1, 3, 4, 2]) == "<bos> A B <eos>"
    text = Tokenizer.for_vocab_size(256)
    assert text.encode("hé") == [104, 0xC3, 0xA9] and text.eos_id is None
    assert text.decode([104, 0xC3, 0xA9]) == "hé"


# ---- issue 26: empty vocabularies, words the tiny vocabulary lacks, byte-level decoding,
# ---- long texts in pieces ----------------------------------------------------------------------

def test_a_tokenizer_json_without_tokens_is_refused_naming_its_file(tmp_path):
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.save(str(tmp_path / "nothing.json"))
    with pytest.raises(ConfigError, match="nothing.json"):
        Tokenizer.from_spec(tmp_path / "nothing.json")


def test_the_tiny_vocabulary_names_the_first_word_it_lacks_and_where_it_starts():
    tiny = Tokenizer("tiny-vocab")
    text = "<bos> A B\n  C The cat <eos>"
    with pytest.raises(ConfigError) as refused:
        tiny.encode(text)
    message = str(refused.value)
    assert "'The'" in message and "cat" not in message
    # where 'The' starts: character 14, line 2, column 5 (counted from 1)
    assert text.index("The") == 14
    for fact in (r"\b14\b", r"line 2\b", r"column 5\b"):
        assert re.search(fact, message), (fact, message)


def _byte_level_without_decoder(pre_tokenizer) -> tokenizers.Tokenizer:
    backend = trained_bpe()
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = None
    return backend


@pytest.mark.parametrize("pre", [
    lambda lib: lib.pre_tokenizers.ByteLevel(add_prefix_space=False),
    lambda lib: lib.pre_tokenizers.Sequence([
        lib.pre_tokenizers.Split(lib.Regex(r"\s+"), "isolated"),
        lib.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
])
def test_a_byte_level_tokenizer_json_without_a_decoder_reads_back_its_text(tmp_path, pre):
    backend = _byte_level_without_decoder(pre(tokenizers))
    backend.save(str(tmp_path / "tok.json"))
    assert backend.decode(backend.encode("the cat").ids) != "the cat"  # the library's reading
    tok = Tokenizer.from_spec(tmp_path / "tok.json")
    for text in ("the cat the", "naïve ✓ the\n\tmat"):
        assert tok.decode(tok.encode(text)) == text
        assert tok.encode(text) == backend.encode(text).ids  # the ids are the file's own
    assert tok.files["tokenizer.json"] == (tmp_path / "tok.json").read_bytes()  # kept verbatim


class _Recording:
    """A tokenizers.Tokenizer that records the length of every text it is asked to encode."""

    def __init__(self, backend) -> None:
        self.backend, self.lengths = backend, []

    def encode(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        return self.backend.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def _word_level(lib):
    words = ["the", "cat", "sat", "on", "mat", "[UNK]", "<s>", "</s>"]
    backend = lib.Tokenizer(lib.models.WordLevel({w: i for i, w in enumerate(words)},
                                                 unk_token="[UNK]"))
    backend.normalizer = lib.normalizers.Sequence([lib.normalizers.NFKC(),
                                                   lib.normalizers.Lowercase()])
    backend.pre_tokenizer = lib.pre_tokenizers.WhitespaceSplit()
    backend.post_processor = lib.processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 6), ("</s>", 7)])
    return backend


def _metaspace(lib):
    backend = trained_bpe()
    backend.pre_tokenizer = lib.pre_tokenizers.Metaspace()
    backend.decoder = lib.decoders.Metaspace()
    return backend


def _llama3_style(lib):
    backend = trained_bpe()
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
               r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    backend.pre_tokenizer = lib.pre_tokenizers.Sequence([
        lib.pre_tokenizers.Split(lib.Regex(pattern), "isolated"),
        lib.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.post_processor = lib.processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    return backend


LONG_TEXT = ("the cat  sat on\tthe mat.\nThe CAT sat, the ﬁne mat<|endoftext|>café naïve ✓ 12345 "
             "日本語の the\n\n  mat   ") * 40


@pytest.mark.parametrize("build", [lambda lib: trained_bpe(), _word_level, _metaspace,
                                   _llama3_style])
def test_a_long_text_is_encoded_in_pieces_to_the_ids_of_the_whole(tmp_path, monkeypatch, build):
    # The library holds ~200 bytes per character of one input: a 31 MB one-line file took
    # 6.1 GB. A long text goes in pieces, and its ids are those of the text encoded whole.
    import decoder_audit.text.tokenizer as module

    backend = build(tokenizers)
    backend.save(str(tmp_path / "tok.json"))
    tok = Tokenizer.from_spec(tmp_path / "tok.json")
    monkeypatch.setattr(module, "PIECE_CHARS", 200)
    tok._backend = recording = _Recording(tok._backend)
    for text in (LONG_TEXT, LONG_TEXT.replace("\n", " ")):  # several lines; one line
        recording.lengths.clear()
        assert tok.encode(text) == backend.encode(text).ids
        # the whole text never went in at once: only pieces, and the first two once more
        # (the check that this pipeline cannot see a cut)
        assert max(recording.lengths) < len(text) / 4, recording.lengths


def test_gpt2_files_encode_a_long_text_in_pieces_to_the_ids_of_the_whole(gpt2_folder,
                                                                         monkeypatch):
    import decoder_audit.text.tokenizer as module

    tok = Tokenizer.from_spec(gpt2_folder)
    whole = tok.encode(LONG_TEXT)
    monkeypatch.setattr(module, "PIECE_CHARS", 200)
    tok._backend = recording = _Recording(tok._backend)
    assert tok.encode(LONG_TEXT) == whole
    assert max(recording.lengths) < len(LONG_TEXT) / 4


def test_a_pipeline_that_could_see_a_cut_encodes_the_text_whole(tmp_path, monkeypatch):
    import decoder_audit.text.tokenizer as module

    backend = trained_bpe()  # a normalizer that rewrites two characters at once
    backend.normalizer = tokenizers.normalizers.Replace("t c", "tc")
    backend.save(str(tmp_path / "tok.json"))
    tok = Tokenizer.from_spec(tmp_path / "tok.json")
    monkeypatch.setattr(module, "PIECE_CHARS", 200)
    tok._backend = recording = _Recording(tok._backend)
    assert tok.encode(LONG_TEXT) == backend.encode(LONG_TEXT).ids
    assert recording.lengths == [len(LONG_TEXT)]
