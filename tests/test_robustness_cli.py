"""Issue 14, "nothing lost, nothing raw", replayed through the real entry point
(`decoder_audit.cli.main`, in process; a second process where two runs must meet).

Every case ends either in the right behaviour or in a non-zero exit with ONE line on stderr that
names the problem and the value, and every file that existed before the command is still there,
byte for byte (`_snapshot` / `_assert_kept`). Expectations are written here from the issue: the
exit codes (1 for a check or run that failed, 2 for what the user must fix), the offending value
in the line, and the files on disk."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import decoder_audit as da
import decoder_audit.training.loop as loop
from decoder_audit.cli import build_parser, main
from decoder_audit.storage.checkpoint import load_module_weights
from decoder_audit.training.state import read_trainer_state

# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def _snapshot(*roots: Path) -> dict[Path, bytes]:
    """Every file under `roots` (hidden ones too) and its bytes."""
    files = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files.update({path: path.read_bytes() for path in paths})
    return files


def _assert_kept(before: dict[Path, bytes]) -> None:
    for path, data in before.items():
        assert path.is_file(), f"{path} was deleted"
        assert path.read_bytes() == data, f"{path} was changed"


def _error_line(capsys, command: str) -> str:
    """stderr is exactly one line, `decoder-audit COMMAND: error: ...`; returns it."""
    return _one_line(capsys.readouterr().err, command)


def _one_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith(f"decoder-audit {command}: error: "), lines[0]
    return lines[0]


def _no_debris(folder: Path) -> None:
    """No temporary or backup folder of a save is left beside `folder`."""
    assert not list(folder.parent.glob(f".{folder.name}.*")), list(folder.parent.iterdir())


def _strict_rows(path: Path) -> list[dict]:
    """metrics.jsonl parsed as strict JSON: a bare NaN/Infinity is an error."""
    def refuse(constant):
        raise AssertionError(f"{path} holds bare {constant}, which is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


TRAIN = ["--batch-size", "16", "--warmup", "4", "--no-progress"]


class Interrupt:
    """Ctrl-C (KeyboardInterrupt) right after step `at` has been recorded (and checkpointed if
    due), the way the user's key press would arrive."""

    def __init__(self, at: int) -> None:
        self.at, self.original = at, loop._record

    def __call__(self, setting, prepared, training, *rest):
        outcome = self.original(setting, prepared, training, *rest)
        if training.step == self.at:
            raise KeyboardInterrupt
        return outcome


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """A tiny run of 24 steps with --save-every 8, interrupted after step 13: checkpoint/ at
    step 8, metrics for steps 0..13. Tests copy it."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "_record", Interrupt(13))
        code = main(["train", "--steps", "24", "--save-every", "8", "--out", str(out), *TRAIN])
    assert code == 130
    assert read_trainer_state(out / "checkpoint")[0]["step"] == 8
    return out


@pytest.fixture
def run_copy(interrupted_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(interrupted_run, copy)
    return copy


# ----------------------------------------------------------------------------------------------
# 1, 2, 10: convert never empties or overwrites what it did not write; a failed convert leaves
# nothing; the GPT-2 export says what it changes
# ----------------------------------------------------------------------------------------------

tf = None


def _transformers():
    global tf
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    return tf


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A GPT-2 with V = 300 saved by save_pretrained, plus the tokenizer files a user keeps in
    such a folder."""
    tf = _transformers()
    config = tf.GPT2Config(vocab_size=300, n_embd=16, n_layer=1, n_head=2, n_positions=8,
                           bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "hf_tiny"
    tf.GPT2LMHeadModel(config).save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 8}\n')
    return folder


@pytest.fixture(scope="module")
def converted(hf_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "ckpt"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out)]) == 0
    return out


def test_convert_from_hf_onto_its_own_folder_is_refused_and_the_folder_kept(hf_folder, capsys):
    before = _snapshot(hf_folder)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(hf_folder)]) == 2
    line = _error_line(capsys, "convert")
    assert f"--out {str(hf_folder)!r} overlaps the folder being converted" in line
    _assert_kept(before)
    assert sorted(p.name for p in hf_folder.iterdir()) == sorted(p.name for p in before)


