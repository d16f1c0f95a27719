"""`verify --model FILE.py:FACTORY --spec CONFIG.json`: the learner's path of the README, on the
hand-written tied GPT in examples/learner (nanoGPT's layout)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import error_line

from decoder_audit.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "learner"
MODEL = f"{EXAMPLE / 'model.py'}:build"
SPEC = str(EXAMPLE / "spec.json")


def _checks(capsys) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


def test_with_a_spec_the_white_box_checks_run_and_pass(capsys):
    assert main(["verify", "--model", MODEL, "--spec", SPEC, "--json"]) == 0
    checks = _checks(capsys)
    for name in ("params", "tying", "tying_grad", "oracle", "dead_parameters"):
        assert checks[name]["passed"] and not checks[name]["skipped"], name
    # spec.json by hand: V*D + T*D, L x (2 LayerNorms + attention + MLP, with biases), ln_f, tied
    V, D, T, L, F = 64, 32, 32, 2, 128
    block = 2 * 2 * D + (4 * D * D + 4 * D) + (2 * D * F + F + D)
    assert checks["params"]["evidence"]["measured_total"] == V * D + T * D + L * block + 2 * D
    assert checks["oracle"]["evidence"]["layout"] == "nanoGPT / GPT-2"


def test_without_a_spec_tying_and_dead_parameters_still_run(capsys):
    assert main(["verify", "--model", MODEL, "--vocab-size", "64", "--max-seq-len", "32",
                 "--json"]) == 0
    checks = _checks(capsys)
    for name in ("tying", "tying_grad", "dead_parameters"):
        assert checks[name]["passed"] and not checks[name]["skipped"], name
    assert checks["params"]["skipped"] and checks["oracle"]["skipped"]


def test_a_spec_the_model_does_not_fit_fails_naming_the_difference(tmp_path, capsys):
    spec = json.loads(Path(SPEC).read_text())
    spec["norm_eps"] = 1e-2  # nn.LayerNorm's eps is 1e-5
    wrong = tmp_path / "spec.json"
    wrong.write_text(json.dumps(spec))
    assert main(["verify", "--model", MODEL, "--spec", str(wrong), "--json"]) == 1
    checks = _checks(capsys)
    assert not checks["oracle"]["passed"] and checks["params"]["passed"]


def test_a_weights_map_file_places_the_weights(tmp_path, capsys):
    mapper = tmp_path / "mapping.py"
    mapper.write_text(
        "from decoder_audit.references.layouts import detect\n"
        "import decoder_audit as da\n"
        f"SPEC = da.DecoderConfig.load({SPEC!r})\n"
        "def place(state):\n"
        "    return detect(state, SPEC).canonical(state)\n")
    assert main(["verify", "--model", MODEL, "--spec", SPEC, "--weights-map",
                 f"{mapper}:place", "--json"]) == 0
    assert _checks(capsys)["oracle"]["evidence"]["layout"] == f"weights_map {mapper}:place"


def test_a_weights_map_without_a_spec_is_one_line_naming_spec(capsys):
    assert main(["verify", "--model", MODEL, "--weights-map", "x.py:f"]) == 2
    assert "--spec" in error_line(capsys, "verify")
