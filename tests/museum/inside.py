"""One museum entry, run inside one release's environment: build the model, measure its symptom
without the gate, then audit it with the call a user makes; print one JSON record.

    PYTHONPATH=src:tests .release-envs/transformers-5.17.0/bin/python -m museum.inside ID

The runner (runner.py) starts this with the release's python; the record says which release
ran (the library's own __version__), the symptom's figure, and the audit's verdict: the checks
that failed and their details, or the exception when the gate itself raised.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import traceback
import warnings
from importlib.metadata import version

import torch

from . import builders, symptoms
from .entries import BY_ID, Entry

MODULES = {"transformers": "transformers", "x-transformers": "x_transformers",
           "litgpt": "litgpt", "torchtune": "torchtune", "transformer-lens": "transformer_lens"}


def run(entry: Entry) -> dict:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    model, V = getattr(builders, entry.builder)()
    figure = symptoms.SYMPTOMS[entry.symptom](model, V, **entry.args)
    return {"id": entry.id, "release": version(entry.library),
            "figure": figure, "audit": _audited(entry, model)}


def _audited(entry: Entry, model) -> dict:
    """The verdict of the plain call: failed checks with their details, or the crash."""
    try:
        if entry.via == "audit":
            import decoder_audit as da

            kwargs = dict(entry.audit)
            if "training" in kwargs:  # the training path a trainer declares, as its fields
                kwargs["training"] = da.TrainingPath(**kwargs["training"])
            return _verdict(da.audit(model, **kwargs).to_dict())
        return _verified(model)
    except Exception as exc:  # noqa: BLE001 - the gate raising is what the record reports
        return {"crash": f"{type(exc).__name__}: {exc}",
                "where": traceback.format_exc(limit=-3)}


def _verified(model) -> dict:
    """`decoder-audit verify --hf DIR --json` on the model's save_pretrained folder, run as the
    command (a process of this release's python)."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from decoder_audit.cli import main; "
             "sys.exit(main(sys.argv[1:]))", "verify", "--hf", folder, "--json"],
            capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"crash": f"verify exited {done.returncode}: {' | '.join(tail)}"}
    return _verdict(report)


def _verdict(report: dict) -> dict:
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    return {"passed": report["passed"], "failures": [c["name"] for c in failed],
            "skipped": report["skipped"],
            "details": {c["name"]: c["detail"][:400] for c in failed}}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in BY_ID:
        print(f"usage: python -m museum.inside ID (one of {sorted(BY_ID)})", file=sys.stderr)
        return 2
    print(json.dumps(run(BY_ID[argv[0]])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
