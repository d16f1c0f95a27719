"""The "training_step" family: one training step, forward + cross-entropy + backward + AdamW
step, on our Decoder against the Hugging Face model holding the same weights (`da.to_hf`: a
GPT2LMHeadModel or a LlamaForCausalLM, sdpa attention), in fp32 and under bfloat16 autocast.

Configs: GPT-2 small (124M parameters, V = 50257) and the Llama GQA shape of rows.py (D=512, L=8,
H=8, Hkv=4, F=1376, V=32000, RMSNorm, SwiGLU, RoPE, untied), at B = 4, T = 256 (--quick: B = 2,
T = 64 and no torch.compile; --smoke: their tiny stand-ins at B = 2, T = 8). On a 2-core CPU
one step takes seconds, so larger batches would only lengthen the run; on a GPU the shapes are
the same so the rows compare.

Per row:
  - the pair is built and its logits checked equal before anything is timed (`pair.build_pair`);
  - each side gets its own `torch.optim.AdamW` with the same settings (lr 3e-4, betas
    (0.9, 0.95), weight decay 0.1 on every parameter, torch's default implementation, or its
    fused one with --adamw fused), over its unique Parameters (the tied embedding once on both
    sides);
  - a step is zero_grad(set_to_none), the forward (under torch.autocast(bfloat16) in the bf16
    rows, the weights staying float32), the cross-entropy over float32 logits, backward and
    optimizer.step(), as `decoder_audit.training.step` runs it;
  - the two sides are timed interleaved (`pair.time_interleaved`); tokens/s = B * T / median.
HF/ours > 1 means ours is faster. Each bf16 row also times our fp32 step against our bf16 step
on the same model (each precision its own AdamW over the same Parameters), interleaved: fp32 /
bf16 is what autocast buys on the machine. The fp32 rows also time our step with the model under
torch.compile against our eager step (interleaved, after the compiling step, whose seconds are
reported apart); where compiling fails on the machine the row says why instead. The weights drift
apart as the sides take steps from the same start (each its own gradient), which changes no
step's cost.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import decoder_audit as da
from decoder_audit.training.loss import chunked_cross_entropy
from decoder_audit.training.optim import adamw_implementation
from decoder_audit.training.settings import PRECISIONS

from .common import SEED, Plan, stats
from .pair import build_pair, time_interleaved
from .rows import LLAMA_GQA, SMOKE_CONFIGS

ADAMW = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
# "train": what `decoder-audit train` runs (training/optim.py: torch's fused kernel where the
# device has one, as transformers' Trainer also defaults to on torch >= 2.8); "default": torch's
# own default, which walks the parameters one at a time in eight float32 passes each (on a CPU
# it cost as much as a bf16 forward + backward); "fused": the fused kernel, asked for. Each side
# always gets the same implementation.
ADAMW_IMPLEMENTATIONS = {"train": None, "default": {}, "fused": {"fused": True}}


@dataclass(frozen=True)
class StepRow:
    config_name: str
    cfg: da.DecoderConfig
    batch: int
    seq_len: int
    precision: str  # "fp32" or "bf16" (autocast)
    adamw: str = "train"  # a key of ADAMW_IMPLEMENTATIONS, the same on both sides

    @property
    def label(self) -> str:
        optimizer = "" if self.adamw == "train" else f" {self.adamw} AdamW"
        return f"{self.config_name} B={self.batch} T={self.seq_len} {self.precision}{optimizer}"

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The row's AdamW over the model's unique Parameters (a tied weight once)."""
        params = list(dict.fromkeys(model.parameters()))
        implementation = ADAMW_IMPLEMENTATIONS[self.adamw]
        return torch.optim.AdamW(params, **ADAMW, **(
            adamw_implementation(params) if implementation is None else implementation))


FULL_SHAPE = (4, 256)  # (B, T) of the full run
QUICK_SHAPE = (2, 64)  # --quick: a step in well under a second on 2 cores
CONFIGS = {"gpt2-small": da.preset("gpt2-small"), "llama-gqa": LLAMA_GQA}
SMOKE_STAND_INS = {"gpt2-small": "gpt2-tiny", "llama-gqa": "llama-gqa-tiny"}


