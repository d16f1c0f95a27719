"""What the gate costs a transformers Trainer run: the same run gated and ungated, each in a
fresh process (imports counted), and GPT-2 small's gate time counted in its own training steps.

    python -m benchmarks.trainer_gate                         # 20 and 1000 steps, and GPT-2 small
    python -m benchmarks.trainer_gate --steps 20 --skip-gpt2  # the short run alone
    nice python -m benchmarks.trainer_gate --out benchmarks/results   # the tracked figures

The tiny run is examples/trainers/trainer.py's: the tiny Llama (2 layers, D=16, V=37), 32
random documents of 6 to 12 tokens flattened 4 at a time (DataCollatorWithFlattening), 2
micro-batches a step, nothing logged or saved. Each process's wall time is measured from outside
(interpreter start and every import included); the gated and the ungated process alternate, so
drift on a shared machine hits both; each figure is the median of `--repeats`. The gated process
also reports the gate's own seconds (TrainerGate.on_train_begin) and the import of
decoder_audit.integrations.

GPT-2 small (124M parameters, random weights, V=50257, rows of 1024 tokens, one row a step,
float32) runs the gate and 3 training steps in one process: the gate's seconds over the median
seconds of a step (the 2nd and 3rd: the 1st warms the allocator), its cost in the run's own
steps. The machine's load average is recorded beside each figure: on a shared machine they are
indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[1])
if __package__ in (None, "") and _ROOT not in sys.path:  # run as a file
    sys.path.insert(0, _ROOT)

from benchmarks.store import DEFAULT_OUT, write_json  # noqa: E402

EXAMPLES = Path(_ROOT) / "examples" / "trainers"


def child(kind: str, steps: int, gated: bool) -> dict[str, Any]:
    """One run in this process: the figures it measured from the inside."""
    sys.path.insert(0, str(EXAMPLES))
    import tempfile

    import torch
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    figures: dict[str, Any] = {}
    if kind == "tiny":
        from tiny import documents, tiny_llama

        model, data, rows = tiny_llama(), documents(), 4
    else:
        model, data, rows = _gpt2_small()
    out = tempfile.mkdtemp(prefix="trainer-gate-bench-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=rows, max_steps=steps,
                             gradient_accumulation_steps=2 if kind == "tiny" else 1,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             logging_strategy="no", seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      data_collator=DataCollatorWithFlattening())
    trainer.add_callback(_StepClock(figures))
    if gated:
        started = time.perf_counter()
        from decoder_audit.integrations import gate_trainer
        from decoder_audit.integrations import trainer as gated_trainer

        figures["import_s"] = time.perf_counter() - started
        gate = gate_trainer(trainer, say=lambda *a, **k: None)
        _time_the_gate(gated_trainer.TrainerGate, figures)
    started = time.perf_counter()
    trainer.train()
    figures["train_s"] = time.perf_counter() - started
    if gated:
        figures["passed"] = not gate.verdict.refused
    return figures


def _gpt2_small() -> tuple[Any, list[dict], int]:
    """GPT-2 small with random weights, 8 documents of 1024 random ids, one a row."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config())
    gen = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, 50257, (1024,), generator=gen).tolist()}
            for _ in range(8)]
    return model, data, 1


def _time_the_gate(cls: Any, figures: dict[str, Any]) -> None:
    """TrainerGate.on_train_begin timed into figures["gate_s"]."""
    original = cls.on_train_begin

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            figures["gate_s"] = time.perf_counter() - started

    cls.on_train_begin = timed


class _StepClock:
    """A TrainerCallback (duck-typed) that records each optimizer step's seconds."""

    def __init__(self, figures: dict[str, Any]) -> None:
        self.figures, self.started = figures, None
        figures["step_s"] = []

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, *args, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, *args, **kwargs):
        self.figures["step_s"].append(time.perf_counter() - self.started)


def _launch(kind: str, steps: int, gated: bool) -> dict[str, Any]:
    """One child process: its wall time from outside, and what it measured inside."""
    command = [sys.executable, "-m", "benchmarks.trainer_gate", "--child", kind, str(steps),
               "gated" if gated else "ungated"]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "load_average": load, **inside}


def tiny_rows(steps: int, repeats: int) -> dict[str, Any]:
    """The tiny run gated and ungated, alternating, `repeats` times each."""
    runs: dict[str, list[dict]] = {"ungated": [], "gated": []}
    for _ in range(repeats):
        for label in ("ungated", "gated"):
            runs[label].append(_launch("tiny", steps, label == "gated"))
            print(f"tiny {steps} steps {label}: {runs[label][-1]['wall_s']:.2f} s", flush=True)
    wall = {label: statistics.median(r["wall_s"] for r in rows) for label, rows in runs.items()}
    gated = runs["gated"]
    return {"steps": steps, "repeats": repeats, "runs": runs,
            "ungated_s": wall["ungated"], "gated_s": wall["gated"],
            "added_s": wall["gated"] - wall["ungated"],
            "ratio": wall["gated"] / wall["ungated"],
            "gate_s": statistics.median(r["gate_s"] for r in gated),
            "import_s": statistics.median(r["import_s"] for r in gated),
            "passed": all(r["passed"] for r in gated)}


def gpt2_row() -> dict[str, Any]:
    run = _launch("gpt2", 3, True)
    step = statistics.median(run["step_s"][1:])
    return {"run": run, "gate_s": run["gate_s"], "step_s": step,
            "gate_in_steps": run["gate_s"] / step, "passed": run["passed"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, steps, gated = argv[1], int(argv[2]), argv[3] == "gated"
        print(json.dumps(child(kind, steps, gated)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 1000])
    parser.add_argument("--repeats", type=int, default=3,
                        help="gated/ungated pairs per step count (1000 steps: one)")
    parser.add_argument("--skip-gpt2", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results folder (default out/benchmarks, which git ignores; "
                             "benchmarks/results is the tracked one)")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"command": "python -m benchmarks.trainer_gate " + " ".join(argv),
                               "cpus": os.cpu_count(), "tiny": []}
    for steps in args.steps:
        figures["tiny"].append(tiny_rows(steps, 1 if steps >= 1000 else args.repeats))
        write_json(args.out / "trainer_gate.json", figures)
    if not args.skip_gpt2:
        figures["gpt2_small"] = gpt2_row()
        write_json(args.out / "trainer_gate.json", figures)
    for row in figures["tiny"]:
        print(f"tiny, {row['steps']} steps: ungated {row['ungated_s']:.2f} s, gated "
              f"{row['gated_s']:.2f} s (+{row['added_s']:.2f} s, x{row['ratio']:.2f}); the gate "
              f"itself {row['gate_s']:.2f} s, its import {row['import_s']:.2f} s")
    if "gpt2_small" in figures:
        g = figures["gpt2_small"]
        print(f"GPT-2 small: gate {g['gate_s']:.1f} s, a step {g['step_s']:.1f} s: the gate "
              f"costs {g['gate_in_steps']:.1f} steps")
    print(f"written: {args.out / 'trainer_gate.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
