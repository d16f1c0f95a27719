"""Writing an output folder atomically (storage/folder.py): a failed write leaves nothing, a
folder is replaced only by its own kind, files get the default mode."""

from __future__ import annotations

import os

import pytest
from helpers import snapshot, tiny_decoder

import decoder_audit as da
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
