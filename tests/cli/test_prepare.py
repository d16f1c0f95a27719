"""The dataset path end to end on the command line: `prepare` writes a token dataset, `train --data`
trains a small model on it for a few steps, the checkpoint carries the tokenizer, and `sample`
reads the model's ids with it.

The tokenizer is word-level, "w{i}" -> id i, over the text "w0 w1 ... w299": the expected ids of
any prompt and the tokens at any offset follow from that construction alone."""

from __future__ import annotations

import json

import pytest

from decoder_audit.cli import main
from decoder_audit.text.tokenizer import MANIFEST_FILE, Tokenizer

tokenizers = pytest.importorskip("tokenizers")

WORDS = 300  # w0 .. w299, and "</s>" = 300: V = 301


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("walkthrough")
    vocab = {f"w{i}": i for i in range(WORDS)} | {"</s>": WORDS}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    backend.save(str(root / "words.json"))
    (root / "text.txt").write_text(" ".join(f"w{i}" for i in range(WORDS)))
    (root / "model.json").write_text(json.dumps({
        "vocab_size": WORDS + 1, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16,
        "max_seq_len": 8}))
    assert main(["prepare", "--text", str(root / "text.txt"), "--tokenizer",
                 str(root / "words.json"), "--out", str(root / "data"), "--val-fraction",
                 "0.2"]) == 0
    assert main(["train", "--config", str(root / "model.json"), "--data", str(root / "data"),
                 "--steps", "3", "--batch-size", "4", "--eval-every", "3", "--out",
                 str(root / "run"), "--no-progress"]) == 0
    return root


def test_prepare_writes_the_dataset_and_prints_its_header(trained, tmp_path, capsys):
    header = json.loads((trained / "data" / "dataset.json").read_text())
    assert header["tokens"] == WORDS + 1 and header["dtype"] == "uint16"
    assert header["splits"]["val"] == [WORDS + 1 - 61, WORDS + 1]  # ceil(0.2 * 301) = 61
    assert main(["prepare", "--text", str(trained / "text.txt"), "--tokenizer", "bytes",
                 "--out", str(tmp_path / "b"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["tokens"] == len((trained / "text.txt").read_bytes())
    assert printed == json.loads((tmp_path / "b" / "dataset.json").read_text())


def test_train_data_checkpoint_carries_the_tokenizer(trained):
    checkpoint = trained / "run" / "checkpoint"
    meta = json.loads((checkpoint / "trainer.json").read_text())
    assert meta["task"] == "tokens" and meta["train_config"]["data"] == str(trained / "data")
    assert meta["step"] == 3
    assert (checkpoint / "tokenizer.json").read_bytes() == (trained / "words.json").read_bytes()
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    assert manifest["sha256"] == Tokenizer.from_spec(trained / "words.json").sha256
    assert manifest["eos_id"] == WORDS
    metrics = [json.loads(line) for line in (trained / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] and "eval_loss" in metrics[-1]


def test_sample_reads_the_model_with_the_checkpoints_tokenizer(trained, capsys):
    assert main(["sample", "--checkpoint", str(trained / "run"), "--prompt", "w5 w6 w7",
                 "--max-new-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"][:3] == [5, 6, 7] and len(out["new_ids"]) <= 3
    words = [f"w{i}" if i < WORDS else "</s>" for i in out["ids"]]
    assert out["text"] == " ".join(words)
    # --tokenizer overrides what the checkpoint carries (bytes fit: V = 301 >= 256)
    assert main(["sample", "--checkpoint", str(trained / "run"), "--prompt", "w5",
                 "--max-new-tokens", "1", "--tokenizer", "bytes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"][:2] == [ord("w"), ord("5")]


def test_train_refuses_a_dataset_whose_ids_exceed_the_model(trained, capsys):
    assert main(["train", "--preset", "tiny-368", "--data", str(trained / "data"), "--steps",
                 "1", "--out", str(trained / "refused"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "ids 0..300" in err and "vocab_size=8" in err
    assert not (trained / "refused" / "checkpoint").exists()


def test_convert_from_hf_keeps_the_folders_tokenizer(trained, tmp_path, capsys):
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()

    def hf_folder(name, vocab_size):
        config = tf.GPT2Config(vocab_size=vocab_size, n_embd=8, n_layer=1, n_head=2,
                               n_positions=8, attn_implementation="eager")
        folder = tmp_path / name
        tf.GPT2LMHeadModel(config).save_pretrained(folder)
        (folder / "tokenizer.json").write_bytes((trained / "words.json").read_bytes())
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w0"}))
        return folder

    folder = hf_folder("gpt2", WORDS + 1)
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "ckpt"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == "tokenizer.json:tokenizer.json"
    for name in ("tokenizer.json", "tokenizer_config.json"):  # kept byte for byte
        assert (tmp_path / "ckpt" / name).read_bytes() == (folder / name).read_bytes()
    assert json.loads((tmp_path / "ckpt" / MANIFEST_FILE).read_text())["eos_id"] == 0  # "w0"
    assert main(["sample", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "w5 w6",
                 "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"][:2] == [5, 6]

    # a tokenizer with more ids than the model's V: refused, nothing written
    small = hf_folder("small", WORDS)
    assert main(["convert", "--from-hf", str(small), "--out", str(tmp_path / "no")]) == 2
    assert "vocab_size=300" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_resuming_on_a_changed_dataset_is_refused_before_the_gate(trained, capsys):
    prepare = ["prepare", "--text", str(trained / "text.txt"), "--tokenizer",
               str(trained / "words.json"), "--out", str(trained / "data")]
    assert main([*prepare, "--val-fraction", "0.3"]) == 0  # other splits: another dataset
    try:
        assert main(["train", "--resume", str(trained / "run"), "--no-progress"]) == 2
        captured = capsys.readouterr()
        assert "dataset" in captured.err and "changed since the checkpoint" in captured.err
        assert "gate:" not in captured.out  # refused before the audit is spent
    finally:
        assert main([*prepare, "--val-fraction", "0.2"]) == 0  # as the fixture made it


# ---- issue 26: one file given twice ------------------------------------------------------------

def test_prepare_refuses_one_text_given_twice_naming_both(trained, tmp_path, capsys):
    # the last tokens are held out: a repeated file would hold out a copy of training text
    from cli_support import error_line

    text = trained / "text.txt"
    copy = tmp_path / "copy.txt"
    copy.write_bytes(text.read_bytes())
    roundabout = tmp_path / ".." / tmp_path.name / "copy.txt"
    for first, second in ((text, text),  # one path twice
                          (copy, roundabout),  # one file by two paths
                          (text, copy)):  # two files holding the same bytes
        assert main(["prepare", "--text", str(first), str(second), "--tokenizer", "bytes",
                     "--out", str(tmp_path / "data")]) == 2
        line = error_line(capsys, "prepare")
        assert str(first) in line and str(second) in line, line
    assert not (tmp_path / "data").exists()
