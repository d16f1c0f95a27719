"""Token datasets: what `prepare_dataset` writes (header, dtype, raw tokens, the held-out range),
how it refuses, and `TokenDataset`'s windows read from the memory map.

The windows test uses a word-level tokenizer whose word "w{i}" has id i and a text "w0 w1 ... ",
so the token at offset i is i: a window's ids name their own offsets, an independent record of
where every window was read from."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from decoder_audit.errors import CheckpointError, ConfigError
from decoder_audit.text.datasets import (
    HEADER_FILE,
    TOKENS_FILE,
    TokenDataset,
    prepare_dataset,
    read_header,
    token_dtype,
)
from decoder_audit.text.tokenizer import MANIFEST_FILE, Tokenizer

tokenizers = pytest.importorskip("tokenizers")

WORDS = 1000  # w0 .. w999, then "</s>" = 1000


def word_tokenizer(folder, ids=None):
    """tokenizer.json of a word-level tokenizer: "w{i}" -> ids[i] (default i), "</s>" the end."""
    ids = ids or list(range(WORDS))
    vocab = {f"w{i}": ids[i] for i in range(len(ids))} | {"</s>": max(ids) + 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    folder.mkdir(exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture
def counted(tmp_path):
    """A dataset whose token at offset i is i (i < 1000), then the end token 1000."""
    text = tmp_path / "count.txt"
    text.write_text(" ".join(f"w{i}" for i in range(WORDS)))
    header = prepare_dataset([text], word_tokenizer(tmp_path / "tok"), tmp_path / "data",
                             val_fraction=0.2)
    return tmp_path / "data", header


def test_bytes_dataset_header_and_raw_tokens(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("héllo\n")
    b.write_bytes(b"second file " * 3)
    header = prepare_dataset([a, b], "bytes", tmp_path / "data", val_fraction=0.25)
    expected = list(a.read_bytes() + b.read_bytes())  # bytes: no end token between files
    n = len(expected)
    n_val = math.ceil(0.25 * n)
    assert header["dtype"] == "uint16" and header["tokens"] == n
    assert header["splits"] == {"train": [0, n - n_val], "val": [n - n_val, n]}
    assert header["tokenizer"]["name"] == "bytes" and header["tokenizer"]["vocab_size"] == 256
    assert [(s["file"], s["sha256"], s["tokens"], s["start"]) for s in header["sources"]] == [
        ("a.txt", hashlib.sha256(a.read_bytes()).hexdigest(), len(a.read_bytes()), 0),
        ("b.txt", hashlib.sha256(b.read_bytes()).hexdigest(), 36, len(a.read_bytes()))]
    folder = tmp_path / "data"
    assert json.loads((folder / HEADER_FILE).read_text()) == header
    raw = (folder / TOKENS_FILE).read_bytes()
    assert len(raw) == 2 * n  # two bytes a token, nothing else in the file
    assert np.frombuffer(raw, dtype="<u2").tolist() == expected
    assert sorted(p.name for p in folder.iterdir()) == [HEADER_FILE, MANIFEST_FILE, TOKENS_FILE]


def test_dtype_widens_past_65536_ids(tmp_path):
    assert (token_dtype(65536), token_dtype(65537)) == ("uint16", "uint32")
    text = tmp_path / "t.txt"
    text.write_text("w0 w1 w2 w1")
    # ids 0, 1, 70000 (and the end token 70001): needs 32 bits
    spec = word_tokenizer(tmp_path / "tok", ids=[0, 1, 70000])
    header = prepare_dataset([text], spec, tmp_path / "data", val_fraction=0.4)
    assert header["dtype"] == "uint32" and header["tokenizer"]["vocab_size"] == 70002
    raw = (tmp_path / "data" / TOKENS_FILE).read_bytes()
    assert np.frombuffer(raw, dtype="<u4").tolist() == [0, 1, 70000, 1, 70001]


def test_training_windows_are_the_tokens_at_their_offsets_and_never_held_out(counted):
    folder, header = counted
    n_train, end = header["splits"]["val"][0], header["tokens"]
    assert (n_train, end) == (1001 - math.ceil(0.2 * 1001), 1001)  # 800 train, 201 held out
    T = 7
    ds = TokenDataset(folder, T)
    assert isinstance(ds.tokens, np.memmap)  # read through the map, never loaded whole
    generator = torch.Generator().manual_seed(0)
    first = []
    for _ in range(100):
        inputs, targets = ds.batch(generator, 64)
        assert inputs.shape == targets.shape == (64, T) and inputs.dtype == torch.int64
        starts = inputs[:, 0]
        offsets = starts[:, None] + torch.arange(T + 1)  # where each window was read from
        assert torch.equal(inputs, offsets[:, :T]) and torch.equal(targets, offsets[:, 1:])
        first.append(starts)
    starts = torch.cat(first)
    # every window lies in [0, n_train): its last token (start + T) is a training token
    assert int(starts.min()) == 0 and int(starts.max()) + T == n_train - 1  # both ends reached


def test_evaluation_windows_lie_in_the_held_out_split(counted):
    folder, header = counted
    n_train, end = header["splits"]["val"]
    ds = TokenDataset(folder, 7)
    inputs, targets, weights = ds.eval_batch()
    assert int(inputs.min()) == n_train  # the held-out split's first token ...
    assert int(targets.max()) == end - 1 == 1000  # ... through its last, the end token
    assert torch.isclose(weights.sum(), torch.tensor(1.0))
    full = torch.cat([inputs, targets[:, -1:]], dim=1)  # (W, T+1)
    assert torch.equal(full, full[:, :1] + torch.arange(8))  # contiguous tokens
    # evaluating does not move the training sampler: same batches with and without it
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    first = ds.batch(g1, 4)[0]
    ds.eval_batch()
    assert torch.equal(first, ds.batch(g2, 4)[0])


def test_dataset_state_and_the_model_must_hold_its_ids(counted):
    folder, header = counted
    ds = TokenDataset(folder, 7)
    state = ds.state()
    assert state["tokenizer_sha256"] == header["tokenizer"]["sha256"]
    assert state["data_sha256"] == hashlib.sha256((folder / HEADER_FILE).read_bytes()).hexdigest()
    ds.check_model(1001, 7)
    with pytest.raises(ConfigError, match="vocab_size=1000"):
        ds.check_model(1000, 7)
    assert set(ds.checkpoint_files()) == {"tokenizer.json", MANIFEST_FILE}
    with pytest.raises(ConfigError, match="held-out split has 201 tokens"):
        TokenDataset(folder, 200 + 1)


def test_a_folder_holding_other_files_is_not_replaced(tmp_path, counted):
    folder, _ = counted
    text = tmp_path / "count.txt"
    # an earlier dataset is replaced (atomically) when every file of it is written again ...
    header = prepare_dataset([text], tmp_path / "tok" / "tokenizer.json", folder,
                             val_fraction=0.5)
    assert header["splits"]["val"] == [500, 1001] and read_header(folder) == header
    # ... not when one would be lost: a bytes dataset has no tokenizer.json
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        prepare_dataset([text], "bytes", folder)
    # ... nor when the folder holds anything a dataset does not write
    (folder / "notes.md").write_text("mine")
    with pytest.raises(CheckpointError, match="notes.md"):
        prepare_dataset([text], tmp_path / "tok" / "tokenizer.json", folder)
    assert (folder / "notes.md").read_text() == "mine" and read_header(folder) == header
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a token dataset"):
        prepare_dataset([text], "bytes", other)
    assert [p.name for p in other.iterdir()] == ["a.txt"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # nothing left behind


def test_bad_inputs_raise_config_errors_naming_them(tmp_path, counted):
    folder, _ = counted
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.txt.*not UTF-8"):
        prepare_dataset([latin], "bytes", tmp_path / "x")
    short = tmp_path / "short.txt"
    short.write_text("abc")
    with pytest.raises(ConfigError, match="short.txt.*hold 3 tokens"):
        prepare_dataset([short], "bytes", tmp_path / "x")
    with pytest.raises(ConfigError, match="missing.txt"):
        prepare_dataset([tmp_path / "missing.txt"], "bytes", tmp_path / "x")
    with pytest.raises(ConfigError, match="val_fraction=1.0"):
        prepare_dataset([short], "bytes", tmp_path / "x", val_fraction=1.0)
    assert not (tmp_path / "x").exists()
    # a tokenizer file swapped after prepare: the tokens no longer mean what they meant
    word_tokenizer(tmp_path / "tok2", ids=list(range(1, WORDS + 1)))
    (folder / "tokenizer.json").write_bytes((tmp_path / "tok2" / "tokenizer.json").read_bytes())
    with pytest.raises(ConfigError, match="tokenizer.json"):
        TokenDataset(folder, 7)
    # a truncated token file
    tokens = folder / TOKENS_FILE
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(ConfigError, match="1000 tokens|declares 1001"):
        read_header(folder)
    with pytest.raises(ConfigError, match="prepare"):
        TokenDataset(tmp_path, 7)  # not a dataset folder


def test_tokenizer_spec_as_given_to_prepare_is_recorded(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3 w4")
    spec = word_tokenizer(tmp_path / "tok")
    header = prepare_dataset([text], str(spec), tmp_path / "data", val_fraction=0.4)
    tok = Tokenizer.from_spec(spec)
    assert header["tokenizer"]["sha256"] == tok.sha256 and header["tokenizer"]["eos_id"] == 1000
    assert header["sources"][0]["tokens"] == 5  # four words and the end token
    assert Tokenizer.from_folder(tmp_path / "data").sha256 == tok.sha256


def test_tokens_bin_is_covered_by_a_digest_recorded_at_prepare(counted):
    from decoder_audit.text.datasets import check_tokens  # issue 26

    folder, header = counted
    tokens = folder / TOKENS_FILE
    assert header["tokens_sha256"] == hashlib.sha256(tokens.read_bytes()).hexdigest()
    check_tokens(folder)  # as prepared: no complaint
    raw = tokens.read_bytes()
    tokens.write_bytes(raw[2:4] + raw[2:])  # the first id rewritten: same size, other tokens
    read_header(folder)  # the size still fits the header ...
    with pytest.raises(ConfigError) as refused:  # ... the digest does not
        check_tokens(folder)
    assert str(tokens) in str(refused.value)


def test_a_dataset_opened_by_a_relative_path_records_its_absolute_path(counted, monkeypatch):
    folder, _ = counted
    monkeypatch.chdir(folder.parent)
    state = TokenDataset("data", 7).state()
    assert state["data"] == str(folder.absolute())
