"""Writing an output folder atomically (storage/folder.py): a failed write leaves nothing, a
folder is replaced only by its own kind, files get the default mode."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path

import pytest
import torch
from helpers import snapshot, tiny_decoder

import decoder_audit as da
import decoder_audit.storage.folder as atomic
from decoder_audit.storage.folder import write_folder_atomically


def test_a_failing_check_leaves_nothing_not_even_new_parent_folders(tmp_path):
    def refuse(folder):
        assert (folder / "model.safetensors").is_file()  # runs on the complete new folder
        raise ValueError("the written result does not match")

    with pytest.raises(ValueError, match="does not match"):
        da.save_checkpoint(tiny_decoder(), tmp_path / "a" / "b" / "ckpt", check=refuse)
    assert list(tmp_path.iterdir()) == []
    old = da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError):
        da.save_checkpoint(tiny_decoder(1), old, check=refuse)
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_written_files_get_the_default_mode(tmp_path):
    folder = da.save_checkpoint(tiny_decoder(), tmp_path / "ckpt", extra_files={"x.txt": b"1"})
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


# ---- issue 26: nothing run, nothing lost -------------------------------------------------------

def _same_model(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_symlinked_destination_is_refused_and_never_moved(tmp_path):
    target = da.save_checkpoint(tiny_decoder(0), tmp_path / "real")
    before = snapshot(target)
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(da.CheckpointError) as refused:
        da.save_checkpoint(tiny_decoder(1), link)
    assert str(link) in str(refused.value) and str(target) in str(refused.value)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .link.old-*


def test_user_folders_named_like_our_debris_are_left_alone(tmp_path):
    mine = {}
    for name in (".ckpt.tmp-notes", ".ckpt.old-2024", ".ckpt.tmp-1-abcd"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text(name)
        mine[name] = snapshot(tmp_path / name)
    da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")  # a fresh save
    da.save_checkpoint(tiny_decoder(1), tmp_path / "ckpt")  # a save that replaces
    for name, files in mine.items():
        assert snapshot(tmp_path / name) == files, name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*mine, "ckpt"])


def test_a_second_writer_of_one_folder_is_refused_and_the_first_finishes(tmp_path):
    out = tmp_path / "out"
    writing, release, result = threading.Event(), threading.Event(), {}

    def slow_write(folder):
        (folder / "a").write_text("first")
        writing.set()
        assert release.wait(30)

    def first():
        try:
            result["path"] = write_folder_atomically(out, slow_write, same_kind=lambda p: True,
                                                     what="thing")
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            result["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert writing.wait(30)
        live = snapshot(tmp_path)  # the first writer's temporary folder
        with pytest.raises(da.CheckpointError) as refused:
            write_folder_atomically(out, lambda folder: (folder / "a").write_text("second"),
                                    same_kind=lambda p: True, what="thing")
        assert str(out) in str(refused.value)
        assert snapshot(tmp_path) == live  # nothing of the first writer's was touched
    finally:
        release.set()
        thread.join(30)
    assert "error" not in result, result.get("error")
    assert (out / "a").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ctrl_c_between_the_two_renames_waits_for_the_second(tmp_path, monkeypatch):
    path = da.save_checkpoint(tiny_decoder(0), tmp_path / "c")
    new = tiny_decoder(1)
    real_rename = os.rename

    def rename_then_ctrl_c(src, dst):
        real_rename(src, dst)
        if Path(src) == path:  # the old folder just moved aside: the key press arrives now
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(atomic.os, "rename", rename_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        da.save_checkpoint(new, path)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folder is in place: no backup is needed
        assert _same_model(da.load_checkpoint(path), new)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_users_file_or_link_with_the_lock_files_name_is_never_touched(tmp_path):
    notes = tmp_path / ".ckpt.lock"
    notes.write_text("my notes\n")
    with pytest.raises(da.CheckpointError) as refused:
        da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")
    assert str(notes) in str(refused.value)
    assert notes.read_text() == "my notes\n" and not (tmp_path / "ckpt").exists()
    notes.unlink()
    target = tmp_path / "target.txt"
    target.write_text("mine\n")
    notes.symlink_to(target)
    with pytest.raises(da.CheckpointError) as refused:
        da.save_checkpoint(tiny_decoder(0), tmp_path / "ckpt")
    assert str(notes) in str(refused.value) and str(target) in str(refused.value)
    assert target.read_text() == "mine\n" and notes.is_symlink()
