"""`decoder-audit convert` round-trips a folder written by `save_pretrained`, and
`--checkpoint DIR` model sources load our checkpoints."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import configs
import pytest
import torch
from cli_support import assert_kept, error_line, snapshot, transformers_or_skip
from helpers import random_decoder, randomise, trained_bpe

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.cli.common import config_from_args, model_from_args

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A grouped-query, untied Llama saved by save_pretrained, as a user would download it."""
    config = tf.LlamaConfig(vocab_size=29, hidden_size=24, intermediate_size=37, num_hidden_layers=2,
                            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=16,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                            bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    model = randomise(tf.LlamaForCausalLM(config), std=0.3)
    folder = tmp_path_factory.mktemp("hf") / "llama"
    model.save_pretrained(folder)
    return folder, model


def test_from_hf_then_to_hf_round_trips_a_save_pretrained_folder(tmp_path, llama_folder, capsys):
    folder, hf_model = llama_folder
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "ckpt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["max_abs_logit_difference"] <= 1e-5
    assert report["hf_class"] == "LlamaForCausalLM" and report["check_ids_shape"] == [2, 16]

    ours = da.load_checkpoint(tmp_path / "ckpt")
    ids = torch.randint(0, 29, (2, 16), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_model(ids).logits, rtol=0, atol=1e-5)

    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ckpt"),
                 "--out", str(tmp_path / "back")]) == 0
    assert "equal" in capsys.readouterr().out
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    original, returned = hf_model.state_dict(), back.state_dict()
    assert original.keys() == returned.keys()
    assert all(torch.equal(original[k], returned[k]) for k in original)  # bitwise round trip


def test_checkpoint_model_source_loads_our_checkpoint(tmp_path):
    model = da.Decoder(da.preset("tiny-368"))
    da.save_checkpoint(model, tmp_path / "ckpt")
    args = argparse.Namespace(checkpoint=str(tmp_path / "ckpt"), model=None, config=None, preset=None)
    assert config_from_args(args) == model.config
    loaded = model_from_args(args)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded(ids), model(ids))
    assert loaded.lm_head.weight is loaded.token_embeddings.weight


def test_bad_arguments_and_missing_folders(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--to-hf", "--out", str(tmp_path / "x")])  # no --checkpoint
    assert "--to-hf needs --checkpoint" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["convert", "--from-hf", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "missing"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- the tokenizer travels to Hugging Face (issue 15) -------------------------------------------

def _trained_bpe():
    pytest.importorskip("tokenizers")
    return trained_bpe()


@pytest.mark.parametrize("family", ["hf-gpt-gelu-biases-untied", "hf-llama-kv2-untied"])
@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json + merges.txt"])
def test_to_hf_writes_the_checkpoints_tokenizer_for_auto_tokenizer(tmp_path, family, files,
                                                                   capsys):
    from dataclasses import replace

    from decoder_audit.text.tokenizer import Tokenizer

    backend = _trained_bpe()
    source = tmp_path / "tokenizer"
    source.mkdir()
    if files == "tokenizer.json":
        backend.save(str(source / "tokenizer.json"))
        ours = Tokenizer.from_tokenizer_json(source / "tokenizer.json")
    else:
        backend.model.save(str(source))  # GPT-2's vocab.json + merges.txt
        ours = Tokenizer.from_gpt2_files(source / "vocab.json", source / "merges.txt")
    cfg = replace(configs.named(family), vocab_size=backend.get_vocab_size() + 3)  # V padded
    da.save_checkpoint(random_decoder(cfg), tmp_path / "ckpt", extra_files=ours.folder_files())

    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ckpt"),
                 "--out", str(tmp_path / "hf"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == ours.name
    defining = ["tokenizer.json"] if files == "tokenizer.json" else ["merges.txt", "vocab.json"]
    for name in defining:  # the defining files verbatim
        assert (tmp_path / "hf" / name).read_bytes() == (source / name).read_bytes()

    theirs = tf.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    end = backend.token_to_id("<|endoftext|>")
    for text in ("the cat ate the log", "unseen wörds ✓\n\tand the mat<|endoftext|>"):
        assert theirs(text)["input_ids"] == backend.encode(text).ids
        assert theirs.decode(backend.encode(text).ids) == text
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == end
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert back.config.vocab_size == cfg.vocab_size


def test_to_hf_without_a_tokenizer_file_writes_none_and_says_so(tmp_path, capsys):
    from decoder_audit.text.tokenizer import Tokenizer

    cfg = configs.named("hf-gpt-relu-mlpbias-tied")
    da.save_checkpoint(random_decoder(cfg), tmp_path / "plain")
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "plain"),
                 "--out", str(tmp_path / "hf_plain"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] is None
    # A built-in tokenizer has no Hugging Face file: the weights convert, the note says why.
    from dataclasses import replace

    big = replace(cfg, vocab_size=256)
    da.save_checkpoint(random_decoder(big), tmp_path / "bytes",
                       extra_files=Tokenizer("bytes").folder_files())
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "bytes"),
                 "--out", str(tmp_path / "hf_bytes"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokenizer"] is None
    assert any("tokenizer bytes is built in" in note for note in report["changes"])
    for out in ("hf_plain", "hf_bytes"):
        names = {p.name for p in (tmp_path / out).iterdir()}
        assert not names & {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"}


def _no_debris(folder: Path) -> None:
    """No temporary or backup folder of a save is left beside `folder`."""
    assert not list(folder.parent.glob(f".{folder.name}.*")), list(folder.parent.iterdir())


def test_convert_from_hf_onto_its_own_folder_is_refused_and_the_folder_kept(hf_folder, capsys):
    before = snapshot(hf_folder)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(hf_folder)]) == 2
    line = error_line(capsys, "convert")
    assert f"--out {str(hf_folder)!r} overlaps the folder being converted" in line
    assert_kept(before)
    assert sorted(p.name for p in hf_folder.iterdir()) == sorted(p.name for p in before)


def test_convert_into_a_hugging_face_folder_is_refused(hf_folder, tmp_path, capsys, converted):
    """A checkpoint is never written over another Hugging Face folder (not the source)."""
    other = tmp_path / "other_hf"
    shutil.copytree(hf_folder, other)
    before = snapshot(other)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(other)]) == 2
    line = error_line(capsys, "convert")
    assert "is not a checkpoint" in line and "config.json" in line
    assert_kept(before)
    _no_debris(other)


def test_convert_to_hf_onto_a_training_checkpoint_keeps_its_training_state(run_copy, capsys):
    checkpoint = run_copy / "checkpoint"
    before = snapshot(run_copy)
    transformers_or_skip()
    assert main(["convert", "--to-hf", "--checkpoint", str(checkpoint),
                 "--out", str(checkpoint)]) == 2
    assert "overlaps the folder being converted" in error_line(capsys, "convert")
    assert_kept(before)  # train_state.pt and trainer.json included


def test_convert_to_hf_into_a_training_checkpoint_elsewhere_is_refused(run_copy, tmp_path,
                                                                        capsys):
    """Not the source, but still a training checkpoint: never replaced by an HF folder."""
    transformers_or_skip()
    target = tmp_path / "target"
    shutil.copytree(run_copy / "checkpoint", target)
    before = snapshot(target)
    assert main(["convert", "--to-hf", "--checkpoint", str(run_copy),
                 "--out", str(target)]) == 2
    assert "not a Hugging Face model folder" in error_line(capsys, "convert")
    assert_kept(before)
    _no_debris(target)


