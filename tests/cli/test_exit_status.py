"""The exit status is the verdict's, decided after user code can run (issue 35): an atexit handler
a --model factory registers (os._exit(0), sys.exit(0)), or a signal handler it installs that
fires at exit, cannot turn FAILED into status 0, nor PASSED into another status; each handler
that exits or fails is one note on stderr, and what it prints stays off stdout. A Python caller
of main([...]) keeps its process: it gets the status back and ends as usual.

Replayed in child processes run the way a shell runs the console script (`sys.exit(main())`):
the handlers run only when a process ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_support import FOREIGN

# cli_support's PrefixMean (a causal prefix mean, V = 8, 4 positions: it passes), and a leaky
# variant of it (each position reads the mean of the whole row: `causal` fails).
USER = FOREIGN + '''
import atexit
import os
import signal


class Leaky(PrefixMean):
    def forward(self, ids):
        logits = super().forward(ids)
        return logits + logits.mean(1, keepdim=True)


def failing():
    """Leaky, and three ways to end the process with status 0 once the verdict is out."""
    atexit.register(lambda: os._exit(0))
    atexit.register(lambda: sys.exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: os._exit(0))  # a handler of its own, and the
    atexit.register(os.kill, os.getpid(), signal.SIGUSR1)  # signal sent while the process ends
    return Leaky()


def passing():
    atexit.register(lambda: os._exit(3))
    atexit.register(lambda: print("user exit handler ran"))
    return build()
'''

SHAPE = ["--vocab-size", "8", "--max-seq-len", "4", "--no-progress"]


@pytest.fixture
def user(tmp_path):
    path = tmp_path / "user_model.py"
    path.write_text(USER)
    return path


def _command(*argv: str) -> subprocess.CompletedProcess:
    script = "import sys\nfrom decoder_audit.cli import main\nsys.exit(main())\n"
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          timeout=240, check=False)


def test_user_code_run_at_exit_cannot_turn_failed_into_status_0(user):
    done = _command("verify", "--model", f"{user}:failing", *SHAPE)
    assert "FAILED" in done.stdout and "causal" in done.stdout, done.stdout
    assert done.returncode == 1, done.stdout + done.stderr
    # the two handlers that exited, one note each; the signal handler was set aside before
    # the exit handlers ran, so its os._exit(0) never ran
    notes = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(notes) == 2 and all("note:" in line for line in notes), notes
    assert "sys.exit(0)" in notes[0] and "os._exit(0)" in notes[1], notes  # last registered first


def test_a_passing_verdict_keeps_status_0_and_its_json_past_exit_handlers(user):
    done = _command("verify", "--model", f"{user}:passing", *SHAPE, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["passed"] is True  # stdout is the JSON, all of it
    assert "user exit handler ran" in done.stderr and "os._exit(3)" in done.stderr


def test_a_python_caller_of_main_keeps_its_process(user):
    """main([...]) returns the status; the process goes on and ends as Python ends it (here
    the user's handler's os._exit(0) is the process's business, not the command's)."""
    script = ("import sys\nfrom decoder_audit.cli import main\n"
              f"code = main(['verify', '--model', {f'{user}:failing'!r}, *{SHAPE!r}])\n"
              "print('returned', code, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, check=False)
    assert "returned 1" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0  # the user's own atexit, run by Python at the end as usual
