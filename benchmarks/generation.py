"""The "generation" family: greedy generation, `da.generate` on our Decoder (static KV cache)
against Hugging Face `generate` on `da.to_hf` of the same weights (its default DynamicCache,
sdpa attention), at GPT-2 small shapes, in float32 or with both models cast to bfloat16
(`.to(torch.bfloat16)`, weights and cache in bf16: what a user does for inference).

Rows: prompts of 16 and 128 tokens, 256 new tokens, batch 1 and batch 8 (8 prompts of different
lengths, left-padded with an attention mask, as both sides batch them). Per row:
  - the outputs are compared first (one untimed full run of each side, which is also the
    warm-up); a difference refuses the row (BenchmarkError) unless it starts at a near-tie of the
    two largest logits (under NEAR_TIE of the logit scale for the dtype: its rounding may pick
    either), which is reported with the step and the gap;
  - total time for max_new_tokens, timed interleaved (`pair.time_interleaved`); tokens/s =
    B * new tokens / median time;
  - time to first token: the same call with max_new_tokens=1 (prefill + one sampling step),
    also interleaved; per-token latency = (total - first) / (new tokens - 1), from medians.
HF/ours > 1 means ours is faster.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import decoder_audit as da
from decoder_audit.generation.convention import left_padded

from .common import SEED, BenchmarkError, Plan, stats
from .pair import hf_fast_attention, time_interleaved
from .rows import SMOKE_CONFIGS

# Two rows' greedy outputs may part at a step whose two largest logits are this close (relative
# to the logit scale): the rounding of two implementations can pick either token there. bf16
# keeps 8 significant bits (a relative step of 2^-8 to 2^-7) and two implementations' logits
# drift apart by a few such steps over the layers, so its ties are wider.
NEAR_TIE = {"float32": 1e-4, "bfloat16": 3e-2}
DTYPES = tuple(NEAR_TIE)
# --quick: new tokens per row (the full run's 256 take minutes a row on 2 cores).
QUICK_NEW_TOKENS = 32


@dataclass(frozen=True)
class GenRow:
    config_name: str
    cfg: da.DecoderConfig
    batch: int
    prompt_len: int  # the longest prompt; batch rows get shorter ones (left-padded)
    new_tokens: int
    dtype: str = "float32"  # both models' weights (and so their caches)

    @property
    def label(self) -> str:
        precision = "" if self.dtype == "float32" else f" {self.dtype}"
        return (f"{self.config_name} B={self.batch} prompt {self.prompt_len} "
                f"+{self.new_tokens} greedy{precision}")

    def prompts(self) -> list[list[int]]:
        """Seeded prompts; with B > 1 their lengths fall from prompt_len to about half of it."""
        gen = torch.Generator().manual_seed(SEED)
        lengths = [self.prompt_len - (i * self.prompt_len) // (2 * self.batch)
                   for i in range(self.batch)]
        return [torch.randint(0, self.cfg.vocab_size, (n,), generator=gen).tolist()
                for n in lengths]


def plan_rows(plan: Plan, dtype: str = "float32", prompts: tuple[int, ...] = (16, 128),
              batches: tuple[int, ...] = (1, 8), new_tokens: int = 256) -> list[GenRow]:
    if plan.smoke:
        cfg = SMOKE_CONFIGS["gpt2-tiny"]
        return [GenRow("gpt2-tiny", cfg, 1, 4, 6, dtype), GenRow("gpt2-tiny", cfg, 3, 8, 6, dtype)]
    gpt2 = da.preset("gpt2-small")
    if plan.quick:  # the first prompt length only, and short rows
        prompts, new_tokens = prompts[:1], min(new_tokens, QUICK_NEW_TOKENS)
    return [GenRow("gpt2-small", gpt2, b, t, new_tokens, dtype) for t in prompts for b in batches]


class _Sides:
    """Our Decoder and its Hugging Face twin, and a greedy call of each on one row's prompts."""

    def __init__(self, row: GenRow) -> None:
        torch.manual_seed(SEED)
        self.row = row
        self.ours = da.Decoder(row.cfg).eval()
        self.hf = da.to_hf(self.ours).eval()  # converted in float32, then both cast alike
        dtype = getattr(torch, row.dtype)
        self.ours, self.hf = self.ours.to(dtype), self.hf.to(dtype)
        self.attention = hf_fast_attention(self.hf)
        self.hf.generation_config.eos_token_id = None  # both run every new token
        self.hf.generation_config.pad_token_id = 0
        self.prompts = row.prompts()
        ids, mask = left_padded(self.prompts)
        self.ids = ids
        self.mask = torch.ones_like(ids) if mask is None else mask.long()

    def ours_new(self, new: int) -> list[list[int]]:
        return da.generate(self.ours, self.prompts, max_new_tokens=new).new_ids

    def hf_new(self, new: int) -> list[list[int]]:
        with torch.no_grad():
            out = self.hf.generate(self.ids, attention_mask=self.mask, max_new_tokens=new,
                                   min_new_tokens=new, do_sample=False)
        return out[:, self.ids.shape[1]:].tolist()

    def compare(self, ours: list[list[int]], theirs: list[list[int]]) -> dict[str, Any]:
        """'identical', or where the first row parts and how close its top two logits were."""
        if ours == theirs:
            return {"outputs": "identical"}
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                step = next(t for t, (x, y) in enumerate(zip(a, b)) if x != y)
                break
        with torch.no_grad():
            logits = self.ours(torch.tensor([self.prompts[i] + a[:step]]))[0, -1]  # (V,)
        top = logits.topk(2).values
        gap = float(top[0] - top[1]) / float(logits.abs().max())
        record = {"outputs": f"row {i} parts at new token {step}", "row": i, "step": step,
                  "relative_top2_gap": gap}
        if not gap < NEAR_TIE[self.row.dtype]:
            raise BenchmarkError(f"{self.row.label}: greedy outputs part at row {i}, token {step} "
                                 f"where the top two logits differ by {gap:.2e} of the scale "
                                 "(not a rounding tie): refusing to time unequal generations")
        return record


