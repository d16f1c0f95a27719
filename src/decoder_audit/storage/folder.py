"""Writing a folder atomically: every output folder of ours (a checkpoint, a Hugging Face folder,
a prepared dataset) is filled beside its destination and swapped in, so a reader sees the old
folder or the new one, never half of one.

How a save of `NAME/` is made atomic:

    0. Lock `.NAME.lock` beside it (flock, non-blocking; removed when the save ends; where
       flock does not exist, a file created exclusively): a second writer of the same folder
       is refused, naming it, instead of deleting the first one's temporary folder. A
       destination that is a symlink is refused: replacing it would move the link and hide it.
    1. Remove the incomplete temporaries an earlier crashed save left (ours only, see below).
    2. Write every file into `.NAME.tmp-<pid>-<random>/incomplete/`, fsync each file and the
       folder, then rename `incomplete/` to `complete/`. `NAME/` is untouched so far.
    3. Move `NAME/` (if there is one) into `.NAME.old-<pid>-<random>/previous/`, rename
       `complete/` to `NAME/`, fsync the parent after each rename. SIGINT (Ctrl-C) waits from
       the rename to `complete/` until `NAME/` is in place, and is raised then. Then delete the
       `.old` and `.tmp` folders and any debris of ours.

Ours only. Each `.NAME.tmp-*` and `.NAME.old-*` folder we make holds a marker file
(`decoder-audit-save.json`, naming this tool and NAME) written before anything else, and the
folder itself stays inside it (`incomplete/`, `complete/`, `previous/`), so `NAME/` never holds
the marker. A folder with such a name but no marker is a user's and is never deleted or loaded.

What a crash (a kill, a power cut; not Ctrl-C, which waits) leaves behind: during 1-2, the old
`NAME/` plus a marked `incomplete/` (removed by the next save); after `complete/` exists, the old
`NAME/` plus that complete copy; between the two renames of 3, no `NAME/` but two complete
copies, the new one in `.NAME.tmp-*/complete/` and the old one in `.NAME.old-*/previous/`
(`stranded_copies` lists them newest first; with no `NAME/`, `load_checkpoint` loads the newest
with a warning); after them, the new `NAME/` plus debris. A save deletes a complete copy only
once its own folder is in place, never before.

Nothing a user had on disk is lost: a folder is replaced only when it is an earlier output of
the same kind and every entry in it will be written again; anything else there makes the save
refuse, naming the entries, before anything is moved.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from ..errors import CheckpointError

try:
    import fcntl
except ImportError:  # Windows: the lock file is created exclusively instead
    fcntl = None

TOOL = "decoder-audit"
# Written first into every temporary and backup folder a save makes: what marks it as ours.
MARKER = "decoder-audit-save.json"
INCOMPLETE, COMPLETE, PREVIOUS = "incomplete", "complete", "previous"


def write_folder_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                            same_kind: Callable[[Path], bool], what: str,
                            names: Collection[str] | None = None,
                            superseded: Collection[str] = ()) -> Path:
    """Call `write(tmp_folder)` to fill a fresh folder beside `path`, fsync it, and swap it into
    `path` (see the module docstring for the steps and what a crash leaves behind).

    Nothing a user had is lost: an existing non-empty `path` is replaced only if
    `same_kind(path)` (it is an earlier output of this kind, `what`) and every entry in it is
    written again. `names` (the entries `write` will make, when known) lets that be refused
    before writing; it is checked again on what `write` made. `superseded` names entries of
    ours an earlier output of another layout holds that this one may drop (a sharded
    checkpoint's shards replaced by an unsharded one's weights). A `path` that is a symlink, or
    that another save is writing, is refused. If `write` (or anything before the swap) raises,
    the temporary folder and any parent folders made for it are removed."""
    path = Path(path).absolute()
    refuse_symlink(path, what=what)
    made = make_folders(path.parent)
    try:
        with _save_lock(path):
            _refuse_to_replace(path, same_kind, what,
                               None if names is None else (*names, *superseded))
            _remove_debris(path, keep_complete=True)
            wrapper = _marked_folder(path, "tmp")
            try:
                (wrapper / INCOMPLETE).mkdir()
                write(wrapper / INCOMPLETE)
                refuse_to_lose(path, [*(c.name for c in (wrapper / INCOMPLETE).iterdir()),
                                      *superseded], what=what)
                _sync_files(wrapper / INCOMPLETE)
            except Exception:
                _delete_ours(wrapper)
                raise
            _swap(wrapper, path)
    except BaseException:
        for folder in reversed(made):
            _rmdir_if_empty(folder)
        raise
    return path


def _refuse_to_replace(path: Path, same_kind: Callable[[Path], bool], what: str,
                       names: Collection[str] | None) -> None:
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{str(path)!r} exists and is not a folder; refusing to replace it")
    if path.is_dir() and any(path.iterdir()) and not same_kind(path):
        raise CheckpointError(
            f"{str(path)!r} is a non-empty folder ({_listing(path)}) that is not a {what}; "
            "refusing to replace what does not look like one of our outputs (nothing was "
            "written): choose another folder")
    if names is not None:
        refuse_to_lose(path, names, what=what)


def refuse_symlink(path: str | os.PathLike, *, what: str,
                   error: type[Exception] = CheckpointError) -> None:
    """`error` naming `path` and its target when `path` is a symbolic link: a save replaces its
    folder by a real one, which would move the link aside and hide it, and a file written
    through a link overwrites whatever it points at."""
    path = Path(path)
    if path.is_symlink():
        raise error(
            f"{str(path)!r} is a symbolic link to {os.readlink(path)!r}; a {what} is never "
            "written over or through a link (nothing was written): name the target itself or "
            "choose another folder")


def _swap(wrapper: Path, path: Path) -> None:
    """The end of step 2 and step 3: the new folder marked complete, the old one aside, the new
    one in, then the debris deleted (module docstring). Ctrl-C waits from the first rename to
    the last: between them it would leave no `path`, or a complete copy beside an older one."""
    with _sigint_deferred():
        os.rename(wrapper / INCOMPLETE, wrapper / COMPLETE)  # complete: a copy worth keeping
        _fsync(wrapper)
        old = _marked_folder(path, "old") if path.exists() else None
        if old is not None:
            os.rename(path, old / PREVIOUS)
            _fsync(path.parent)
            _fsync(old)
        os.rename(wrapper / COMPLETE, path)
        _fsync(path.parent)
    _delete_ours(wrapper)
    if old is not None:
        _delete_ours(old)
    _remove_debris(path, keep_complete=False)  # copies a crash stranded are superseded


def stranded_copies(path: str | os.PathLike) -> list[Path]:
    """The complete copies of `path` that saves stopped between (or just before) their renames
    left beside it, ours only, newest first: a temporary's `complete/` folder (written after the
    folder it was to replace), then a backup's `previous/` folder."""
    path = Path(path).absolute()

    def newest_first(kind: str, inner: str) -> list[Path]:
        found = [folder for folder in _our_folders(path, kind) if (folder / inner).is_dir()]
        return [folder / inner for folder in
                sorted(found, key=lambda folder: folder.stat().st_mtime, reverse=True)]

    return newest_first("tmp", COMPLETE) + newest_first("old", PREVIOUS)


