"""Writing a folder atomically: every output folder of ours (a checkpoint, a Hugging Face folder,
a prepared dataset) is filled beside its destination and swapped in, so a reader sees the old
folder or the new one, never half of one.

How a save is made atomic (one writer per folder at a time):

    1. Remove stale temporaries left by an earlier crashed save: `.NAME.tmp-*` siblings always,
       `.NAME.old-*` siblings only when `NAME/` itself exists (otherwise one of them holds the
       previous folder, see 3).
    2. Write every file into a fresh sibling `.NAME.tmp-<pid>-<random>/`, fsync each file and
       the folder. `NAME/` is untouched so far.
    3. Rename `NAME/` (if there is one) to `.NAME.old-*`, rename the temporary to `NAME/`, fsync
       the parent after each rename, then delete the `.old` folder.

What a crash leaves behind: during 1-2, the old `NAME/` plus a stale `.NAME.tmp-*`; between the
two renames of 3, no `NAME/` but a complete `.NAME.old-*` (`stranded_backups` finds it, and
`load_checkpoint` loads it with a warning); after them, the new `NAME/` plus a stale
`.NAME.old-*`. The next save removes the debris.

Nothing a user had on disk is lost: a folder is replaced only when it is an earlier output of
the same kind and every entry in it will be written again; anything else there makes the save
refuse, naming the entries, before anything is moved.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Collection
from pathlib import Path

from ..errors import CheckpointError


def write_folder_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                            same_kind: Callable[[Path], bool], what: str,
                            names: Collection[str] | None = None) -> Path:
    """Call `write(tmp_folder)` to fill a fresh sibling folder, fsync it, and swap it into `path`
    (see the module docstring for the steps and what a crash leaves behind).

    Nothing a user had is lost: an existing non-empty `path` is replaced only if
    `same_kind(path)` (it is an earlier output of this kind, `what`) and every entry in it is
    written again. `names` (the entries `write` will make, when known) lets that be refused
    before writing; it is checked again on what `write` made. If `write` (or anything before
    the swap) raises, the temporary folder and any parent folders made for it are removed."""
    path = Path(path).absolute()
    parent, name = path.parent, path.name
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{str(path)!r} exists and is not a folder; refusing to replace it")
    if path.is_dir() and any(path.iterdir()) and not same_kind(path):
        raise CheckpointError(
            f"{str(path)!r} is a non-empty folder ({_listing(path)}) that is not a {what}; "
            "refusing to replace what does not look like one of our outputs (nothing was "
            "written): choose another folder")
    if names is not None:
        refuse_to_lose(path, names, what=what)
    made = make_folders(parent)
    _remove_stale(parent, name, keep_backups=not path.is_dir())
    tmp = parent / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        write(tmp)
        refuse_to_lose(path, [child.name for child in tmp.iterdir()], what=what)
        _sync_files(tmp)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):
            _rmdir_if_empty(folder)
        raise
    _swap(tmp, path)
    return path


def _swap(tmp: Path, path: Path) -> None:
    """Step 3: the old folder aside, the new one in, the old one deleted (module docstring)."""
    parent, name = path.parent, path.name
    old = None
    if path.exists():
        old = parent / f".{name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(path, old)
        _fsync(parent)
    os.rename(tmp, path)  # a crash before this line leaves the old folder in `old`
    _fsync(parent)
    if old is not None:
        shutil.rmtree(old)
    _remove_stale(parent, name, keep_backups=False)  # backups a crash stranded are superseded


def stranded_backups(path: str | os.PathLike) -> list[Path]:
    """The `.NAME.old-*` folders beside `path` that a crash between the two renames left,
    newest first."""
    path = Path(path)
    return sorted(path.absolute().parent.glob(f".{glob.escape(path.name)}.old-*"),
                  key=lambda p: p.stat().st_mtime, reverse=True)


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


def _remove_stale(parent: Path, name: str, *, keep_backups: bool) -> None:
    for stale in parent.glob(f".{glob.escape(name)}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not keep_backups:
        for stale in parent.glob(f".{glob.escape(name)}.old-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _fsync(path: Path) -> None:
    if sys.platform == "win32" and path.is_dir():  # folders cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
