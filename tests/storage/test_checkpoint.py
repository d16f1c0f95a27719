"""Checkpoints: bitwise round trips with tying kept, refusal of anything damaged, mismatched or
pickled, and survival of the previous checkpoint when a save dies half way."""

from __future__ import annotations

import json
import os

import configs
import pytest
import torch
from helpers import random_decoder, snapshot, tiny_decoder
from safetensors.torch import load_file, save_file
from torch import nn

import decoder_audit as da
import decoder_audit.storage.checkpoint as ckpt
import decoder_audit.storage.folder as atomic
from decoder_audit.storage.checkpoint import (
    load_checkpoint,
    load_module_weights,
    save_checkpoint,
    save_module_weights,
)


def _ids(cfg):
    return torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len), generator=torch.Generator().manual_seed(3))


def _assert_same_model(a, b):
    assert a.config == b.config
    assert a.state_dict().keys() == b.state_dict().keys()
    for key, value in a.state_dict().items():
        assert b.state_dict()[key].dtype == value.dtype
        assert torch.equal(b.state_dict()[key], value), key
    ids = _ids(a.config)
    assert torch.equal(a(ids), b(ids))  # bitwise, not approximately


@pytest.mark.parametrize("cfg", configs.params(
    configs.entries("tiny-368", "gqa-odd", "gqa3-gelutanh-biases-tied") + configs.grid()))
def test_round_trip_is_bitwise_and_keeps_the_tie(tmp_path, cfg):
    model = random_decoder(cfg)
    folder = save_checkpoint(model, tmp_path / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert da.DecoderConfig.from_json((folder / "config.json").read_text()) == cfg

    # Plain safetensors reads it (no shared-tensor error); the tied weight is stored once.
    stored = load_file(str(folder / "model.safetensors"))
    assert ("lm_head.weight" in stored) == (not cfg.tie_embeddings)
    assert len(stored) == len(list(model.parameters()))

    loaded = load_checkpoint(folder)
    _assert_same_model(model, loaded)
    if cfg.tie_embeddings:
        assert loaded.lm_head.weight is loaded.token_embeddings.weight
        assert len(list(loaded.parameters())) == len(list(loaded.named_parameters(remove_duplicate=False))) - 1


def test_bfloat16_round_trip_and_dtype_override(tmp_path):
    model = random_decoder(configs.named("gqa3-gelutanh-biases-tied"), dtype=torch.bfloat16)
    save_checkpoint(model, tmp_path / "c")
    loaded = load_checkpoint(tmp_path / "c")
    _assert_same_model(model, loaded)
    wide = load_checkpoint(tmp_path / "c", dtype=torch.float64)
    assert wide.token_embeddings.weight.dtype == torch.float64
    assert torch.equal(wide.token_embeddings.weight, model.token_embeddings.weight.double())
    assert wide.lm_head.weight is wide.token_embeddings.weight


def test_extra_files_are_saved_beside_the_weights(tmp_path):
    model = random_decoder(configs.named("tiny-368"))
    folder = save_checkpoint(model, tmp_path / "c", extra_files={"optimizer.safetensors": b"\x01\x02",
                                                                 "trainer.json": b"{}"})
    assert (folder / "optimizer.safetensors").read_bytes() == b"\x01\x02"
    assert (folder / "trainer.json").read_bytes() == b"{}"
    _assert_same_model(model, load_checkpoint(folder))
    for bad in ("../escape", "sub/dir", "config.json", "model.safetensors", ""):
        with pytest.raises(da.CheckpointError, match="plain file name"):
            save_checkpoint(model, tmp_path / "d", extra_files={bad: b""})


def test_wrong_config_lists_missing_unexpected_and_mismatched_names(tmp_path):
    cfg = configs.named("gqa3-gelutanh-biases-tied")
    folder = save_checkpoint(random_decoder(cfg), tmp_path / "c")
    # A config with other widths and no biases: shapes and names both disagree.
    other = cfg.replace(d_ff=40, mlp_bias=False)
    (folder / "config.json").write_text(other.to_json())
    with pytest.raises(da.CheckpointError) as info:
        load_checkpoint(folder)
    message = str(info.value)
    assert "model.safetensors" in message and "config.json" in message
    assert "unexpected ['layers.0.ffn.w1.bias'" in message
    assert "layers.0.ffn.w1.weight is (37, 24), the config needs (40, 24)" in message


def test_missing_and_renamed_tensors_are_named(tmp_path):
    cfg = configs.named("tiny-368")
    folder = save_checkpoint(random_decoder(cfg), tmp_path / "c")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["ln_final.gain"] = tensors.pop("ln_final.weight")
    del tensors["position_embeddings.weight"]
    tensors["lm_head.weight"] = tensors["token_embeddings.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(da.CheckpointError) as info:
        load_checkpoint(folder)
    message = str(info.value)
    assert "missing ['ln_final.weight', 'position_embeddings.weight']" in message
    assert "unexpected ['lm_head.weight', 'ln_final.gain']" in message
    assert "stored once" in message  # the hint about tying


def test_invalid_config_json_is_a_checkpoint_error_naming_the_file(tmp_path):
    cfg = configs.named("tiny-368")
    folder = save_checkpoint(random_decoder(cfg), tmp_path / "c")
    (folder / "config.json").write_text(json.dumps({**cfg.to_dict(), "n_heads": 3}))
    with pytest.raises(da.CheckpointError, match=r"config\.json.*d_model=4 is not divisible by n_heads=3"):
        load_checkpoint(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(da.CheckpointError, match=r"config\.json.*not valid JSON"):
        load_checkpoint(folder)


def test_flipped_data_byte_is_caught_by_the_digest(tmp_path):
    folder = save_checkpoint(random_decoder(configs.named("tiny-368")), tmp_path / "c")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40  # inside the last tensor's data; the header is still valid
    weights.write_bytes(bytes(data))
    with pytest.raises(da.CheckpointError, match=r"model\.safetensors.*corrupted.*SHA-256"):
        load_checkpoint(folder)


def test_corrupted_header_and_truncated_file_name_the_file(tmp_path):
    folder = save_checkpoint(random_decoder(configs.named("tiny-368")), tmp_path / "c")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:8] + b"#" + good[9:])  # the JSON header no longer parses
    with pytest.raises(da.CheckpointError, match=r"model\.safetensors.*not a readable safetensors"):
        load_checkpoint(folder)
    weights.write_bytes(good[: len(good) - 100])  # truncated
    with pytest.raises(da.CheckpointError, match=r"model\.safetensors.*not a readable safetensors"):
        load_checkpoint(folder)
    weights.write_bytes(b"")
    with pytest.raises(da.CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(folder)


def test_pickles_are_refused_without_being_unpickled(tmp_path, monkeypatch):
    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load must never be called on a checkpoint")

    model = random_decoder(configs.named("tiny-368"))
    folder = save_checkpoint(model, tmp_path / "c")
    monkeypatch.setattr(torch, "load", no_unpickling)
    # A torch.save pickle offered under the weights file's name.
    torch.save(model.state_dict(), folder / "model.safetensors")
    with pytest.raises(da.CheckpointError, match="pickle file, not safetensors; refused"):
        load_checkpoint(folder)
    # A folder with only pickle weights.
    os.replace(folder / "model.safetensors", folder / "pytorch_model.bin")
    with pytest.raises(da.CheckpointError, match=r"pickle weights \['pytorch_model.bin'\]"):
        load_checkpoint(folder)


def test_missing_folder_and_file_instead_of_folder(tmp_path):
    with pytest.raises(da.CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(da.CheckpointError, match="is a file"):
        load_checkpoint(tmp_path / "file")
    with pytest.raises(da.CheckpointError, match="not a folder"):
        save_checkpoint(random_decoder(configs.named("tiny-368")), tmp_path / "file")


def test_save_refuses_to_replace_an_unrelated_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(da.CheckpointError, match="does not look like one of our outputs"):
        save_checkpoint(random_decoder(configs.named("tiny-368")), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


def test_crash_while_writing_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    cfg = configs.named("gqa3-gelutanh-biases-tied")
    old, new = random_decoder(cfg, seed=0), random_decoder(cfg, seed=1)
    path = save_checkpoint(old, tmp_path / "c")

    def dying_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:  # half a file, then the process "dies"
            handle.write(b"\x00" * 100)
        raise KeyboardInterrupt("simulated crash mid-write")

    monkeypatch.setattr(ckpt, "save_file", dying_save_file)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(new, path)
    _assert_same_model(old, load_checkpoint(path))
    stale = list(tmp_path.glob(".c.tmp-*"))
    assert len(stale) == 1  # the half-written temporary is what a crash leaves

    monkeypatch.undo()
    save_checkpoint(new, path)  # the next save cleans up and replaces
    _assert_same_model(new, load_checkpoint(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_crash_after_the_swap_leaves_the_new_checkpoint(tmp_path, monkeypatch):
    cfg = configs.named("tiny-368")
    old, new = random_decoder(cfg, seed=0), random_decoder(cfg, seed=1)
    path = save_checkpoint(old, tmp_path / "c")

    def dying_rmtree(*args, **kwargs):
        raise KeyboardInterrupt("simulated crash before removing the old copy")

    monkeypatch.setattr(atomic.shutil, "rmtree", dying_rmtree)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(new, path)
    monkeypatch.undo()
    _assert_same_model(new, load_checkpoint(path))
    assert len(list(tmp_path.glob(".c.old-*"))) == 1  # holds the old checkpoint, now debris
    save_checkpoint(old, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def _save_torn_between_the_renames(model, path) -> None:
    """Saves `model` over `path`, crashing (KeyboardInterrupt) after the old folder is moved
    aside and before the new one is renamed into place; os.rename is restored afterwards."""
    real_rename = os.rename

    def die_before_the_rename_into_place(src, dst):
        if os.fspath(dst) == str(path):
            raise KeyboardInterrupt("simulated crash between the renames")
        real_rename(src, dst)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atomic.os, "rename", die_before_the_rename_into_place)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(model, path)


def test_crash_between_the_two_renames(tmp_path):
    """The old folder is moved aside first; a crash before the new one is renamed into place
    leaves no `c/` at all, but two complete checkpoints beside it. load_checkpoint("c") takes
    the newer, a save that fails deletes neither, and only a save that completes removes them."""
    cfg = configs.named("gqa-odd")
    old, new = random_decoder(cfg, seed=0), random_decoder(cfg, seed=1)
    path = save_checkpoint(old, tmp_path / "c")
    _save_torn_between_the_renames(new, path)
    assert not path.exists()
    with pytest.warns(UserWarning, match="is missing"):
        _assert_same_model(new, load_checkpoint(path))  # the newest complete checkpoint
    stranded = snapshot(tmp_path)

    def refuse(folder):
        raise ValueError("the written result does not match")

    with pytest.raises(ValueError, match="does not match"):  # a save that fails ...
        save_checkpoint(random_decoder(cfg, seed=2), path, check=refuse)
    assert snapshot(tmp_path) == stranded  # ... deletes neither stranded checkpoint
    with pytest.warns(UserWarning, match="is missing"):
        _assert_same_model(new, load_checkpoint(path))

    save_checkpoint(new, path)  # a save that completes removes every backup
    _assert_same_model(new, load_checkpoint(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_the_command_line_says_a_stranded_copy_in_one_line_of_its_own(tmp_path, capsys):
    """A save torn between its renames leaves no `c/`; a command reading `c` takes the newest
    complete copy and says so in one line, `decoder-audit sample: warning: ...`, naming both
    folders: not Python's warning with its file, line and source line (issue 44)."""
    import sys
    import warnings

    from decoder_audit.cli import main

    path = save_checkpoint(tiny_decoder(0), tmp_path / "c")
    _save_torn_between_the_renames(tiny_decoder(1), path)
    copy = atomic.stranded_copies(path)[0]

    def as_python_shows(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():  # a command's process: shown on stderr, not recorded
        warnings.simplefilter("default")
        warnings.showwarning = as_python_shows
        assert main(["sample", "--checkpoint", str(path), "--prompt", "<bos> A"]) == 0
    # the warning's lines, not sample's own summary (on stderr too: "(greedy; ...)")
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.strip() and not line.startswith("(")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("decoder-audit sample: warning: "), lines[0]
    assert str(path) in lines[0] and str(copy) in lines[0], lines[0]


def test_save_refuses_a_checkpoint_folder_holding_a_users_file(tmp_path):
    folder = da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")
    (folder / "NOTES.md").write_text("keep me\n")
    before = snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match=r"holds \['NOTES.md'\], which a checkpoint does "
                                                 r"not write; refusing"):
        da.save_checkpoint(tiny_decoder(1), folder)
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind


def test_a_plain_save_never_drops_a_training_checkpoints_state(tmp_path):
    folder = da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt",
                                extra_files={"train_state.pt": b"state", "trainer.json": b"{}"})
    before = snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match=r"\['train_state.pt', 'trainer.json'\]"):
        da.save_checkpoint(tiny_decoder(1), folder)
    assert snapshot(tmp_path) == before
    # Writing the same entries again replaces it, as every training save does.
    da.save_checkpoint(tiny_decoder(1), folder, extra_files={"train_state.pt": b"2", "trainer.json": b"2"})
    assert (folder / "train_state.pt").read_bytes() == b"2"


def test_a_hugging_face_folder_is_not_replaced_by_a_checkpoint_nor_the_reverse(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 4}))
    (hf / "model.safetensors").write_bytes(b"weights")
    ckpt = da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")
    before = snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match="that is not a checkpoint"):
        da.save_checkpoint(tiny_decoder(1), hf)
    pytest.importorskip("transformers")
    with pytest.warns(UserWarning, match="attn_bias=false"), \
            pytest.raises(da.CheckpointError, match="that is not a Hugging Face model folder"):
        da.save_hf_folder(tiny_decoder(1), ckpt)
    assert snapshot(tmp_path) == before


def test_the_config_is_covered_by_the_recorded_digest(tmp_path):
    model = tiny_decoder()
    folder = da.save_checkpoint(model, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))  # re-formatted, same fields: fine
    assert da.load_checkpoint(folder).config == model.config
    (folder / "config.json").write_text(json.dumps({**config, "mlp": "gelu"}))
    with pytest.raises(da.CheckpointError, match="was changed after the checkpoint was saved"):
        da.load_checkpoint(folder)


def test_non_finite_weights_are_refused_on_save(tmp_path):
    model = tiny_decoder()
    with torch.no_grad():
        model.ln_final.bias[1] = float("inf")
    with pytest.raises(da.CheckpointError, match=r"refusing to save: tensors \['ln_final.bias'\] "
                                                 r"hold NaN or inf"):
        da.save_checkpoint(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(3))


def test_module_weights_round_trip_with_the_tie_and_refuse_another_module(tmp_path):
    torch.manual_seed(0)
    saved = Tied()
    folder = save_module_weights(saved, tmp_path / "w", factory={"factory": "m.py:build"})
    assert json.loads((folder / "factory.json").read_text()) == {"factory": "m.py:build"}
    loaded = load_module_weights(Tied(), folder)
    assert torch.equal(loaded.emb.weight, saved.emb.weight)
    assert loaded.head.weight is loaded.emb.weight
    with pytest.raises(da.CheckpointError, match=r"does not fit Linear: missing \['weight'\]; "
                                                 r"unexpected \['emb.weight', 'head.weight', "
                                                 r"'scale'\]"):
        load_module_weights(nn.Linear(3, 5, bias=False), folder)
    with pytest.raises(da.CheckpointError, match="not a Decoder checkpoint"):
        da.load_checkpoint(folder)