def measure_row(row: GenRow, repeats: int) -> dict[str, Any]:
    sides = _Sides(row)  # freed when this returns: the closures below hold it until then
    check = sides.compare(sides.ours_new(row.new_tokens), sides.hf_new(row.new_tokens))
    total_ours, total_hf = time_interleaved(lambda: sides.ours_new(row.new_tokens),
                                            lambda: sides.hf_new(row.new_tokens), 0, repeats)
    first_ours, first_hf = time_interleaved(lambda: sides.ours_new(1), lambda: sides.hf_new(1),
                                            1, max(repeats, 3))
    tokens = row.batch * row.new_tokens

    def figures(total: list[float], first: list[float]) -> dict[str, Any]:
        t, f = stats(total), stats(first)
        return {"seconds": t, "first_token_seconds": f, "tokens_per_s": tokens / t["median"],
                "per_token_ms": (t["median"] - f["median"]) / (row.new_tokens - 1) * 1e3}

    ours, hf = figures(total_ours, first_ours), figures(total_hf, first_hf)
    result = {
        "label": row.label, "config": row.config_name, "batch": row.batch, "dtype": row.dtype,
        "prompt_lengths": [len(p) for p in sides.prompts], "new_tokens": row.new_tokens,
        "hf_attention": sides.attention, "hf_cache": "DynamicCache (generate's default)",
        "equality": check, "ours": ours, "hf": hf,
        "hf_over_ours": hf["seconds"]["median"] / ours["seconds"]["median"],
        "hf_over_ours_paired": stats([h / o for o, h in zip(total_ours, total_hf)]),
        "hf_over_ours_best": hf["seconds"]["min"] / ours["seconds"]["min"],
    }
    return result


