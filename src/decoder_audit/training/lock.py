"""One run per run folder: `OUT/run.lock`, held for the whole run by the process that writes.

Two runs writing one folder corrupt each other (one's checkpoint swap pulls the folder from under
the other; the metrics interleave). So before anything is read or written, rank 0 takes an
exclusive lock:

    OUT/run.lock    {"pid": 4242, "host": "box", "started": "2025-01-01T12:00:00", "argv": [...]}

The lock is a `flock` on that file (POSIX), which the kernel drops when the process dies, however
it dies: a lock file left by a killed run is stale and simply taken over (and said so). A second
live run is refused with one line naming the holder's pid, host and start time. Where `flock` does
not exist the file is created exclusively (O_EXCL) instead, and a holder whose pid is no longer
running on this host is treated as stale. A `run.lock` that is a symlink is refused, naming it
and its target, and the file is opened with O_NOFOLLOW: the lock never writes (nor its release
deletes) what a link points at.

A lock that made the run folder removes it again on release if the run left it empty (a refused
run leaves nothing behind).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import RunFolderError
from ..storage.folder import make_folders

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_FILE = "run.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, where links need privileges


class RunLock:
    """`with RunLock(folder, say=print):` holds `folder/run.lock` for the block."""

    def __init__(self, folder: str | os.PathLike, say=lambda *a, **k: None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.say = say
        self._fd: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        if self.folder.exists() and not self.folder.is_dir():
            raise RunFolderError(f"run folder {str(self.folder)!r} is a file, not a folder")
        self._refuse_link()
        self._made = make_folders(self.folder)
        try:
            if fcntl is not None:
                self._acquire_flock()
            else:
                self._acquire_exclusive()
        except BaseException:
            self._remove_made()
            raise

    def _refuse_link(self) -> None:
        """A run.lock that is a symlink would have the lock write (and release delete) whatever
        it points at: refused, naming both. O_NOFOLLOW below closes the race with a link made
        after this check."""
        if self.path.is_symlink():
            raise RunFolderError(
                f"{str(self.path)!r} is a symbolic link to {os.readlink(self.path)!r}, not a run "
                "lock; refusing to write through it: remove the link or choose another --out")

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, flags | _NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink made since _refuse_link looked
                self._refuse_link()
            raise

    def _acquire_flock(self) -> None:
        for _ in range(10):  # retried only when a releasing holder unlinked the file under us
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read(self.path)
                os.close(fd)
                raise RunFolderError(_busy(self.folder, holder)) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = _read_fd(fd)
            if previous and previous.get("pid") not in (None, os.getpid()):
                self.say(f"note: took over the stale lock of pid {previous.get('pid')} "
                         f"({_since(previous)}), which is no longer running")
            _write_fd(fd, _owner())
            self._fd = fd
            return
        raise RunFolderError(f"could not lock {str(self.path)!r}: it keeps being replaced")

    def _acquire_exclusive(self) -> None:
        for _ in range(2):
            try:
                fd = self._open(os.O_RDWR | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                holder = _read(self.path)
                if holder and holder.get("host") == socket.gethostname() and \
                        not _alive(int(holder.get("pid", -1))):
                    self.say(f"note: took over the stale lock of pid {holder.get('pid')} "
                             f"({_since(holder)}), which is no longer running")
                    self.path.unlink(missing_ok=True)
                    continue
                raise RunFolderError(_busy(self.folder, holder)) from None
            _write_fd(fd, _owner())
            self._fd = fd
            return
        raise RunFolderError(_busy(self.folder, _read(self.path)))

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # before unlocking: no one locks a dying file
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None
            self._remove_made()

    def _remove_made(self) -> None:
        for folder in reversed(self._made):
            try:
                folder.rmdir()  # only if the run left it empty
            except OSError:
                break
        self._made = []


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv}


def _busy(folder: Path, holder: dict[str, Any] | None) -> str:
    who = (f"pid {holder.get('pid')} on {holder.get('host')}, {_since(holder)}" if holder
           else "a process that has not written its pid yet")
    return (f"run folder {str(folder)!r} is in use by another decoder-audit train ({who}); wait "
            f"for it to finish or choose another --out (the lock is {str(folder / LOCK_FILE)!r})")


def _since(holder: dict[str, Any]) -> str:
    return f"started {holder.get('started', 'at an unknown time')}"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_fd(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _write_fd(fd: int, owner: dict[str, Any]) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(owner) + "\n").encode())
    os.fsync(fd)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
