"""Environments of other releases beside the project's own: the gate run under the transformers
(or x-transformers, litgpt, ...) release a bug shipped in, or at the floor of a declared range,
sharing the project's installed torch.

    python tests/releases.py transformers==4.45.2        # builds it once, prints its python
    .release-envs/transformers-4.45.2/bin/python -m pytest tests/...

A release environment is a venv of its own whose site-packages come first, with the project's
venv after them: one `.pth` line runs `site.addsitedir` on the project's site-packages, so its
editable install of decoder_audit, its torch and everything else it has are seen, and the
release's own packages shadow theirs. pip installs into it only what the release needs at
versions the project's venv lacks; torch is pinned to the installed build, so no other torch is
ever downloaded. pip then warns that packages of the project's venv (transformer-lens, say)
want another transformers: they are not this environment's to satisfy.

The environments live in `.release-envs/` at the repository's root (ignored by git; the
DA_RELEASE_ENVS variable names another folder), one folder per requirement set, reused while it exists; a half-built one is never reused (it is built
under a temporary name and renamed into place only when pip succeeded).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# DA_RELEASE_ENVS puts them elsewhere (a fresh folder measures what a cold CI run costs).
ENVS = Path(os.environ.get("DA_RELEASE_ENVS") or ROOT / ".release-envs")


def _slug(requirements: list[str]) -> str:
    return "+".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", r).strip("-") for r in requirements)


def release_python(requirements: list[str], *, envs: Path = ENVS) -> Path:
    """The python of an environment holding `requirements` (pinned, e.g.
    ["transformers==4.45.2"]) over the running interpreter's site-packages, built if absent.
    Raises RuntimeError with pip's last lines when pip fails."""
    if not requirements or any("==" not in r for r in requirements):
        raise ValueError(f"requirements={requirements!r}: each must pin one release (name==X)")
    target = envs / _slug(requirements)
    python = target / "bin" / "python"
    if python.exists():
        return python
    envs.mkdir(parents=True, exist_ok=True)
    building = envs / f".{target.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    own = Path(sysconfig.get_path("purelib", vars={"base": str(building),
                                                   "platbase": str(building)}))
    shared = sysconfig.get_path("purelib")  # the running (project) interpreter's site-packages
    (own / "zz_project_site.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    torch_pin = building / "torch-pin.txt"
    torch_pin.write_text(f"torch=={_installed('torch')}\n")
    # The project's pip installs into the new environment (--prefix), resolving against what
    # that environment sees: its own packages first, then the project's.
    done = subprocess.run(
        [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", "--only-binary", ":all:", "-c", str(torch_pin),
         *requirements],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": shared})
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        shutil.rmtree(building, ignore_errors=True)
        raise RuntimeError(f"pip could not install {requirements} (exit {done.returncode}):\n"
                           f"{tail}")
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)  # bin/python links to the base interpreter: the name may change
    return python


def _installed(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    print(release_python(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
