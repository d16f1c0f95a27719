"""Sharded checkpoints (storage/sharded.py), on one process: `train(shard=True)` runs FSDP2 over
a one-rank group, so its checkpoints take the sharded path (torch.distributed.checkpoint) with
no torchrun. The expectation is always the uninterrupted run, or the whole weights FSDP2's own
full-state gather returns (`TrainResult.model`), never the sharded reader itself. The world-size
matrix (2 -> 2, 2 -> 1, 1 -> 2, 2 -> 3, a rank killed mid-save) is
tests/storage/test_sharded_matrix.py, run by .ci/sharded-checkpoints."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from helpers import snapshot
from safetensors.torch import load_file

import decoder_audit.storage.sharded as sharded
from decoder_audit.errors import CheckpointError
from decoder_audit.storage.checkpoint import WEIGHTS_FILE, load_checkpoint
from decoder_audit.training import train

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed missing")

RUN = {"steps": 8, "batch_size": 16, "warmup": 2, "seed": 3}
STOP = 4


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, tensor in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], tensor), name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One sharded process, uninterrupted, and the same run's step-4 checkpoint kept."""
    root = tmp_path_factory.mktemp("sharded")
    full = train("tiny-368", out=root / "full", shard=True, progress=False, verbose=False, **RUN)

    def keep(step, row):
        if step == STOP:
            shutil.copytree(root / "half" / "checkpoint", root / "at_stop" / "checkpoint")
            shutil.copy2(root / "half" / "metrics.jsonl", root / "at_stop" / "metrics.jsonl")

    train("tiny-368", out=root / "half", shard=True, save_every=STOP, progress=False,
          verbose=False, callback=keep, **RUN)
    return root, full


def test_sharded_checkpoint_resumes_bitwise_sharded_and_plain(runs, tmp_path):
    """The layout is DCP's (no model.safetensors), and a resume from step 4, sharded or not,
    gives the uninterrupted run's losses and weights bit for bit."""
    root, full = runs
    at_stop = root / "at_stop" / "checkpoint"
    assert (at_stop / "dcp" / ".metadata").is_file() and not (at_stop / WEIGHTS_FILE).exists()
    assert json.loads((at_stop / "trainer.json").read_text())["sharded"] is True
    for shard in (True, False):
        run = tmp_path / f"shard_{shard}"
        shutil.copytree(root / "at_stop", run)
        resumed = train(resume=run, shard=shard, progress=False, verbose=False)
        assert _losses(run) == _losses(root / "full")
        _assert_same_weights(resumed.model, full.model)
    # resumed unsharded, the run's next save is unsharded: the shards it replaces are gone
    assert (run / "checkpoint" / WEIGHTS_FILE).is_file()
    assert not (run / "checkpoint" / "dcp").exists()


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint(runs, tmp_path, monkeypatch):
    """The step-8 save raises inside DCP's write, after the lock and the temporary folder: the
    step-4 checkpoint stays byte for byte, nothing is left beside it, and it resumes."""
    from torch.distributed.checkpoint import FileSystemWriter

    root, full = runs
    run = tmp_path / "run"
    shutil.copytree(root / "at_stop", run)
    before = snapshot(run / "checkpoint")

    def dies(self, plan, planner):
        raise OSError("disk full (planted)")

    with monkeypatch.context() as patch:
        patch.setattr(FileSystemWriter, "write_data", dies)
        with pytest.raises(Exception, match="disk full"):
            train(resume=run, progress=False, verbose=False, shard=True)
    assert snapshot(run / "checkpoint") == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []
    assert json.loads((run / "checkpoint" / "trainer.json").read_text())["step"] == STOP
    resumed = train(resume=run, shard=True, progress=False, verbose=False)
    _assert_same_weights(resumed.model, full.model)


