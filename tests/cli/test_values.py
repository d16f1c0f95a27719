"""Every numeric option of every command declares its range, and a value outside it is one line
naming the option, the value and the range, exit status 2, before anything runs (issue 44:
`--seed 10^23` and `account --batch 10^20` raised "unexpected ... Overflow"; `--grad-clip nan`
trained, then "diverged"). The ranges themselves are checked against what their values reach:
torch's and numpy's seeding, int64 sizes. Also: a --warmup longer than the run, and
verify-batch's refusal of a pickle, alone on stderr."""

from __future__ import annotations

import argparse
import math
import pickle
import sys
import warnings

import numpy
import pytest
import torch
from cli_support import error_line

from decoder_audit.cli import build_parser, main
from decoder_audit.cli import values

INT64_MAX = 2**63 - 1


def _numeric_options() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every option of every subcommand that takes a number."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, sub in commands.choices.items():
        for action in sub._actions:
            kind = action.type
            if kind in (int, float) or hasattr(kind, "range"):
                found.append((command, action))
    return found


OPTIONS = _numeric_options()


def test_every_numeric_option_declares_its_range():
    plain = [f"{command} {action.option_strings[0]}" for command, action in OPTIONS
             if action.type in (int, float)]
    assert not plain, f"options taking a number with no declared range: {plain}"
    assert len(OPTIONS) >= 30  # every command's, not a few


def _outside(action: argparse.Action) -> list[str]:
    """Values just outside the option's range, and NaN and the infinities for a float."""
    low, high = action.type.range
    if isinstance(low, int) and isinstance(high, int):
        return [str(high + 1), str(low - 1), str(10**23)]
    out = ["nan", "inf", "-inf"]
    out += [f"{low - 1:g}" if math.isfinite(low) else "-1e400"]
    out += [f"{high + 1:g}"] if math.isfinite(high) else []
    return out


@pytest.mark.parametrize("command, action", OPTIONS,
                         ids=[f"{c} {a.option_strings[0]}" for c, a in OPTIONS])
def test_a_value_outside_an_options_range_is_one_line_naming_it(command, action, capsys):
    flag = action.option_strings[0]
    for value in _outside(action):
        with pytest.raises(SystemExit) as refused:
            main([command, f"{flag}={value}"])
        assert refused.value.code == 2
        line = error_line(capsys, command)
        assert f"argument {flag}: {value} " in line, line
        assert "Overflow" not in line and "unexpected" not in line, line


@pytest.mark.parametrize("argv", [
    ["train", "--seed", str(10**23)], ["verify", "--seed", str(10**23)],
    ["sample", "--seed", str(10**23)], ["convert", "--seed", str(10**23)],
    ["account", "--batch", str(10**20)], ["train", "--grad-clip", "nan"],
    ["train", "--lr", "inf"], ["sample", "--temperature", "-0.5"], ["sample", "--top-p", "nan"],
    ["train", "--threads", str(2**31)],  # torch.set_num_threads takes a C int
])
def test_the_reported_values_exit_2_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert f"argument {argv[1]}: {argv[2]} " in error_line(capsys, argv[0])


def test_the_ranges_fit_what_their_values_reach():
    """The largest seed seeds torch's global RNG, a Generator at the gate's derived seed
    (seed * 1000003 + a check's salt) and numpy's legacy RNG; one more is refused. The largest
    size is int64's: torch takes it, and no more."""
    parser = build_parser()
    top = parser.parse_args(["verify", "--seed", str(2**32 - 1)]).seed
    torch.manual_seed(top)
    torch.Generator().manual_seed(top * 1000003 + 1000)
    numpy.random.seed(top)
    torch.manual_seed(0)
    with pytest.raises(SystemExit):
        parser.parse_args(["verify", "--seed", str(2**32)])
    assert parser.parse_args(["account", "--batch", str(INT64_MAX)]).batch == INT64_MAX
    torch.empty((INT64_MAX, 0))  # a size torch takes
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        torch.empty((INT64_MAX + 1, 0))
    assert parser.parse_args(["train", "--grad-clip", "0"]).grad_clip == 0.0  # 0 = off


def test_a_warmup_longer_than_the_run_is_said_naming_both(tmp_path, capsys):
    """--warmup 10^18 --steps 2 trained at a learning rate of 2e-18 of --lr, silently: now one
    warning line names both and the fraction of the peak the run ends at."""
    warmup = 10**18
    assert main(["train", "--warmup", str(warmup), "--steps", "2", "--batch-size", "16",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(said) == 1 and said[0].startswith("decoder-audit train: warning: "), said
    assert f"--warmup={warmup}" in said[0] and "--steps 2" in said[0], said
    assert f"2/{warmup}" in said[0], said  # lr * (s + 1) / warmup at the last step, s = 1
    given = argparse.Namespace(resume=None, warmup=2, steps=2)
    assert values.warmup_warning(given, default_steps=400) is None  # as long as the run
    late = values.warmup_warning(argparse.Namespace(resume=None, warmup=401, steps=None), 400)
    assert "--warmup=401" in late and "400 steps by default" in late


def test_verify_batch_refuses_a_pickle_in_its_one_line_alone(tmp_path, capsys):
    """A plain pickle (protocol 4): torch's weights_only unpickler warns about the protocol
    before it fails; only the refusal may show, as a command's process prints warnings."""
    path = tmp_path / "batch.pkl"
    path.write_bytes(pickle.dumps({"input_ids": [[1, 2, 3]]}, protocol=4))

    def as_python_shows(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = as_python_shows
        assert main(["verify-batch", str(path)]) == 2
    assert str(path) in error_line(capsys, "verify-batch")