def test_convert_into_a_hugging_face_folder_is_refused(hf_folder, tmp_path, capsys, converted):
    """A checkpoint is never written over another Hugging Face folder (not the source)."""
    other = tmp_path / "other_hf"
    shutil.copytree(hf_folder, other)
    before = _snapshot(other)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(other)]) == 2
    line = _error_line(capsys, "convert")
    assert "is not a checkpoint" in line and "config.json" in line
    _assert_kept(before)
    _no_debris(other)


def test_convert_to_hf_onto_a_training_checkpoint_keeps_its_training_state(run_copy, capsys):
    checkpoint = run_copy / "checkpoint"
    before = _snapshot(run_copy)
    _transformers()
    assert main(["convert", "--to-hf", "--checkpoint", str(checkpoint),
                 "--out", str(checkpoint)]) == 2
    assert "overlaps the folder being converted" in _error_line(capsys, "convert")
    _assert_kept(before)  # train_state.pt and trainer.json included


def test_convert_to_hf_into_a_training_checkpoint_elsewhere_is_refused(run_copy, tmp_path,
                                                                        capsys):
    """Not the source, but still a training checkpoint: never replaced by an HF folder."""
    _transformers()
    target = tmp_path / "target"
    shutil.copytree(run_copy / "checkpoint", target)
    before = _snapshot(target)
    assert main(["convert", "--to-hf", "--checkpoint", str(run_copy),
                 "--out", str(target)]) == 2
    assert "not a Hugging Face model folder" in _error_line(capsys, "convert")
    _assert_kept(before)
    _no_debris(target)


def test_convert_refuses_to_delete_a_users_file_in_an_earlier_output(hf_folder, converted,
                                                                     tmp_path, capsys):
    # Our earlier checkpoint, with the user's notes beside it.
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted, ckpt)
    (ckpt / "NOTES.md").write_text("what I learned from this model\n")
    before = _snapshot(ckpt)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(ckpt)]) == 2
    line = _error_line(capsys, "convert")
    assert "['NOTES.md']" in line and "refusing" in line
    _assert_kept(before)
    _no_debris(ckpt)
    # Our earlier Hugging Face output, with the tokenizer files the user added.
    back = tmp_path / "back"
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 0
    (back / "tokenizer.json").write_text('{"model": {}}\n')
    capsys.readouterr()
    before = _snapshot(back)
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 2
    assert "['tokenizer.json']" in _error_line(capsys, "convert")
    _assert_kept(before)
    # Without a foreign file the earlier output is replaced, as before.
    (back / "tokenizer.json").unlink()
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out", str(back)]) == 0


def test_a_failed_convert_leaves_nothing_behind(hf_folder, converted, tmp_path, capsys,
                                                monkeypatch):
    import decoder_audit.references.hf as hf

    monkeypatch.setattr(hf, "max_logit_difference", lambda *args: 0.5)  # the check fails
    out = tmp_path / "new" / "deeper" / "ckpt"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out)]) == 1
    line = _error_line(capsys, "convert")
    assert "max |diff| = 5.000e-01 > --tolerance 0.0001" in line and "nothing was written" in line
    assert not (tmp_path / "new").exists()  # not the folder, not its parents, no temporaries
    # An earlier result at --out is left exactly as it was.
    earlier = tmp_path / "earlier"
    shutil.copytree(converted, earlier)
    before = _snapshot(earlier)
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(earlier)]) == 1
    _error_line(capsys, "convert")
    _assert_kept(before)
    _no_debris(earlier)


@pytest.mark.parametrize("tolerance", ["0", "-1e-4", "nan", "inf"])
def test_convert_refuses_a_tolerance_that_is_not_positive_and_finite(hf_folder, tmp_path, capsys,
                                                                     tolerance):
    out = tmp_path / "out"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out),
                 f"--tolerance={tolerance}"]) == 2
    line = _error_line(capsys, "convert")
    assert f"--tolerance={float(tolerance)}" in line and "finite number > 0" in line
    assert not out.exists()