def plan_rows(plan: Plan, shape: tuple[int, int] = FULL_SHAPE,
              precisions: tuple[str, ...] = PRECISIONS,
              configs: tuple[str, ...] = tuple(CONFIGS), adamw: str = "train"
              ) -> list[StepRow]:
    """One row per config and precision, config by config (GPT-2 first), at `shape` (--quick:
    QUICK_SHAPE)."""
    shape = QUICK_SHAPE if plan.quick else shape
    if plan.smoke:
        return [StepRow(SMOKE_STAND_INS[c], SMOKE_CONFIGS[SMOKE_STAND_INS[c]], 2, 8, p, adamw)
                for c in configs for p in precisions]
    return [StepRow(c, CONFIGS[c], *shape, p, adamw) for c in configs for p in precisions]


def training_step(model: torch.nn.Module, is_hf: bool, optimizer: torch.optim.Optimizer,
                  ids: torch.Tensor, targets: torch.Tensor, precision: str
                  ) -> Callable[[], None]:
    """One step of either side: forward (autocast in bf16), float32 loss, backward, AdamW. The
    loss is each side's own: ours training's chunked float32 cross-entropy (training/loss.py),
    HF's the float32 upcast of its logits and F.cross_entropy (as its ForCausalLMLoss does)."""
    autocast = (torch.autocast(ids.device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(input_ids=ids, use_cache=False).logits if is_hf else model(ids)
        if is_hf:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # (B*T, V)
        else:
            loss = chunked_cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
    return step


def _batch(row: StepRow) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's fixed random batch: inputs and next-token targets, (B, T) each."""
    gen = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def measure_row(row: StepRow, repeats: int, warmup: int) -> dict[str, Any]:
    ids, targets = _batch(row)  # (B, T) each
    ours, theirs, check = build_pair(row.cfg, ids)
    ours.train()
    theirs.train()
    sides = {}
    for name, model, is_hf in (("ours", ours, False), ("hf", theirs, True)):
        sides[name] = training_step(model, is_hf, row.optimizer(model), ids, targets,
                                    row.precision)
    times_ours, times_hf = time_interleaved(sides["ours"], sides["hf"], max(warmup, 1), repeats)
    n = row.batch * row.seq_len
    ours_s, hf_s = stats(times_ours), stats(times_hf)
    result = {
        "label": row.label, "config": row.config_name, "batch": row.batch, "adamw": row.adamw,
        "seq_len": row.seq_len, "precision": row.precision, "equality": check,
        "ours": {"seconds": ours_s, "tokens_per_s": n / ours_s["median"]},
        "hf": {"seconds": hf_s, "tokens_per_s": n / hf_s["median"]},
        "hf_over_ours": hf_s["median"] / ours_s["median"],
        "hf_over_ours_paired": stats([h / o for o, h in zip(times_ours, times_hf)]),
        "hf_over_ours_best": hf_s["min"] / ours_s["min"],
    }
    del sides, ours, theirs
    gc.collect()
    return result


def measure_speedup(row: StepRow, repeats: int, warmup: int) -> dict[str, Any]:
    """Our fp32 step against our bf16 (autocast) step on the same model, interleaved: fp32 / bf16
    (> 1: autocast is faster), from medians, per pair and best-of."""
    ids, targets = _batch(row)  # (B, T) each
    torch.manual_seed(SEED)
    model = da.Decoder(row.cfg).train()
    steps = {}
    for precision in ("fp32", "bf16"):  # an AdamW each, so neither reads the other's moments
        steps[precision] = training_step(model, False, row.optimizer(model), ids, targets,
                                         precision)
    times_fp32, times_bf16 = time_interleaved(steps["fp32"], steps["bf16"], max(warmup, 1),
                                              repeats)
    fp32, bf16 = stats(times_fp32), stats(times_bf16)
    n = row.batch * row.seq_len
    return {"fp32": fp32, "bf16": bf16, "fp32_tokens_per_s": n / fp32["median"],
            "bf16_tokens_per_s": n / bf16["median"],
            "fp32_over_bf16": fp32["median"] / bf16["median"],
            "fp32_over_bf16_paired": stats([f / b for f, b in zip(times_fp32, times_bf16)]),
            "fp32_over_bf16_best": fp32["min"] / bf16["min"]}


def measure_compiled(row: StepRow, repeats: int, warmup: int) -> dict[str, Any]:
    """Our eager step against our step with torch.compile(model): tokens/s each, eager/compiled
    (> 1: compiling helps), and the seconds of the first compiled step (the compilation)."""
    ids, targets = _batch(row)  # (B, T) each
    torch.manual_seed(SEED)
    eager = da.Decoder(row.cfg).train()
    steps = {}
    for name, model in (("eager", eager), ("compiled", torch.compile(eager))):
        steps[name] = training_step(model, False, row.optimizer(eager), ids, targets,
                                    row.precision)
    start = time.perf_counter()
    try:
        steps["compiled"]()
    except Exception as exc:  # noqa: BLE001  (a machine without a working compiler)
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    compile_s = time.perf_counter() - start
    times_eager, times_compiled = time_interleaved(steps["eager"], steps["compiled"],
                                                   max(warmup, 1), repeats)
    n = row.batch * row.seq_len
    e, c = stats(times_eager), stats(times_compiled)
    return {"compile_seconds": compile_s, "eager_tokens_per_s": n / e["median"],
            "compiled_tokens_per_s": n / c["median"],
            "eager_over_compiled": e["median"] / c["median"],
            "eager": e, "compiled": c}


def measure(plan: Plan, shape: tuple[int, int] = FULL_SHAPE,
            precisions: tuple[str, ...] = PRECISIONS,
            configs: tuple[str, ...] = tuple(CONFIGS), adamw: str = "train"
            ) -> list[dict[str, Any]]:
    """Every training-step row of the run (per config, fp32 and bf16) while the budget lasts,
    each timed `plan.repeats` times per side after at least one untimed step (AdamW allocates
    its state on the first); each bf16 row then our fp32 / bf16 ("speedup" in plan.skip: not);
    then each fp32 row's torch.compile, minutes each on a CPU ("compile" in plan.skip, or
    --quick: not). --quick runs QUICK_SHAPE."""
    measured = []
    rows = plan_rows(plan, shape, precisions, configs, adamw)
    for row in plan.within_budget("training_step", rows):
        r = measure_row(row, plan.repeats, plan.warmup)
        measured.append((row, r))
        plan.say(f"{row.label} training step: ours {r['ours']['tokens_per_s']:.3g} tok/s, HF "
                 f"{r['hf']['tokens_per_s']:.3g} tok/s, HF/ours {r['hf_over_ours']:.2f}")
        if row.precision == "bf16" and "speedup" not in plan.skip:
            r["speedup"] = u = measure_speedup(row, plan.repeats, plan.warmup)
            plan.say(f"{row.label} ours fp32 / ours bf16 {u['fp32_over_bf16']:.2f} (paired "
                     f"{u['fp32_over_bf16_paired']['min']:.2f}-"
                     f"{u['fp32_over_bf16_paired']['max']:.2f})")
        plan.done("training_step", r)
    compiling = [(row, r) for row, r in measured if row.precision == "fp32"
                 and "compile" not in plan.skip and not plan.quick]
    for row, r in plan.within_budget("training_step", compiling,
                                     label=lambda pair: f"{pair[0].label} torch.compile"):
        r["compile"] = c = measure_compiled(row, plan.repeats, plan.warmup)
        plan.done("training_step", r)  # the row again, now with its compile figures
        plan.say(f"{row.label} torch.compile: " + (c.get("error") or (
            f"eager {c['eager_tokens_per_s']:.3g} tok/s, compiled "
            f"{c['compiled_tokens_per_s']:.3g} tok/s (eager/compiled "
            f"{c['eager_over_compiled']:.2f}), compiling {c['compile_seconds']:.0f} s")))
    return [r for _, r in measured]


def section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Training step: forward + backward + AdamW, ours vs Hugging Face",
             "", "| row | ours tok/s | HF tok/s | HF/ours medians (paired min-max) | "
             "HF/ours best | ours / HF median s |", "|---|---|---|---|---|---|"]
    for r in rows:
        o, h, p = r["ours"], r["hf"], r["hf_over_ours_paired"]
        lines.append(
            f"| {r['label']} | {o['tokens_per_s']:.3g} | {h['tokens_per_s']:.3g} | "
            f"{r['hf_over_ours']:.2f} ({p['min']:.2f}-{p['max']:.2f}) | "
            f"{r['hf_over_ours_best']:.2f} | {o['seconds']['median']:.3f} / "
            f"{h['seconds']['median']:.3f} |")
    speedups = [r for r in rows if "speedup" in r]
    if speedups:
        lines += ["", "| ours, same model | fp32 tok/s | bf16 tok/s | fp32/bf16 medians (paired "
                  "min-max) | fp32/bf16 best |", "|---|---|---|---|---|"]
        for r in speedups:
            u, p = r["speedup"], r["speedup"]["fp32_over_bf16_paired"]
            lines.append(f"| {r['label'].replace(' bf16', '')} | "
                         f"{u['fp32_tokens_per_s']:.3g} | {u['bf16_tokens_per_s']:.3g} | "
                         f"{u['fp32_over_bf16']:.2f} ({p['min']:.2f}-{p['max']:.2f}) | "
                         f"{u['fp32_over_bf16_best']:.2f} |")
    lines += [_compile_line(r) for r in rows if "compile" in r]
    worst = max(r["equality"]["max_abs_logit_diff"] for r in rows)
    classes = ", ".join(dict.fromkeys(r["equality"]["hf_class"] for r in rows))
    return lines + [
        "", f"Same weights (`da.to_hf`: {classes}; logits checked equal to {worst:.1e} first), "
        f"HF `{rows[0]['equality']['hf_attention']}` attention, one torch AdamW each (lr 3e-4, "
        f"weight decay 0.1; {rows[0].get('adamw', 'default')} implementation); bf16 = "
        "torch.autocast(bfloat16) around the forward, float32 "
        "weights and loss. HF/ours > 1: ours is faster; fp32/bf16 > 1: autocast is faster.", ""]


def _compile_line(r: dict[str, Any]) -> str:
    c = r["compile"]
    if "error" in c:
        return f"\n`--compile` ({r['label']}): torch.compile failed here: {c['error']}"
    return (f"\n`--compile` ({r['label']}): ours eager {c['eager_tokens_per_s']:.3g} tok/s, "
            f"compiled {c['compiled_tokens_per_s']:.3g} tok/s, eager/compiled "
            f"{c['eager_over_compiled']:.2f} (> 1: compiling helps); the compiling step took "
            f"{c['compile_seconds']:.0f} s.")


def main(argv: list[str] | None = None) -> int:
    """This family alone, at any shape: `python -m benchmarks.training_step --batch 2
    --seq-len 128 --repeats 2 [--configs llama-gqa]` (from the repository root); prints its
    section of benchmark.md and writes the rows, the machine and its fp32 and bf16 matmul
    ceilings to --out (.json, and its section beside it in .md) after every row, merged with the
    rows already there."""
    import argparse
    import os

    from .machine import FamilyFile, machine_info
    from .store import DEFAULT_OUT

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--batch", type=int, default=FULL_SHAPE[0])
    parser.add_argument("--seq-len", type=int, default=FULL_SHAPE[1])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--adamw", choices=list(ADAMW_IMPLEMENTATIONS), default="train",
                        help="torch's AdamW implementation, the same on both sides (train: "
                             "the one decoder-audit train picks, fused where the device has it)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--no-speedup", action="store_true",
                        help="skip our fp32 / bf16 step on the same model")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no row after this many seconds (those left are listed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "training_step.json",
                        help="the results file (default under out/, which git ignores; "
                             "benchmarks/results/training_step.json is the tracked one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = FamilyFile(args.out, machine_info(args.threads), section)
    skip = {"compile"} if args.no_compile else set()
    plan = Plan.standalone(args.threads, args.repeats,
                           frozenset(skip | ({"speedup"} if args.no_speedup else set())),
                           budget=args.budget, on_row=results.add)
    measure(plan, (args.batch, args.seq_len), tuple(args.precisions), tuple(args.configs),
            args.adamw)
    print("\n".join(section(results.finish(plan.skipped)["rows"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