def test_convert_refuses_to_delete_a_users_file_in_an_earlier_output(hf_folder, converted,
                                                                     tmp_path, capsys):
    # Our earlier checkpoint, with the user's notes beside it.
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted, ckpt)
    (ckpt / "NOTES.md").write_text("what I learned from this model\n")
    before = snapshot(ckpt)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(ckpt)]) == 2
    line = error_line(capsys, "convert")
    assert "['NOTES.md']" in line and "refusing" in line
    assert_kept(before)
    _no_debris(ckpt)
    # Our earlier Hugging Face output, with the tokenizer files the user added.
    back = tmp_path / "back"
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 0
    (back / "tokenizer.json").write_text('{"model": {}}\n')
    capsys.readouterr()
    before = snapshot(back)
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 2
    assert "['tokenizer.json']" in error_line(capsys, "convert")
    assert_kept(before)
    # Without a foreign file the earlier output is replaced, as before.
    (back / "tokenizer.json").unlink()
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 0


def test_a_failed_convert_leaves_nothing_behind(hf_folder, converted, tmp_path, capsys,
                                                monkeypatch):
    import decoder_audit.references.hf as hf

    monkeypatch.setattr(hf, "max_logit_difference", lambda *args: 0.5)  # the check fails
    out = tmp_path / "new" / "deeper" / "ckpt"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out)]) == 1
    line = error_line(capsys, "convert")
    assert "max |diff| = 5.000e-01 > --tolerance 0.0001" in line and "nothing was written" in line
    assert not (tmp_path / "new").exists()  # not the folder, not its parents, no temporaries
    # An earlier result at --out is left exactly as it was.
    earlier = tmp_path / "earlier"
    shutil.copytree(converted, earlier)
    before = snapshot(earlier)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(earlier)]) == 1
    error_line(capsys, "convert")
    assert_kept(before)
    _no_debris(earlier)


@pytest.mark.parametrize("tolerance", ["0", "-1e-4", "nan", "inf"])
def test_convert_refuses_a_tolerance_that_is_not_positive_and_finite(hf_folder, tmp_path, capsys,
                                                                     tolerance):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:  # out of the option's range (cli/values.py)
        main(["convert", "--from-hf", str(hf_folder), "--out", str(out),
              f"--tolerance={tolerance}"])
    assert refused.value.code == 2
    line = error_line(capsys, "convert")
    assert f"--tolerance: {tolerance} " in line and "finite number in (0, inf)" in line, line
    assert not out.exists()


def test_gpt2_export_says_attn_bias_false_becomes_true(tmp_path, capsys):
    transformers_or_skip()
    ckpt = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "tiny")
    assert main(["convert", "--to-hf", "--checkpoint", str(ckpt), "--out",
                 str(tmp_path / "hf"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changes"] == [
        "GPT-2 always has attention and MLP biases: attn_bias=false is written as zero biases "
        "(the same function), and reading it back gives attn_bias=true (368 -> 400 "
        "parameters)"]
    assert main(["convert", "--to-hf", "--checkpoint", str(ckpt), "--out",
                 str(tmp_path / "hf")]) == 0
    assert "note: GPT-2 always has attention and MLP biases" in capsys.readouterr().out
    # Read back, the round trip is what the note said.
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out",
                 str(tmp_path / "back")]) == 0
    back = da.load_checkpoint(tmp_path / "back")
    assert back.config.attn_bias and back.num_parameters() == 400


def test_model_safetensors_gets_the_permissions_of_the_other_files(converted, tmp_path):
    transformers_or_skip()
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out",
                 str(tmp_path / "hf")]) == 0
    for folder in (converted, tmp_path / "hf"):
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        assert len(set(modes.values())) == 1, modes  # model.safetensors was 0600


def test_a_family_beyond_gpt2_and_llama_converts_both_ways(tmp_path, capsys):
    """Gemma 2's sandwich norms, soft caps and windowed layer, through `convert` both ways: the
    command checks each written result's logits against transformers' own Gemma2ForCausalLM."""
    ours = random_decoder(configs.named("gemma2-like"))
    da.save_checkpoint(ours, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ckpt"),
                 "--out", str(tmp_path / "hf"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["hf_class"] == "Gemma2ForCausalLM"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"]
    back = da.load_checkpoint(tmp_path / "back")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ours.state_dict().items())