def test_gpt2_export_says_attn_bias_false_becomes_true(tmp_path, capsys):
    _transformers()
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
    _transformers()
    assert main(["convert", "--to-hf", "--checkpoint", str(converted), "--out",
                 str(tmp_path / "hf")]) == 0
    for folder in (converted, tmp_path / "hf"):
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        assert len(set(modes.values())) == 1, modes  # model.safetensors was 0600


# ----------------------------------------------------------------------------------------------
# 3, 5 and the torn metrics line: resume keeps the run's settings; one run per folder
# ----------------------------------------------------------------------------------------------

def test_resume_keeps_save_every_and_tolerates_a_torn_metrics_line(run_copy, capsys,
                                                                   monkeypatch):
    # A kill -9 in the middle of writing a metrics line leaves it torn.
    with (run_copy / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 14, "loss": 1.9')
    # Resume with no --save-every, and interrupt after step 20: the run's own save_every=8 must
    # have written the step-16 checkpoint (forgotten, the last checkpoint would still be 8).
    monkeypatch.setattr(loop, "_record", Interrupt(20))
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 130
    assert "the last checkpoint is at step 16" in capsys.readouterr().err
    meta, _ = read_trainer_state(run_copy / "checkpoint")
    assert meta["step"] == 16
    assert meta["run_options"] == {"save_every": 8, "eval_every": 50, "device": "cpu",
                                   "threads": "auto"}
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 0
    rows = _strict_rows(run_copy / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(25))  # each step once, the torn line gone
    assert not (run_copy / "run.lock").exists()


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(run_copy, capsys):
    before = _snapshot(run_copy)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from decoder_audit.training.lock import RunLock\n"
         f"with RunLock({str(run_copy)!r}):\n"
         "    print('held', flush=True)\n"
         "    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["train", "--out", str(run_copy), *TRAIN],
                     ["train", "--resume", str(run_copy), "--no-progress"]):
            assert main(argv) == 2
            line = _error_line(capsys, "train")
            assert f"run folder {str(run_copy)!r} is in use by another decoder-audit train" in line
            assert f"pid {holder.pid}" in line
    finally:
        holder.communicate("")  # releases the lock and exits
    _assert_kept(before)


def test_a_fresh_run_never_writes_over_an_earlier_runs_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 2.0}\n')
    before = _snapshot(out)
    assert main(["train", "--out", str(out), *TRAIN]) == 2
    assert "already holds ['metrics.jsonl'] of an earlier run" in _error_line(capsys, "train")
    _assert_kept(before)


# ----------------------------------------------------------------------------------------------
# 4: divergence stops the run and keeps the last good checkpoint
# ----------------------------------------------------------------------------------------------

def test_a_diverging_run_stops_with_the_step_and_value_and_keeps_the_last_good_checkpoint(
        tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--lr", "1e10", "--warmup", "0", "--steps", "30", "--save-every", "1",
                 "--out", str(out), "--batch-size", "16", "--no-progress"])
    assert code == 1
    line = _error_line(capsys, "train")
    meta, _ = read_trainer_state(out / "checkpoint")
    good = meta["step"]
    said = re.fullmatch(
        r"decoder-audit train: error: training diverged: the (training loss|gradient norm) is "
        r"(nan|inf|-inf) at step (\d+) \(not applied\), learning rate ([0-9.e+]+); the run "
        r"stopped and the last good checkpoint, step (\d+), is kept in (.+)", line)
    assert said, line
    assert int(said[3]) == good + 1 and int(said[5]) == good and said[6] == str(out / "checkpoint")
    assert float(said[4]) > 1e9
    model = da.load_checkpoint(out / "checkpoint")  # finite, loads
    assert all(torch.isfinite(p).all() for p in model.parameters())
    rows = _strict_rows(out / "metrics.jsonl")  # valid JSON: no bare NaN
    assert [row["step"] for row in rows] == list(range(good + 1))
    assert not (out / "loss_curve.png").exists() and not (out / "run.lock").exists()