def measure(plan: Plan, dtype: str = "float32", prompts: tuple[int, ...] = (16, 128),
            batches: tuple[int, ...] = (1, 8), repeats: int | None = None,
            new_tokens: int = 256
            ) -> list[dict[str, Any]]:
    """Every generation row of the run while the budget lasts (--quick: batch 1 and 8 at the
    first prompt length only, QUICK_NEW_TOKENS new tokens each; the total time is timed
    `repeats` times per side, by default min(plan.repeats, 2): a full row runs for tens of
    seconds)."""
    results = []
    for row in plan.within_budget("generation", plan_rows(plan, dtype, prompts, batches,
                                                         new_tokens)):
        r = measure_row(row, min(plan.repeats, 2) if repeats is None else repeats)
        results.append(r)
        plan.done("generation", r)
        gc.collect()
        plan.say(f"{row.label}: ours {r['ours']['tokens_per_s']:.1f} tok/s, HF "
                 f"{r['hf']['tokens_per_s']:.1f} tok/s, HF/ours {r['hf_over_ours']:.2f}")
    return results


def section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Greedy generation: `da.generate` (static KV cache) vs Hugging Face `generate`",
             "", "| row | prompts | ours tok/s | HF tok/s | HF/ours medians (paired min-max) | "
             "HF/ours best | first token ours / HF ms | per token ours / HF ms | outputs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, h, p = r["ours"], r["hf"], r["hf_over_ours_paired"]
        lengths = r["prompt_lengths"]
        prompts = str(lengths[0]) if len(lengths) == 1 else f"{lengths[-1]}-{lengths[0]} padded"
        lines.append(
            f"| {r['label']} | {prompts} | {o['tokens_per_s']:.1f} | {h['tokens_per_s']:.1f} | "
            f"{r['hf_over_ours']:.2f} ({p['min']:.2f}-{p['max']:.2f}) | "
            f"{r['hf_over_ours_best']:.2f} | {o['first_token_seconds']['median'] * 1e3:.0f} / "
            f"{h['first_token_seconds']['median'] * 1e3:.0f} | {o['per_token_ms']:.1f} / "
            f"{h['per_token_ms']:.1f} | {r['equality']['outputs']} |")
    return lines + [
        "", f"Both sides greedy, eval mode, same weights in "
        f"{', '.join(dict.fromkeys(r.get('dtype', 'float32') for r in rows))}; HF "
        f"`{rows[0]['hf_attention']}` "
        f"attention and {rows[0]['hf_cache']}; first token = the max_new_tokens=1 call (prefill "
        "+ one step); per token = (total - first) / (new tokens - 1).", ""]


def main(argv: list[str] | None = None) -> int:
    """This family alone: `python -m benchmarks.generation --dtype bfloat16 --prompts 16
    --batches 1 8 --repeats 4` (from the repository root); prints its section of benchmark.md
    and writes the rows, the machine and its fp32 and bf16 matmul ceilings to --out (.json, and
    its section beside it in .md) after every row, merged with the rows already there."""
    import argparse
    import os

    from .machine import FamilyFile, machine_info
    from .store import DEFAULT_OUT

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="both models' weights (and caches), cast alike")
    parser.add_argument("--prompts", nargs="+", type=int, default=[16, 128],
                        help="the longest prompt of each row (batch rows get shorter ones)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per row")
    parser.add_argument("--repeats", type=int, default=2, help="timed full runs per side")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no row after this many seconds (those left are listed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "generation.json",
                        help="the results file (default under out/, which git ignores; "
                             "benchmarks/results/generation.json is the tracked one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = FamilyFile(args.out, machine_info(args.threads), section)
    plan = Plan.standalone(args.threads, args.repeats, budget=args.budget, on_row=results.add)
    measure(plan, args.dtype, tuple(args.prompts), tuple(args.batches), args.repeats,
            args.new_tokens)
    print("\n".join(section(results.finish(plan.skipped)["rows"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