def stranded_backups(path: str | os.PathLike) -> list[Path]:
    """The previous folders (`.NAME.old-*/previous/`) that saves of `path` moved aside and did
    not get to delete, ours only, newest first."""
    return [copy for copy in stranded_copies(path) if copy.name == PREVIOUS]


def refuse_to_lose(path: str | os.PathLike, names: Collection[str], *, what: str) -> None:
    """CheckpointError if the folder `path` holds an entry outside `names` (the entries a write
    of this `what` makes): replacing the folder would delete it."""
    path = Path(path)
    if not path.is_dir():
        return
    lost = sorted(child.name for child in path.iterdir() if child.name not in set(names))
    if lost:
        raise CheckpointError(
            f"{str(path)!r} holds {lost}, which a {what} does not write; refusing to replace the "
            "folder and delete them (nothing was written): move them out or choose another "
            "folder")


def _listing(path: Path, most: int = 5) -> str:
    entries = sorted(child.name for child in path.iterdir())
    shown = ", ".join(entries[:most]) + (f", ... ({len(entries)} entries)" if len(entries) > most
                                         else "")
    return shown


def make_folders(folder: Path) -> list[Path]:
    """mkdir -p `folder`; the folders it created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
    return list(reversed(missing))


def _rmdir_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (someone else wrote there) or already gone


def _sync_files(folder: Path) -> None:
    """Give every file the mode any new file gets and fsync it, then the folder itself."""
    mode = _default_file_mode()
    for child in folder.rglob("*"):
        if child.is_file():
            os.chmod(child, mode)  # safetensors creates 0600; ours get what any file gets
            _fsync(child)
    _fsync(folder)


def _default_file_mode() -> int:
    """The mode a new file gets from open(): 0o666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# ---- what marks a folder as ours ---------------------------------------------------------------

