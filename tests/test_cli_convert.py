"""`decoder-audit convert` round-trips a folder written by `save_pretrained`, and
`--checkpoint DIR` model sources load our checkpoints."""

from __future__ import annotations

import argparse
import json

import configs
import pytest
import torch
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