def test_sample_refuses_a_checkpoint_holding_nan(tmp_path, capsys):
    folder = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if ".sha256." not in k}
    tensors = load_file(str(weights))
    tensors["ln_final.weight"][0] = float("nan")
    save_file(tensors, str(weights), metadata=metadata)  # digests dropped, as an old file
    before = _snapshot(folder)
    assert main(["sample", "--checkpoint", str(folder), "--prompt", "<bos> A"]) == 2
    line = _error_line(capsys, "sample")
    assert "tensors ['ln_final.weight'] hold NaN or inf" in line
    _assert_kept(before)


# ----------------------------------------------------------------------------------------------
# 6, 7: a --model factory: its trained weights are saved; its sys.exit(0) is not a pass
# ----------------------------------------------------------------------------------------------

FOREIGN = '''
import sys
import torch
from torch import nn


class PrefixMean(nn.Module):
    """Not a Decoder: embedding + positions, a causal prefix mean, a tied readout."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 8)
        self.pos = nn.Parameter(torch.zeros(4, 8))
        self.head = nn.Linear(8, 8, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be (B, T) int64, got {tuple(ids.shape)} {ids.dtype}")
        if not 1 <= ids.shape[1] <= 4 or ids.min() < 0 or ids.max() >= 8:
            raise ValueError("ids outside the contract")
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        x = torch.cumsum(x, 1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        return self.head(x)


def build():
    torch.manual_seed(0)
    model = PrefixMean()
    with torch.no_grad():
        model.emb.weight.mul_(0.02)
    return model


class ExitsInForward(nn.Module):
    def forward(self, ids):
        sys.exit(0)


def exits_in_forward():
    return ExitsInForward()


def exits():
    sys.exit(0)


def needs_arguments(width, depth=2):
    return nn.Linear(width, width)


def raises():
    raise ValueError("width must be positive, got -3")
'''


@pytest.fixture
def foreign(tmp_path) -> Path:
    path = tmp_path / "foreign.py"
    path.write_text(FOREIGN)
    return path


def test_train_model_factory_saves_its_weights_and_resumes(foreign, tmp_path, capsys,
                                                           monkeypatch):
    out = tmp_path / "run"
    argv = ["train", "--model", f"{foreign}:build", "--vocab-size", "8", "--max-seq-len", "4",
            "--steps", "6", "--save-every", "2", "--out", str(out), *TRAIN]
    monkeypatch.setattr(loop, "_record", Interrupt(3))
    assert main(argv) == 130
    monkeypatch.undo()
    checkpoint = out / "checkpoint"
    assert json.loads((checkpoint / "factory.json").read_text()) == {
        "factory": f"{foreign.resolve()}:build", "vocab_size": 8, "max_seq_len": 4}
    assert read_trainer_state(checkpoint)[0]["step"] == 2
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert read_trainer_state(checkpoint)[0]["step"] == 6
    # The saved state dict loads into what the factory builds, and differs from the fresh one.
    sys.path.insert(0, str(foreign.parent))
    try:
        import foreign as module
    finally:
        sys.path.pop(0)
    fresh = module.build()
    trained = load_module_weights(module.build(), checkpoint)
    assert trained.head.weight is trained.emb.weight  # the tie survives the alias
    assert not torch.equal(trained.emb.weight, fresh.emb.weight)
    # It is not a Decoder checkpoint, and verify says so in one line.
    before = _snapshot(out)
    assert main(["verify", "--checkpoint", str(out)]) == 2
    line = _error_line(capsys, "verify")
    assert "holds the weights of a module that is not a Decoder (factory.json:" in line
    _assert_kept(before)


@pytest.mark.parametrize("factory, code, says", [
    ("exits", 2, "exits() in {path!r} failed: it called sys.exit(0) instead of returning a "
                 "module"),
    ("exits_in_forward", 1, "user code called sys.exit(0) before the command finished; nothing "
                            "was checked"),
    ("needs_arguments", 2, "needs_arguments() in {path!r} needs arguments ['width'] (signature "
                           "(width, depth=2))"),
    ("raises", 2, "raises() in {path!r} failed: ValueError: width must be positive, got -3"),
])
def test_model_factories_that_exit_raise_or_need_arguments(foreign, capsys, factory, code, says):
    assert main(["verify", "--model", f"{foreign}:{factory}", "--vocab-size", "8",
                 "--max-seq-len", "4", "--no-progress"]) == code
    assert says.format(path=str(foreign)) in _error_line(capsys, "verify")


@pytest.mark.parametrize("source, says", [
    ("def build(:\n    pass\n", "failed to import: SyntaxError at line 1"),
    ("import not_a_module_xyz\n\ndef build():\n    pass\n",
     "failed to import: ModuleNotFoundError: No module named 'not_a_module_xyz'"),
])
def test_model_files_that_do_not_import(tmp_path, capsys, source, says):
    path = tmp_path / "broken.py"
    path.write_text(source)
    assert main(["verify", "--model", f"{path}:build", "--vocab-size", "8"]) == 2
    assert f"--model file {str(path)!r} {says}" in _error_line(capsys, "verify")


# ----------------------------------------------------------------------------------------------
# 8, 9: no tokenizer for the vocabulary; an edited config.json
# ----------------------------------------------------------------------------------------------

def test_sample_refuses_a_vocabulary_without_a_tokenizer(converted, capsys):
    before = _snapshot(converted)
    assert main(["sample", "--checkpoint", str(converted), "--prompt", "hello"]) == 2
    line = _error_line(capsys, "sample")
    assert "no tokenizer for vocab_size=300" in line and "pass --tokenizer" in line
    _assert_kept(before)


def test_an_edited_config_json_is_caught(tmp_path, capsys):
    folder = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    assert config["mlp"] == "relu"
    config["mlp"] = "gelu"  # the same shapes: only the recorded digest can tell
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    before = _snapshot(folder)
    assert main(["verify", "--checkpoint", str(folder)]) == 2
    line = _error_line(capsys, "verify")
    assert "config.json' was changed after the checkpoint was saved" in line
    _assert_kept(before)


# ----------------------------------------------------------------------------------------------
# Raw tracebacks that became one line
# ----------------------------------------------------------------------------------------------

def test_a_config_that_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    raw = '{"vocab_size": 8, "notes": "caf\u00e9"}'.encode("latin-1")  # e-acute is 0xe9
    path.write_bytes(raw)
    offset = raw.index(b"\xe9")
    for command in ("verify", "ledger", "train"):
        extra = ["--out", str(tmp_path / "run")] if command == "train" else []
        assert main([command, "--config", str(path), *extra]) == 2
        line = _error_line(capsys, command)
        assert f"config file {str(path)!r} is not UTF-8 text (byte 0xe9 at offset {offset})" in line


HUGE = {"vocab_size": 10**9, "d_model": 1024, "n_layers": 1, "n_heads": 1, "d_ff": 4,
        "max_seq_len": 4}


@pytest.mark.parametrize("command", ["verify", "train"])
def test_weights_that_cannot_fit_are_refused_before_allocating(tmp_path, capsys, command):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(HUGE))
    out = tmp_path / "run"
    extra = ["--out", str(out), "--no-progress"] if command == "train" else []
    assert main([command, "--config", str(path), *extra]) == 2
    line = _error_line(capsys, command)
    assert "the model does not fit in memory" in line
    copies = " x 4" if command == "train" else ""
    assert f"(1,024,004,212,736 parameters x 4 bytes{copies})" in line
    assert "vocab_size=1000000000" in line and "nothing was allocated" in line
    assert not out.exists()


def test_train_state_replaced_by_a_custom_pickle(run_copy, capsys):
    state = run_copy / "checkpoint" / "train_state.pt"
    torch.save({"step": 8, "payload": Interrupt(3)}, state)
    before = _snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    line = _error_line(capsys, "train")
    assert "train_state.pt' (" in line and "is not the file saved with this checkpoint" in line
    assert "weights_only=False" not in line
    # A checkpoint written before digests were recorded: refused unread by weights_only=True.
    _drop_file_digests(run_copy / "checkpoint")
    before = _snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    line = _error_line(capsys, "train")
    assert ("train_state.pt' holds a pickled object (test_robustness_cli.Interrupt) that is not "
            "a training state") in line
    assert "weights_only=False" not in line
    _assert_kept(before)