def _marked_folder(path: Path, kind: str) -> Path:
    """A fresh `.NAME.<kind>-<pid>-<random>/` beside `path`, its marker written (and fsynced)
    before anything else goes in, so whatever a crash leaves of it is recognisably ours."""
    folder = path.parent / f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
    folder.mkdir()
    with open(folder / MARKER, "x", encoding="utf-8") as handle:
        json.dump({"tool": TOOL, "folder": path.name, "kind": kind, "pid": os.getpid()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return folder


def _is_ours(folder: Path, name: str) -> bool:
    """Whether `folder` is a temporary or backup folder a save of `name` made (its marker)."""
    marker = folder / MARKER
    if folder.is_symlink() or marker.is_symlink() or not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("tool") == TOOL and data.get("folder") == name


def _our_folders(path: Path, kind: str) -> list[Path]:
    return [folder for folder in path.parent.glob(f".{glob.escape(path.name)}.{kind}-*")
            if _is_ours(folder, path.name)]


def _delete_ours(folder: Path) -> None:
    """Delete a folder of ours, the marker last: an interrupted delete leaves a folder that is
    still marked as ours, which the next save removes. OSErrors are ignored (debris is kept)."""
    try:
        for child in folder.iterdir():
            if child.name == MARKER:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        (folder / MARKER).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass


def _remove_debris(path: Path, *, keep_complete: bool) -> None:
    """Delete the temporary and backup folders earlier saves of `path` left (ours only). With
    `keep_complete` (before this save's folder is in place) every complete copy is kept: after a
    crash between the renames it is the newest checkpoint there is."""
    for folder in _our_folders(path, "tmp") + _our_folders(path, "old"):
        if keep_complete and ((folder / COMPLETE).is_dir() or (folder / PREVIOUS).is_dir()):
            continue
        _delete_ours(folder)


# ---- one writer per folder, and renames Ctrl-C cannot tear -------------------------------------

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def _save_lock(path: Path) -> Iterator[None]:
    """Hold `.NAME.lock` beside `path` for one save (module docstring, step 0)."""
    lock = path.parent / f".{path.name}.lock"
    fd = _take_lock(lock, path)
    try:
        yield
    finally:
        if fcntl is not None:
            lock.unlink(missing_ok=True)  # before unlocking: no one locks a file being removed
            os.close(fd)
        else:
            os.close(fd)  # Windows cannot remove an open file
            lock.unlink(missing_ok=True)


def _take_lock(lock: Path, path: Path) -> int:
    refuse_symlink(lock, what="lock file")
    for _ in range(10):  # retried only when a finishing writer removed the file under us
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW
                         | (0 if fcntl is not None else os.O_EXCL), 0o644)
        except FileExistsError:  # no flock: the file itself is the lock
            raise CheckpointError(_busy(path, lock, windows=True)) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise CheckpointError(_busy(path, lock)) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
        held = os.read(fd, 4096)
        if held and _holder(held) is None:  # a user's file with our lock's name: not touched
            os.close(fd)
            raise CheckpointError(f"{str(lock)!r} is not a lock file of {TOOL}; refusing to "
                                  f"write {str(path)!r} beside it: move it away")
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"tool": TOOL, "pid": os.getpid()}).encode())
        return fd
    raise CheckpointError(f"could not lock {str(lock)!r}: it keeps being replaced")


def _holder(raw: bytes) -> dict | None:
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("tool") == TOOL else None


def _busy(path: Path, lock: Path, *, windows: bool = False) -> str:
    try:
        holder = _holder(lock.read_bytes()) or {}
    except OSError:
        holder = {}
    who = f"pid {holder['pid']}" if "pid" in holder else "another process"
    stale = f"; if no save is running, delete {str(lock)!r}" if windows else ""
    return (f"{str(path)!r} is being written by another save ({who}, lock {str(lock)!r}); "
            f"wait for it to finish or choose another folder{stale}")


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) back for the block and deliver it after: a KeyboardInterrupt between
    the two renames of a swap would leave neither folder in place. Python runs signal handlers
    in the main thread only, so in any other thread there is nothing to hold back."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, caught[0])  # Python's default raises KeyboardInterrupt
        elif caught:
            signal.raise_signal(signal.SIGINT)  # SIG_DFL or SIG_IGN: what it would have done


def _fsync(path: Path) -> None:
    if sys.platform == "win32" and path.is_dir():  # folders cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
