"""A weights_map is user code the gate runs: whatever it does instead of mapping (returns no
dict of tensors, raises, exits, edits the module in place) is a failing params and oracle naming
the map, never a raw exception, an exit, or a changed model; and a map that copies the module's
tensors still gets the stress and gradient comparisons."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zoo_styles

import decoder_audit as da
from decoder_audit.references import layouts
from decoder_audit.references.weights_map import WeightsMapError

SPEC = zoo_styles.SPECS["tune"]


def _views(state):
    return layouts.detect(state, SPEC).canonical(state)


def _returns_list(state):
    return list(_views(state).values())


def _returns_none(state):
    _views(state)


def _holds_a_list(state):
    return {**_views(state), "lm_head.weight": [[0.0] * SPEC.d_model] * SPEC.vocab_size}


def _holds_numpy(state):
    return {name: np.zeros(tuple(t.shape)) for name, t in _views(state).items()}


def _via_tolist(state):
    return {name: torch.tensor(t.tolist()) for name, t in _views(state).items()}


def _calls_sys_exit(state):
    sys.exit(0)


def _calls_exit_with_a_message(state):
    raise SystemExit("done")


def _holds_a_number(state):
    return {**_views(state), "ln_final.weight": 1.0}


def _keyed_by_numbers(state):
    return dict(enumerate(_views(state).values()))


# What a map returns is input: anything but {name: tensor} is refused as a bad argument is.
RETURNS = {_returns_list: "list", _returns_none: "None", _holds_a_list: "list",
           _holds_numpy: "ndarray", _holds_a_number: "float", _keyed_by_numbers: "not names"}
# What a map does when run (raises, exits) is evidence: a failing params and oracle.
BROKEN = {_via_tolist: "meta", _calls_sys_exit: "sys.exit(0)",
          _calls_exit_with_a_message: "sys.exit('done')"}


@pytest.mark.parametrize("weights_map", list(RETURNS), ids=[f.__name__ for f in RETURNS])
def test_a_map_returning_no_dict_of_tensors_is_a_config_error_naming_what_it_returned(
        weights_map):
    model = zoo_styles.TuneLlama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(da.ConfigError) as raised:
        da.audit(model, spec=SPEC, weights_map=weights_map)
    assert isinstance(raised.value, WeightsMapError)
    said = str(raised.value)
    assert weights_map.__name__ in said and RETURNS[weights_map] in said, said
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("weights_map", ["_returns_list", "_returns_none", "_holds_a_list"])
def test_verify_exits_2_with_one_line_for_a_map_returning_no_dict_of_tensors(weights_map,
                                                                            tmp_path, capsys):
    from cli_support import error_line

    from decoder_audit.cli import main

    tests = Path(__file__).resolve().parents[1]
    (tmp_path / "maps.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\n"
        "import zoo_styles\nfrom gate import test_spec_weights_map as maps\n"
        f"{weights_map} = maps.{weights_map}\n"
        "def build():\n    return zoo_styles.TuneLlama()\n")
    SPEC.save(tmp_path / "spec.json")
    assert main(["verify", "--model", f"{tmp_path / 'maps.py'}:build", "--spec",
                 str(tmp_path / "spec.json"), "--weights-map",
                 f"{tmp_path / 'maps.py'}:{weights_map}", "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert weights_map in line and "returned" in line, line


@pytest.mark.parametrize("weights_map", list(BROKEN), ids=[f.__name__ for f in BROKEN])
def test_a_map_that_does_not_map_fails_params_and_oracle_naming_it(weights_map):
    model = zoo_styles.TuneLlama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = da.audit(model, spec=SPEC, weights_map=weights_map, checks=["params", "oracle"])
    for name in ("params", "oracle"):
        result = report[name]
        assert not result.passed and not result.skipped, name
        assert weights_map.__name__ in result.detail and BROKEN[weights_map] in result.detail
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_a_map_calling_os_exit_neither_ends_the_process_nor_sets_its_status(tmp_path):
    """os._exit cannot be caught: while the map runs it raises instead. Run in a child, so a
    regression that lets it through cannot end this test session with status 0."""
    script = tmp_path / "child.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "import zoo_styles\nimport decoder_audit as da\n"
        "real = os._exit\n"
        "def exits(state):\n    os._exit(0)\n"
        "report = da.audit(zoo_styles.TuneLlama(), spec=zoo_styles.SPECS['tune'], "
        "weights_map=exits, checks=['params', 'oracle'])\n"
        "print('params', report['params'].passed, report['params'].detail)\n"
        "print('oracle', report['oracle'].passed, os._exit is real)\n"
        "sys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert child.returncode == 3, child.stderr[-2000:]
    lines = child.stdout.splitlines()
    assert lines[0].startswith("params False") and "exits" in lines[0] and "os._exit(0)" in \
        lines[0]
    assert lines[1] == "oracle False True"  # and os._exit is itself again after the map


def _edits_in_place(state):
    with torch.no_grad():
        state["layers.0.mlp.w1.weight"].mul_(1.5)
    return _views(state)


def _edits_through_data(state):
    state["layers.0.mlp.w1.weight"].data.mul_(1.5)  # bypasses the version counter
    return _views(state)


@pytest.mark.parametrize("weights_map", [_edits_in_place, _edits_through_data])
def test_a_map_that_edits_the_module_in_place_fails_naming_it_and_the_module_is_restored(
        weights_map):
    model = zoo_styles.TuneLlama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = da.audit(model, spec=SPEC, weights_map=weights_map, checks=["params", "oracle"])
    oracle = report["oracle"]
    assert not oracle.passed
    assert weights_map.__name__ in oracle.detail and "layers.0.mlp.w1.weight" in oracle.detail
    assert "in place" in oracle.detail
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def _copies(state):
    return {name: t.clone() for name, t in _views(state).items()}


def _contiguous_transposes(state):
    """Copies made another way: each matrix transposed twice into fresh memory."""
    return {name: t.T.contiguous().T.contiguous() if t.dim() == 2 else t.contiguous().clone()
            for name, t in _views(state).items()}


@pytest.mark.parametrize("weights_map", [_copies, _contiguous_transposes])
def test_a_copying_map_is_stressed_and_its_gradients_compared(weights_map):
    model = zoo_styles.TuneLlama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = da.audit(model, spec=SPEC, weights_map=weights_map, checks=["params", "oracle"])
    assert report.passed, report.first_failure
    evidence = report["oracle"].evidence
    assert evidence["stressed"] and "quiet" in evidence
    assert evidence["gradients"]["compared"] == len(before)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("weights_map", [None, _copies])
def test_a_hand_written_backward_five_percent_off_fails_the_oracle_through_a_copying_map(
        weights_map):
    """The forward is exact, so only the gradients see it: a copying map used to switch them
    off, and the model passed."""
    report = da.audit(zoo_styles.wrong_backward_llama(), spec=SPEC, weights_map=weights_map,
                      checks=["oracle"])
    oracle = report["oracle"]
    assert not oracle.passed
    grads = oracle.evidence["gradients"]
    assert grads["worst_parameter"].endswith("mlp.w2.weight")
    assert grads["worst_parameter"] in oracle.detail
    stress = oracle.evidence["stress"]
    assert stress["max_abs_logit_error"] <= stress["allowed"]


def test_through_a_copying_map_the_stress_comparison_runs_and_sees_a_defect():
    """A RoPE base of 1000 for 10000, written through the map's copies: the stress weights
    (order-1 scores) move the logits by a tenth of their scale, where fresh weights move them
    by a few parts in 10^4. Before, a copying map got no stress comparison at all."""
    report = da.audit(zoo_styles.TuneLlama("theta"), spec=SPEC, weights_map=_copies,
                      checks=["oracle"])
    evidence = report["oracle"].evidence
    assert not report.passed and evidence["stressed"]
    assert evidence["stress"]["max_abs_logit_error"] > 100 * evidence["stress"]["allowed"]
