"""The run options of a resumed run (training/run.py)."""

from __future__ import annotations

import pytest

import decoder_audit as da
from decoder_audit.training.run import resolve_run_options


def test_run_options_of_a_resumed_run():
    saved = {"save_every": 8, "eval_every": 5, "device": "cpu", "threads": 1}
    unset = {"save_every": None, "eval_every": None, "device": None, "threads": "auto"}
    assert resolve_run_options(unset, saved) == (saved, [])
    chosen, notes = resolve_run_options({**unset, "save_every": 4}, saved)
    assert chosen["save_every"] == 4 and notes == ["save_every=4 replaces the run's save_every=8"]
    assert resolve_run_options(unset, None)[0] == {"save_every": 0, "eval_every": 50,
                                                   "device": "cpu", "threads": "auto"}
    with pytest.raises(da.ConfigError, match=r"threads=-1 must be an integer >= 1"):
        resolve_run_options({**unset, "threads": -1}, None)
    with pytest.raises(da.ConfigError, match=r"eval_every=0 must be an integer >= 1"):
        resolve_run_options({**unset, "eval_every": 0}, None)