def test_export_streams_one_safetensors_file_equal_to_the_gathered_weights(runs, tmp_path):
    """The final sharded checkpoint exported tensor by tensor is a checkpoint `load_checkpoint`
    reads, and its tensors (read by safetensors itself) are FSDP2's gathered weights."""
    root, full = runs
    out = sharded.export_safetensors(root / "full" / "checkpoint", tmp_path / "export")
    stored = load_file(str(out / WEIGHTS_FILE))
    expected = {n: t for n, t in full.model.state_dict().items() if n != "lm_head.weight"}
    assert stored.keys() == expected.keys()  # tied: the readout stored once
    for name, tensor in expected.items():
        assert torch.equal(stored[name], tensor), name
    _assert_same_weights(load_checkpoint(out), full.model)
    _assert_same_weights(load_checkpoint(root / "full" / "checkpoint"), full.model)


def test_a_changed_shard_is_refused_naming_it(runs, tmp_path):
    root, _ = runs
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    shard = ckpt / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-9] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"dcp/__0_0\.distcp"):
        load_checkpoint(ckpt)


def test_an_index_naming_another_global_is_refused_unread(runs, tmp_path):
    """DCP's .metadata is a pickle: one whose globals are not the index's classes is refused
    before anything in it runs (the planted call would create a file)."""
    root, _ = runs
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    planted = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (planted,))

    (ckpt / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match=r"pathlib\.Path\.touch|Path\.touch|touch"):
        sharded.stored_shapes(ckpt)
    assert not planted.exists()


def test_convert_to_safetensors_exports_a_sharded_checkpoint(runs, tmp_path):
    """The command line's export: one model.safetensors that loads as the gathered weights; an
    unsharded checkpoint is refused (exit 2), nothing written."""
    from decoder_audit.cli import main

    root, full = runs
    out = tmp_path / "export"
    assert main(["convert", "--to-safetensors", "--checkpoint", str(root / "full"),
                 "--out", str(out)]) == 0
    _assert_same_weights(load_checkpoint(out), full.model)
    assert main(["convert", "--to-safetensors", "--checkpoint", str(out),
                 "--out", str(tmp_path / "again")]) == 2
    assert not (tmp_path / "again").exists()


# ---- the manifest covers every file the checkpoint reads (issue 44) ---------------------------

def _rehash(ckpt: Path, name: str) -> None:
    """Record `name`'s present SHA-256 in sharded.json, as an edit of the manifest would."""
    manifest = json.loads((ckpt / "sharded.json").read_text())
    manifest["files"][name] = hashlib.sha256((ckpt / name).read_bytes()).hexdigest()
    (ckpt / "sharded.json").write_text(json.dumps(manifest))


def _unlist(ckpt: Path, name: str) -> None:
    manifest = json.loads((ckpt / "sharded.json").read_text())
    del manifest["files"][name]
    (ckpt / "sharded.json").write_text(json.dumps(manifest))


def test_a_shard_the_manifest_no_longer_lists_is_refused_naming_it(runs, tmp_path):
    """The step-4 run's shard copied over the step-8 checkpoint's, its entry removed from
    sharded.json: the same shapes, so DCP would read it as this checkpoint's weights. Refused,
    naming it; so is any file the manifest does not list, and a listed one that is gone."""
    root, _ = runs
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    shard = "dcp/__0_0.distcp"
    shutil.copy2(root / "at_stop" / "checkpoint" / shard, ckpt / shard)
    _unlist(ckpt, shard)
    with pytest.raises(CheckpointError, match=r"\['dcp/__0_0\.distcp'\].*does not list"):
        load_checkpoint(ckpt)
    (ckpt / shard).unlink()  # gone, and unlisted: DCP's index still reads it
    with pytest.raises(CheckpointError, match=r"index reads \['dcp/__0_0\.distcp'\]"):
        load_checkpoint(ckpt)

    shutil.rmtree(ckpt)
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    (ckpt / "notes.txt").write_text("not saved with it\n")
    with pytest.raises(CheckpointError, match=r"\['notes\.txt'\].*does not list"):
        load_checkpoint(ckpt)
    (ckpt / "notes.txt").unlink()
    (ckpt / "trainer.json").unlink()
    with pytest.raises(CheckpointError, match=r"\['trainer\.json'\] missing"):
        load_checkpoint(ckpt)


