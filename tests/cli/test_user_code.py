"""Code in a `--model FILE.py:FACTORY` file runs inside the command and must not decide its outcome
(issue 26): what it prints stays off stdout (`verify --json` prints JSON only), an os.chdir in it
moves no output path, a sys.exit or os._exit in it is one line and status 1 (never the code's
own status, 0 a "pass" with nothing checked), and a thread it leaves running does not keep the
process alive after the verdict. os._exit and the thread are replayed in a child process: they
end or hang the process that runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import FOREIGN, error_line, one_line

from decoder_audit.cli import main

# The foreign model of cli_support (a causal prefix mean, V = 8, 4 positions), misbehaving on
# demand inside its forward.
USER = FOREIGN + '''
import os
import threading
import time


class Misbehaving(PrefixMean):
    def __init__(self, how=""):
        super().__init__()
        self.how = how

    def forward(self, ids):
        if self.how == "print":
            print("forward saw", tuple(ids.shape))
        elif self.how == "sys.exit":
            sys.exit(3)
        elif self.how == "os._exit":
            os._exit(0)
        return super().forward(ids)


def _built(how=""):
    torch.manual_seed(0)
    model = Misbehaving(how)
    with torch.no_grad():
        model.emb.weight.mul_(0.02)  # a fresh model's loss near ln V, as train expects
    return model


def prints():
    print("building the model")
    return _built("print")


def chdirs():
    os.chdir(os.environ["USER_CODE_CHDIR"])
    return _built()


chdirs_too = chdirs  # another FILE.py:FACTORY, so the process builds it again


def exits_in_forward():
    return _built("sys.exit")


def hard_exits():
    os._exit(0)


def hard_exits_in_forward():
    return _built("os._exit")


def leaves_a_thread():
    threading.Thread(target=time.sleep, args=(3600,), name="user-sleeper").start()
    return _built()
'''

SHAPE = ["--vocab-size", "8", "--max-seq-len", "4", "--no-progress"]


@pytest.fixture
def user(tmp_path) -> Path:
    path = tmp_path / "user_model.py"
    path.write_text(USER)
    return path


def test_prints_in_the_factory_and_the_forward_leave_verify_json_alone(user, capsys):
    assert main(["verify", "--model", f"{user}:prints", *SHAPE, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the JSON, all of it
    assert report["passed"] is True
    assert "building the model" in captured.err and "forward saw" in captured.err


def test_a_print_in_the_factory_leaves_ledger_json_alone(user, capsys):
    assert main(["ledger", "--model", f"{user}:prints", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["measured_total"] == 8 * 8 + 4 * 8  # V*D + T*D, head tied
    assert "building the model" in captured.err


def test_a_chdir_in_the_factory_moves_no_output_path(user, tmp_path, monkeypatch, capsys):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("USER_CODE_CHDIR", str(elsewhere))
    monkeypatch.chdir(start)
    assert main(["verify", "--model", f"{user}:chdirs", *SHAPE, "--report", "report"]) == 0
    assert (start / "report" / "report.json").is_file()
    os.chdir(start)
    relative = f"{os.path.relpath(user, start)}:chdirs_too"  # ../user_model.py, as typed
    assert main(["train", "--model", relative, *SHAPE, "--steps", "1", "--batch-size", "16",
                 "--warmup", "1", "--out", "run"]) == 0
    factory = json.loads((start / "run" / "checkpoint" / "factory.json").read_text())
    assert factory["factory"] == f"{user.resolve()}:chdirs_too"
    assert sorted(p.name for p in elsewhere.iterdir()) == []


def test_sys_exit_with_a_status_in_the_forward_is_one_line_and_status_1(user, capsys):
    assert main(["verify", "--model", f"{user}:exits_in_forward", *SHAPE]) == 1
    line = error_line(capsys, "verify")
    assert "sys.exit(3)" in line and "nothing was checked" in line


def _command(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """decoder-audit ARGV as its own process, the way a shell runs it (the console script's
    `sys.exit(main())`, so main() sees argv=None)."""
    script = "import sys\nfrom decoder_audit.cli import main\nsys.exit(main())\n"
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("factory, where", [("hard_exits", "factory"),
                                            ("hard_exits_in_forward", "forward")])
def test_os_exit_in_user_code_is_one_line_not_the_codes_status(user, factory, where):
    done = _command("verify", "--model", f"{user}:{factory}", *SHAPE)
    assert done.returncode == (2 if where == "factory" else 1), done.stdout + done.stderr
    line = one_line(done.stderr, "verify")
    assert "os._exit(0)" in line, line
    assert "PASSED" not in done.stdout


def test_a_thread_left_running_does_not_keep_the_command_from_exiting(user):
    try:
        done = _command("verify", "--model", f"{user}:leaves_a_thread", *SHAPE, timeout=120)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError("the command waited for the user's thread after its verdict") from hung
    assert done.returncode == 0, done.stderr  # the verdict's status
    assert "PASSED" in done.stdout
    assert "user-sleeper" in done.stderr  # said which thread it did not wait for