def test_train_state_truncated(run_copy, capsys):
    state = run_copy / "checkpoint" / "train_state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    assert "(1,000 bytes) is not the file saved" in _error_line(capsys, "train")
    _drop_file_digests(run_copy / "checkpoint")
    before = _snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    assert "(1,000 bytes) is truncated or corrupt" in _error_line(capsys, "train")
    _assert_kept(before)


def _drop_file_digests(folder: Path) -> None:
    """Rewrite model.safetensors without the extra files' digests (as an older save)."""
    weights = folder / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if "file_sha256" not in k}
    save_file(load_file(str(weights)), str(weights), metadata=metadata)


def test_text_on_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "run"
    assert main(["train", "--text", str(empty), "--config", str(_byte_config(tmp_path)),
                 "--out", str(out), "--no-progress"]) == 2
    assert f"--text file {str(empty)!r} is empty (0 bytes)" in _error_line(capsys, "train")
    assert not out.exists()


def _byte_config(tmp_path: Path) -> Path:
    path = tmp_path / "bytes.json"
    da.DecoderConfig(vocab_size=256, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                     max_seq_len=8).save(path)
    return path


@pytest.mark.parametrize("argv, says", [
    (["--device", "tpu"], "--device 'tpu' is not a device decoder-audit trains on"),
    (["--threads", "-1"], "threads=-1 must be an integer >= 1"),
    (["--threads", "0"], "threads=0 must be an integer >= 1"),
    (["--save-every", "-2"], "save_every=-2 must be an integer >= 0"),
])
def test_train_options_that_cannot_work_are_refused_before_the_gate(tmp_path, capsys, argv, says):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *argv, *TRAIN]) == 2
    assert says in _error_line(capsys, "train")
    assert not out.exists()


def _takes_device(command: str) -> bool:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return "--device" in subparsers.choices[command].format_usage()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["train", "verify"])
def test_device_cuda_without_cuda_is_said_before_the_gate(tmp_path, capsys, command):
    if not _takes_device(command):
        pytest.skip(f"{command} has no --device option in this tree")
    out = tmp_path / "run"
    extra = ["--out", str(out), "--no-progress"] if command == "train" else []
    assert main([command, "--device", "cuda", *extra]) == 2
    captured = capsys.readouterr()
    assert "CUDA is not available on this machine (" in _one_line(captured.err, command)
    assert captured.out == ""  # said before the gate (or anything else) ran
    assert not out.exists()


def test_verify_report_pointing_at_an_existing_file(tmp_path, capsys):
    path = tmp_path / "report.md"
    path.write_text("my own report\n")
    before = _snapshot(path)
    assert main(["verify", "--report", str(path)]) == 2
    captured = capsys.readouterr()
    assert f"--report {str(path)!r} is a file" in _one_line(captured.err, "verify")
    assert captured.out == ""  # refused before the gate ran
    _assert_kept(before)


# ----------------------------------------------------------------------------------------------
# Also: every command that takes --checkpoint takes a run folder; a stale lock is taken over
# ----------------------------------------------------------------------------------------------

def test_verify_ledger_account_and_train_take_a_run_folder(run_copy, tmp_path, capsys):
    before = _snapshot(run_copy)
    for command in ("verify", "ledger", "account"):
        assert main([command, "--checkpoint", str(run_copy), "--json"]) == 0, command
    capsys.readouterr()
    # train --checkpoint RUN_FOLDER; its --out holds the stale lock of a run that was killed.
    out = tmp_path / "again"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (out / "run.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": "here",
                                              "started": "2020-01-01T00:00:00"}))
    assert main(["train", "--checkpoint", str(run_copy), "--out", str(out), "--steps", "2",
                 *TRAIN]) == 0
    printed = capsys.readouterr().out
    assert f"took over the stale lock of pid {int(dead.stdout)}" in printed
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "loss_curve.png",
                                                     "metrics.jsonl"]
    assert math.isfinite(_strict_rows(out / "metrics.jsonl")[-1]["loss"])
    _assert_kept(before)