def test_an_index_that_reads_outside_the_shards_folder_is_refused_unread(runs, tmp_path):
    """DCP's index names the file of each chunk; one rewritten to read another folder's shard
    (with the manifest rehashed to match) is refused before DCP opens it."""
    root, _ = runs
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    index = sharded.index_reader(ckpt / "dcp").read_metadata()
    for info in index.storage_data.values():
        info.relative_path = "../../elsewhere/__0_0.distcp"
    (ckpt / "dcp" / ".metadata").write_bytes(pickle.dumps(index))
    _rehash(ckpt, "dcp/.metadata")
    with pytest.raises(CheckpointError, match=r"elsewhere/__0_0\.distcp.*not files of dcp/"):
        load_checkpoint(ckpt)


def test_a_truncated_or_corrupt_shard_with_its_digest_rehashed_is_one_line(runs, tmp_path,
                                                                            capsys):
    """Its SHA-256 recorded again, so only its length tells: refused naming the file, its size
    and the end DCP's index gives its chunks; bytes changed in place (the same length) fail
    inside DCP's reader and are one CheckpointError naming the file too. Exit status 2."""
    from cli_support import error_line

    from decoder_audit.cli import main

    root, _ = runs
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(root / "full" / "checkpoint", ckpt)
    shard = ckpt / "dcp" / "__0_0.distcp"
    whole = shard.read_bytes()
    ends = max(info.offset + info.length for info in
               sharded.index_reader(ckpt / "dcp").read_metadata().storage_data.values())
    assert ends == len(whole)  # the index places the last chunk at the file's end
    shard.write_bytes(whole[:3000])
    _rehash(ckpt, "dcp/__0_0.distcp")
    assert main(["sample", "--checkpoint", str(ckpt), "--prompt", "<bos> A"]) == 2
    line = error_line(capsys, "sample")
    assert "dcp/__0_0.distcp" in line and "3,000 bytes" in line and f"{ends:,}" in line, line

    shard.write_bytes(bytes(1700) + whole[1700:])  # the first chunks zeroed
    _rehash(ckpt, "dcp/__0_0.distcp")
    assert main(["sample", "--checkpoint", str(ckpt), "--prompt", "<bos> A"]) == 2
    line = error_line(capsys, "sample")
    assert "dcp/__0_0.distcp" in line and "Traceback" not in line, line


def test_a_full_disk_during_a_sharded_save_is_one_line_naming_the_path_and_the_space(
        runs, tmp_path, monkeypatch):
    """DCP's writer raises ENOSPC (as a write to a full filesystem does): one line naming the
    checkpoint, the bytes its tensors need (fp32 weights and AdamW's two moments, 12 bytes a
    parameter, plus AdamW's 4-byte step per tensor) and those free; the step-4 checkpoint is
    kept byte for byte and nothing is left beside it."""
    import errno
    from collections import namedtuple

    import torch.distributed.checkpoint.filesystem as dcp_files

    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "at_stop", run)
    before = snapshot(run / "checkpoint")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(dcp_files, "_write_item", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 12345))
    with pytest.raises(CheckpointError) as refused:
        train(resume=run, progress=False, verbose=False, shard=True)
    said = str(refused.value)
    params = list(load_checkpoint(run / "checkpoint").parameters())  # unique: tied once
    need = 12 * sum(p.numel() for p in params) + 4 * len(params)
    assert "\n" not in said and len(said) < 400, said
    assert str(run / "checkpoint") in said and "12,345 bytes" in said and f"{need:,}" in said
    assert snapshot(run / "checkpoint") == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []
