"""One run per run folder (training/lock.py)."""

from __future__ import annotations

import json
import os

import pytest

from decoder_audit.errors import RunFolderError
from decoder_audit.training.lock import RunLock


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


def test_a_symlinked_run_lock_is_refused_and_its_target_kept(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("mine\n")
    (folder / "run.lock").symlink_to(target)
    with pytest.raises(RunFolderError) as refused:
        RunLock(folder).acquire()
    assert str(folder / "run.lock") in str(refused.value) and str(target) in str(refused.value)
    assert target.read_text() == "mine\n"
    assert (folder / "run.lock").is_symlink()
