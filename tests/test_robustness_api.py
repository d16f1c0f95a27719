"""Issue 14 through the Python API: the same cases as tests/test_robustness_cli.py where a library
caller meets them first (typed errors naming the value, nothing on disk lost), and the pieces
the command line is built from (the folder swap, the run lock, the memory check, the run
options of a resumed run)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from torch import nn

import decoder_audit as da
from decoder_audit.accounting.memory import check_fits
from decoder_audit.errors import RunFolderError, TrainingDiverged
from decoder_audit.storage.checkpoint import load_module_weights, save_module_weights
from decoder_audit.storage.folder import write_folder_atomically
from decoder_audit.text.tokenizer import Tokenizer
from decoder_audit.training import train
from decoder_audit.training.distributed import resolve_device
from decoder_audit.training.lock import RunLock
from decoder_audit.training.run import resolve_run_options
from decoder_audit.training.state import read_metrics, read_trainer_state, truncate_metrics


def _snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _tiny(seed: int = 0) -> da.Decoder:
    torch.manual_seed(seed)
    return da.Decoder(da.preset("tiny-368"))


# ----------------------------------------------------------------------------------------------
# save_checkpoint: never empties a folder holding what it did not write
# ----------------------------------------------------------------------------------------------

def test_save_refuses_a_checkpoint_folder_holding_a_users_file(tmp_path):
    folder = da.save_checkpoint(_tiny(0), tmp_path / "ckpt")
    (folder / "NOTES.md").write_text("keep me\n")
    before = _snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match=r"holds \['NOTES.md'\], which a checkpoint does "
                                                 r"not write; refusing"):
        da.save_checkpoint(_tiny(1), folder)
    assert _snapshot(tmp_path) == before  # nothing written, nothing left behind


def test_a_plain_save_never_drops_a_training_checkpoints_state(tmp_path):
    folder = da.save_checkpoint(_tiny(0), tmp_path / "ckpt",
                                extra_files={"train_state.pt": b"state", "trainer.json": b"{}"})
    before = _snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match=r"\['train_state.pt', 'trainer.json'\]"):
        da.save_checkpoint(_tiny(1), folder)
    assert _snapshot(tmp_path) == before
    # Writing the same entries again replaces it, as every training save does.
    da.save_checkpoint(_tiny(1), folder, extra_files={"train_state.pt": b"2", "trainer.json": b"2"})
    assert (folder / "train_state.pt").read_bytes() == b"2"


def test_a_hugging_face_folder_is_not_replaced_by_a_checkpoint_nor_the_reverse(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 4}))
    (hf / "model.safetensors").write_bytes(b"weights")
    ckpt = da.save_checkpoint(_tiny(0), tmp_path / "ckpt")
    before = _snapshot(tmp_path)
    with pytest.raises(da.CheckpointError, match="that is not a checkpoint"):
        da.save_checkpoint(_tiny(1), hf)
    pytest.importorskip("transformers")
    with pytest.warns(UserWarning, match="attn_bias=false"), \
            pytest.raises(da.CheckpointError, match="that is not a Hugging Face model folder"):
        da.save_hf_folder(_tiny(1), ckpt)
    assert _snapshot(tmp_path) == before


def test_a_failing_check_leaves_nothing_not_even_new_parent_folders(tmp_path):
    def refuse(folder):
        assert (folder / "model.safetensors").is_file()  # runs on the complete new folder
        raise ValueError("the written result does not match")

    with pytest.raises(ValueError, match="does not match"):
        da.save_checkpoint(_tiny(), tmp_path / "a" / "b" / "ckpt", check=refuse)
    assert list(tmp_path.iterdir()) == []
    old = da.save_checkpoint(_tiny(0), tmp_path / "ckpt")
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError):
        da.save_checkpoint(_tiny(1), old, check=refuse)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_written_files_get_the_default_mode(tmp_path):
    folder = da.save_checkpoint(_tiny(), tmp_path / "ckpt", extra_files={"x.txt": b"1"})
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()} == {
        name: 0o666 & ~mask for name in ("config.json", "model.safetensors", "x.txt")}


def test_write_folder_atomically_replaces_only_its_own_kind(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a").write_text("1")

    def write(tmp):
        (tmp / "a").write_text("2")

    with pytest.raises(da.CheckpointError, match="does not look like one of our outputs"):
        write_folder_atomically(folder, write, same_kind=lambda p: False, what="thing")
    assert write_folder_atomically(folder, write, same_kind=lambda p: True, what="thing") == folder
    assert (folder / "a").read_text() == "2"


# ----------------------------------------------------------------------------------------------
# Checkpoint integrity: the config's digest, non-finite weights
# ----------------------------------------------------------------------------------------------

def test_the_config_is_covered_by_the_recorded_digest(tmp_path):
    model = _tiny()
    folder = da.save_checkpoint(model, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))  # re-formatted, same fields: fine
    assert da.load_checkpoint(folder).config == model.config
    (folder / "config.json").write_text(json.dumps({**config, "mlp": "gelu"}))
    with pytest.raises(da.CheckpointError, match="was changed after the checkpoint was saved"):
        da.load_checkpoint(folder)


def test_non_finite_weights_are_refused_on_save(tmp_path):
    model = _tiny()
    with torch.no_grad():
        model.ln_final.bias[1] = float("inf")
    with pytest.raises(da.CheckpointError, match=r"refusing to save: tensors \['ln_final.bias'\] "
                                                 r"hold NaN or inf"):
        da.save_checkpoint(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


# ----------------------------------------------------------------------------------------------
# A module that is not a Decoder: state dict + factory.json
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# oracle_logits and parameter_ledger: typed errors, not wrong numbers or raw tracebacks
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ids, error, says", [
    (torch.tensor([[1, -1]]), da.TokenIdError, r"token id -1 is outside \[0, vocab_size=8\)"),
    (torch.tensor([[1, 8]]), da.TokenIdError, r"token id 8 is outside \[0, vocab_size=8\)"),
    (torch.ones(1, 5, dtype=torch.long), da.ContextLengthError,
     r"T=5 is outside \[1, max_seq_len=4\]"),
    (torch.ones(1, 2, dtype=torch.long, device="meta"), da.InputShapeError,
     "on the meta device"),
    (torch.ones(1, 2), da.InputShapeError,
     r"integer tensor \(B, T\) with B >= 1, got \(1, 2\) of dtype torch.float32"),
    (torch.ones(2, 3, dtype=torch.bool), da.InputShapeError, r"got \(2, 3\) of dtype torch.bool"),
    (torch.ones(0, 3, dtype=torch.long), da.InputShapeError, r"B >= 1, got \(0, 3\)"),
    ([[1, 2]], da.InputShapeError, "got list of dtype None"),
])
def test_oracle_refuses_ids_outside_the_contract(ids, error, says):
    model = _tiny()
    with pytest.raises(error, match=says):
        da.oracle_logits(model.state_dict(), model.config, ids)


def test_oracle_names_missing_weights():
    model = _tiny()
    state = dict(model.state_dict())
    del state["layers.1.attn.v_proj.weight"], state["ln_final.bias"]
    with pytest.raises(da.CheckpointError, match=r"lack \['layers.1.attn.v_proj.weight', "
                                                 r"'ln_final.bias'\]"):
        da.oracle_logits(state, model.config, torch.tensor([[1, 3]]))
    ids = torch.tensor([[1, 3, 4, 5]])  # the contract holds: same numbers as before
    torch.testing.assert_close(da.oracle_logits(model.state_dict(), model.config, ids).float(),
                               model(ids), rtol=0, atol=1e-5)


def test_parameter_ledger_takes_a_dict_and_names_a_wrong_type():
    assert da.parameter_ledger(da.preset("tiny-368").to_dict()).total == 368
    with pytest.raises(da.ConfigError, match="missing required config field"):
        da.parameter_ledger({"vocab_size": 8})
    with pytest.raises(TypeError, match="needs a DecoderConfig .* got list"):
        da.parameter_ledger([8, 4])


def test_a_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(da.ConfigError, match=r"is not UTF-8 text \(byte 0xff at offset 0\)"):
        da.DecoderConfig.load(path)


# ----------------------------------------------------------------------------------------------
# Training: divergence, run options, the lock, metrics, devices, memory
# ----------------------------------------------------------------------------------------------

def test_divergence_raises_with_the_step_and_value_and_nothing_bad_is_saved(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as info:
        train("tiny-368", out=out, steps=20, warmup=0, lr=1e10, batch_size=16, save_every=1,
              progress=False, verbose=False)
    diverged = info.value
    assert math.isnan(diverged.value) or math.isinf(diverged.value)
    assert diverged.quantity in ("training loss", "gradient norm")
    assert read_trainer_state(out / "checkpoint")[0]["step"] == diverged.step - 1
    for line in (out / "metrics.jsonl").read_text().splitlines():
        assert "NaN" not in line and "Infinity" not in line


def test_run_options_of_a_resumed_run():
    saved = {"save_every": 8, "eval_every": 5, "device": "cpu", "threads": 1}
    unset = {"save_every": None, "eval_every": None, "device": None, "threads": "auto"}
    assert resolve_run_options(unset, saved) == (saved, [])
    chosen, notes = resolve_run_options({**unset, "save_every": 4}, saved)
    assert chosen["save_every"] == 4 and notes == ["save_every=4 replaces the run's save_every=8"]
    assert resolve_run_options(unset, None)[0] == {"save_every": 0, "eval_every": 50,
                                                   "device": "cpu", "threads": "auto"}
    with pytest.raises(da.ConfigError, match=r"threads=-1 must be an integer >= 1"):
        resolve_run_options({**unset, "threads": -1}, None)
    with pytest.raises(da.ConfigError, match=r"eval_every=0 must be an integer >= 1"):
        resolve_run_options({**unset, "eval_every": 0}, None)


def test_the_run_lock_is_exclusive_takes_over_stale_locks_and_cleans_up(tmp_path):
    folder = tmp_path / "new" / "run"
    said = []
    with RunLock(folder, say=said.append):
        holder = json.loads((folder / "run.lock").read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunFolderError, match=rf"is in use by another decoder-audit train "
                                                 rf"\(pid {os.getpid()} on"):
            RunLock(folder).acquire()
    assert not (tmp_path / "new").exists()  # it made the folders, and they were left empty
    folder.mkdir(parents=True)
    (folder / "run.lock").write_text(json.dumps({"pid": 2**22 + 12345, "host": "gone"}))
    with RunLock(folder, say=said.append):
        pass
    assert said == [f"note: took over the stale lock of pid {2**22 + 12345} (started at an "
                    "unknown time), which is no longer running"]
    assert list(folder.iterdir()) == []  # a folder it did not make stays


def test_a_torn_last_metrics_line_is_dropped_and_a_torn_middle_line_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval_loss": 2.0}\n{"step": 1, "loss": 1.9}\n{"step": 2, "lo')
    assert [row["step"] for row in read_metrics(path)] == [0, 1]
    truncate_metrics(path, 1)
    assert path.read_text() == '{"step": 0, "eval_loss": 2.0}\n{"step": 1, "loss": 1.9}\n'
    path.write_text('{"step": 0}\n{"ste\n{"step": 2}\n')
    with pytest.raises(RunFolderError, match=r"line 2 is not a metrics row"):
        read_metrics(path)


@pytest.mark.parametrize("device, says", [
    ("tpu", "'tpu' is not a device decoder-audit trains on"),
    ("cuda:x", "'cuda:x' is not a device"),
])
def test_devices_that_do_not_exist(device, says):
    with pytest.raises(da.ConfigError, match=says):
        resolve_device(device, 0)
    if not torch.cuda.is_available():
        with pytest.raises(da.ConfigError, match="CUDA is not available on this machine"):
            resolve_device("cuda", 0)
    assert resolve_device("cpu", 0) == "cpu"


def test_memory_is_checked_from_the_analytic_count():
    cfg = da.preset("tiny-368")
    check_fits(cfg, available=368 * 4)  # exactly fits
    with pytest.raises(da.ConfigError, match=r"need 0.0 GB \(368 parameters x 4 bytes x 4\), "
                                             r"but only 0.0 GB is available"):
        check_fits(cfg, copies=4, what="training", available=368 * 4)


def test_sampling_needs_a_tokenizer_for_the_vocabulary():
    assert Tokenizer.for_vocab_size(256).kind == "bytes"
    assert Tokenizer.for_vocab_size(8).kind == "tiny-vocab"
    with pytest.raises(da.ConfigError, match=r"no tokenizer for vocab_size=2048.*pass "
                                             r"--tokenizer"):
        Tokenizer.for_vocab_size(2048)


def test_to_hf_says_what_the_gpt2_format_changes():
    pytest.importorskip("transformers")
    with pytest.warns(UserWarning, match=r"attn_bias=false is written as zero biases.*368 -> "
                                         r"400 parameters"):
        da.to_hf(_tiny())
