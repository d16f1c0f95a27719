"""What every command says when it refuses (issue 26): one line on stderr naming the value and
the limit, a non-zero exit, the traceback only with `--debug`; and user text (decoded tokens, file
names) printed as it is, never read as rich markup.

The messages are checked for their facts (the file, the word and where it stands), not for
their wording."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from cli_support import assert_kept, error_line, snapshot

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.console import console
from decoder_audit.text.tasks import ByteText, describe_ids
from decoder_audit.text.tokenizer import Tokenizer

tokenizers = pytest.importorskip("tokenizers")

# Text rich would read as markup: `[k]` would vanish, `[/x]` would raise MarkupError.
MARKUP = "topics[k] [/x] "


def _byte_config(tmp_path: Path, max_seq_len: int = 8) -> Path:
    path = tmp_path / "bytes.json"
    da.DecoderConfig(vocab_size=256, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                     max_seq_len=max_seq_len).save(path)
    return path


def _printed(lines: list[str]) -> str:
    """The lines as our console prints them."""
    out = console()
    with out.capture() as captured:
        for line in lines:
            out.print(line)
    return captured.get()


# ---- a tokenizer without tokens, a word the tiny vocabulary lacks ------------------------------

@pytest.fixture
def empty_tokenizer(tmp_path) -> Path:
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    path = tmp_path / "no-tokens.json"
    backend.save(str(path))
    return path


@pytest.fixture
def english(tmp_path) -> Path:
    path = tmp_path / "english.txt"
    path.write_text("The cat sat on the mat.\n" * 20)
    return path


def test_a_tokenizer_without_tokens_is_one_line_naming_it_in_every_command(
        empty_tokenizer, english, tmp_path, capsys, hf_folder):
    ckpt = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "ckpt")
    hf = tmp_path / "hf"
    shutil.copytree(hf_folder, hf)
    shutil.copy(empty_tokenizer, hf / "tokenizer.json")
    commands = {
        "prepare": ["prepare", "--text", str(english), "--tokenizer", str(empty_tokenizer),
                    "--out", str(tmp_path / "data")],
        "train": ["train", "--text", str(english), "--tokenizer", str(empty_tokenizer),
                  "--config", str(_byte_config(tmp_path)), "--steps", "1",
                  "--out", str(tmp_path / "run"), "--no-progress"],
        "sample": ["sample", "--checkpoint", str(ckpt), "--prompt", "<bos> A",
                   "--tokenizer", str(empty_tokenizer)],
        "convert": ["convert", "--from-hf", str(hf), "--out", str(tmp_path / "converted")],
    }
    for command, argv in commands.items():
        assert main(argv) == 2, command
        line = error_line(capsys, command)
        named = "tokenizer.json" if command == "convert" else empty_tokenizer.name
        assert named in line, line
    assert not any((tmp_path / name).exists() for name in ("data", "run", "converted"))


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_english_through_the_tiny_vocabulary_names_the_first_word_and_where(english, tmp_path,
                                                                            capsys, command):
    argv = {"prepare": ["prepare", "--text", str(english), "--tokenizer", "tiny-vocab",
                        "--out", str(tmp_path / "data")],
            "train": ["train", "--text", str(english), "--tokenizer", "tiny-vocab",
                      "--steps", "1", "--out", str(tmp_path / "run"), "--no-progress"]}[command]
    assert main(argv) == 2
    line = error_line(capsys, command)
    assert "'The'" in line and re.search(r"\b0\b", line), line  # the first word, character 0


# ---- a user's file where a command writes: refused in one line, kept ---------------------------

def test_a_users_file_in_the_out_folder_is_refused_in_one_line(english, tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "NOTES.md").write_text("mine\n")
    before = snapshot(out)
    assert main(["prepare", "--text", str(english), "--tokenizer", "bytes",
                 "--out", str(out)]) == 2
    line = error_line(capsys, "prepare")
    assert str(out) in line and "NOTES.md" in line
    assert_kept(before)
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "NOTES.md").write_text("mine\n")
    before = snapshot(run)
    assert main(["train", "--steps", "1", "--out", str(run), "--no-progress"]) == 2
    assert str(run.name) in error_line(capsys, "train")
    assert_kept(before)


# ---- anything else: one line, and the traceback with --debug -----------------------------------

FORWARD_RAISES = '''
import torch


class Boom(BaseException):
    """Not an Exception: no `except Exception` in the gate stops it."""


class Raises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 8)

    def forward(self, ids):
        raise Boom("the forward blew up at step 7")


def build():
    return Raises()
'''


def test_an_unexpected_error_is_one_line_and_debug_raises_it(tmp_path, capsys):
    path = tmp_path / "raises.py"
    path.write_text(FORWARD_RAISES)
    argv = ["verify", "--model", f"{path}:build", "--vocab-size", "8", "--no-progress"]
    assert main(argv) == 1
    line = error_line(capsys, "verify")
    assert "Boom" in line and "step 7" in line and "--debug" in line
    with pytest.raises(BaseException, match="step 7") as raised:
        main(["--debug", *argv])
    assert type(raised.value).__name__ == "Boom"
    # a refusal too comes with its traceback under --debug
    with pytest.raises(da.ConfigError):
        main(["--debug", "verify", "--preset", "no-such-preset"])


def test_a_usage_error_is_one_line_with_its_value(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["sample", "--checkpoint", "x", "--prompt", "a", "--temperature", "warm"])
    assert exited.value.code == 2
    assert "'warm'" in error_line(capsys, "sample")


# ---- user text is printed as it is ---------------------------------------------------------------

def test_the_alignment_of_byte_text_prints_brackets_as_they_are(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(MARKUP * 40)  # 600 bytes: 60 held out, room for a window of 33
    task = ByteText(path, seq_len=32)
    window = torch.tensor(list((MARKUP * 3).encode()))
    printed = _printed(task.describe_pair(window[:32], window[1:33]))
    assert "topics[k]" in printed and "[/x]" in printed


def test_the_alignment_of_tokens_prints_brackets_as_they_are(tmp_path):
    words = {"topics[k]": 0, "[/x]": 1, "[bold]": 2, "end\\": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[/x]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.save(str(tmp_path / "words.json"))
    tok = Tokenizer.from_spec(tmp_path / "words.json")
    ids = torch.tensor([0, 1, 2, 3, 0])
    lines = describe_ids(tok, ids[:4], ids[1:])
    printed = _printed(lines).splitlines()
    for word in ("topics[k]", "[/x]", "[bold]", "end\\\\"):  # repr() doubles the backslash
        assert word in printed[0] or word in printed[1], (word, printed)
    # the columns still line up: each target token starts under its input token
    assert printed[0].index("'[/x]'") == printed[1].index("'[bold]'")


def test_train_on_a_corpus_holding_markup_prints_it_as_it_is(tmp_path, capsys):
    path = tmp_path / "corpus.txt"
    path.write_text(MARKUP * 40)  # every window of 33 bytes holds both
    assert main(["train", "--text", str(path), "--config", str(_byte_config(tmp_path, 32)),
                 "--steps", "1", "--batch-size", "2", "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    alignment = out[out.index("loss alignment"):]
    assert "topics[k]" in alignment and "[/x]" in alignment


def test_prepare_prints_file_names_holding_markup_as_they_are(tmp_path, capsys):
    text = tmp_path / "topics[k].txt"
    text.write_text("hello world\n" * 10)
    out = tmp_path / "data[/x]"
    assert main(["prepare", "--text", str(text), "--tokenizer", "bytes", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and str(text) in printed
    assert json.loads((out / "dataset.json").read_text())["sources"][0]["path"] == str(text)


def test_convert_prints_folder_names_holding_markup_as_they_are(hf_folder, tmp_path, capsys):
    out = tmp_path / "ckpt[/x]"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
