"""The generation path and the backward pass: kv_cache, padding, grad_causal (DEFECTS.md H25-H27).

The full forward is proven by the checks before these; serving, sampling and training also take
other paths through the same weights, and that is where decoders break while every full-forward
check passes:
  kv_cache     prefill + cached steps (one token, and chunks) equal the full forward at every
               position, for several prompt lengths (the seeds' prefix equivalence, applied to
               the cache: positions after the prefill, a dropped cache entry, a bottom-right mask);
  padding      a row left-padded by k tokens (mask 0 there, positions from the mask) equals the row
               alone on its real tokens, for several k, also through the cache; right padding
               leaves the real tokens unchanged;
  grad_causal  the gradient of the loss at position t with respect to the per-position input
               (the input embedding's output) is exactly 0 at every later position and nonzero
               at t: a backward that leaks while its forward does not.

kv_cache and padding drive the model exactly as `decoder_audit.generate` does (its `Stepper`, its
positions), so what they prove is what generates. Like every check they run on the model as the
gate borrows it (subject.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..generate import CacheNotReturned, Stepper
from ..objective import logits_of
from . import tolerances
from .result import CheckResult, skipped
from .subject import Subject, batch_not_equal, sample_positions, scaled_excess

# Tokens the cache and padding probes cover (each capped by max_seq_len): a decode step reads
# every weight, so the cost is in calls, not tokens; 16 positions give every schedule below
# several steps.
KV_LEN = 16
PAD_LEN = 12
# Positions t whose loss gradient is taken (rows of one batched backward).
GRAD_LEN = 12
GRAD_ROWS = 6


# ---- kv_cache ----------------------------------------------------------------------------------

def _schedules(seq_len: int) -> list[tuple[str, list[int]]]:
    """Chunk sizes that cover 0..T-1: (description, [prefill, step, step, ...])."""
    if seq_len < 2:
        return []
    half = seq_len // 2
    growing, done, size = [1], 1, 2
    while done < seq_len:
        growing.append(min(size, seq_len - done))
        done, size = done + growing[-1], size + 1
    candidates = [
        (f"prefill {half}, then one token at a time", [half] + [1] * (seq_len - half)),
        ("prefill 1, then chunks of 2, 3, ...", growing),
        (f"prefill {seq_len - 1}, then the last token", [seq_len - 1, 1]),
    ]
    unique, seen = [], set()
    for name, sizes in candidates:
        if tuple(sizes) not in seen:
            seen.add(tuple(sizes))
            unique.append((name, sizes))
    return unique


def _step_kind(sizes: list[int], call: int) -> str:
    if call == 0:
        return f"the prefill of {sizes[0]}"
    past = sum(sizes[:call])
    return (f"a one-token step after {past} cached" if sizes[call] == 1
            else f"a chunk of {sizes[call]} after {past} cached")


def check_kv_cache(s: Subject) -> CheckResult:
    seq_len = s.short_len(KV_LEN)
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(21)).to(s.device)
    tol = tolerances.kv_cache(s.dtype)
    schedules = _schedules(seq_len)
    if not schedules:
        return CheckResult("kv_cache", True, "max_seq_len is 1: no cached step exists",
                           {"seq_len": seq_len}, tol)
    full = s.run(ids)  # (B, T, V)
    records, failures = [], []
    for name, sizes in schedules:
        stepper = Stepper(s.work, s.convention, batch, capacity=seq_len)
        pieces, start = [], 0
        with torch.no_grad():
            for size in sizes:
                chunk = ids[:, start:start + size]
                s.count(chunk)
                try:
                    pieces.append(stepper(chunk))
                except CacheNotReturned as exc:
                    return skipped("kv_cache", f"{exc}: its cache is kept elsewhere (in the "
                                   "module or a caller-owned object), so it cannot be stepped")
                start += size
        cached = torch.cat(pieces, 1)  # (B, T, V)
        worst, allowed = scaled_excess(cached - full, full, tol)
        moved = (cached - full).abs().amax((0, 2))  # (T,)
        bad = [int(t) for t in (~(moved <= allowed)).nonzero().flatten()]
        record = {"schedule": name, "sizes": sizes, "max_abs_diff": worst, "allowed": allowed,
                  "positions_differing": bad}
        records.append(record)
        if bad:
            call = next(i for i, end in enumerate(torch.tensor(sizes).cumsum(0).tolist())
                        if bad[0] < end)
            failures.append(f"{name}: position {bad[0]} ({_step_kind(sizes, call)}) differs from "
                            f"the full forward by up to {worst:.3g} (allowed {allowed:.1e}); "
                            f"{len(bad)} of {seq_len} positions differ")
    evidence = {"seq_len": seq_len, "batch": batch, "dtype": str(s.dtype),
                "convention": s.convention.name, "schedules": records}
    if failures:
        return CheckResult("kv_cache", False, "cached decoding differs from the full forward: "
                           + failures[0], evidence, tol)
    worst = max(r["max_abs_diff"] for r in records)
    return CheckResult("kv_cache", True, f"{len(records)} schedules (prefill lengths "
                       f"{sorted({r['sizes'][0] for r in records})}, one-token steps and chunks) "
                       f"equal the full T={seq_len} forward at every position (max {worst:.1e})",
                       evidence, tol)


# ---- padding -----------------------------------------------------------------------------------

def check_padding(s: Subject) -> CheckResult:
    """Rows left- and right-padded by k random pad ids (mask 0) in one batch, against each real
    prefix run alone; the left-padded rows also through the cache (the path generate takes)."""
    seq_len = s.short_len(PAD_LEN)
    if seq_len < 2:
        return CheckResult("padding", True, "max_seq_len is 1: no room for a pad", {},
                           tolerances.padding(s.dtype))
    gen = s.generator(22)
    x = s.random_ids(1, seq_len, gen)[0]  # (T,)
    pads = sorted({k for k in (1, 2, seq_len // 2, seq_len - 1) if 1 <= k < seq_len})
    # first the row itself with an all-ones mask (and positions 0..T-1 where the model takes
    # them): it must equal the plain run before any pad can be judged
    rows, masks, layout = [x], [torch.ones(seq_len, dtype=torch.long)], [("no", 0)]
    for k in pads:
        real, noise = x[:seq_len - k], s.random_ids(1, k, gen)[0]
        for side, row in (("left", torch.cat([noise, real])), ("right", torch.cat([real, noise]))):
            real_slots = slice(k, None) if side == "left" else slice(0, seq_len - k)
            mask = torch.zeros(seq_len, dtype=torch.long)
            mask[real_slots] = 1  # 1 on the real tokens, 0 on the pads
            rows.append(row)
            masks.append(mask)
            layout.append((side, k))
    records = _PaddingProbe(s, x, torch.stack(rows), torch.stack(masks), layout).run()
    tol = tolerances.padding(s.dtype)
    failures = [r for r in records if not r["max_abs_diff"] <= r["allowed"]]
    evidence = {"seq_len": seq_len, "pads": pads, "dtype": str(s.dtype),
                "convention": s.convention.name, "rows": records}
    if failures:
        r = failures[0]
        conv = s.convention
        if r["pad"] == 0:
            return CheckResult("padding", False, f"{r['how']}: without any pad, an all-ones "
                               "attention_mask (with position_ids 0..T-1 where the model takes "
                               "them) changes the logits by up to "
                               f"{r['max_abs_diff']:.3g} (allowed {r['allowed']:.1e}): the model "
                               "numbers positions otherwise or misreads the mask", evidence, tol)
        why = "the mask is not honoured or pads count as positions"
        if conv.name != "decoder" and not conv.position_ids:
            why += " (the model takes no position_ids)"
        return CheckResult("padding", False, f"{r['how']}: a row {r['side']}-padded by {r['pad']} "
                           "differs from the row alone on its real tokens by up to "
                           f"{r['max_abs_diff']:.3g} (allowed {r['allowed']:.1e}): {why}",
                           evidence, tol)
    cached = (" and through the cache" if any(r["how"].startswith("prefill") for r in records)
              else "")
    return CheckResult("padding", True, f"rows left-padded by k in {pads} (positions from the "
                       f"mask) equal the row alone on their real tokens{cached}; right padding "
                       "leaves them unchanged", evidence, tol)


class _PaddingProbe:
    """The padded batch and the real prefixes alone, run and compared. Non-finite logits on a
    real token fail: a pad query whose every key is masked must not give NaN that reaches the
    real rows through 0 * NaN (DEFECTS.md C14; Hugging Face's eager attention in float64 adds
    finfo(float64).min and runs its softmax in float32, where that is -inf)."""

    def __init__(self, s: Subject, x, ids, mask, layout) -> None:
        self.s, self.x, self.layout = s, x, layout
        self.ids, self.mask = ids.to(s.device), mask.to(s.device)
        self.seq_len = ids.shape[1]

    def run(self) -> list[dict]:
        s, seq_len, layout, model = self.s, self.seq_len, self.layout, self.s.work
        tol = tolerances.padding(s.dtype)
        records = []
        with torch.no_grad():
            alone = {}
            for k in sorted({k for _, k in layout}):  # each real prefix alone (T - k, V)
                prefix = self.x[None, :seq_len - k].to(s.device)
                s.count(prefix)
                alone[k] = logits_of(model(prefix))[0]
            s.count(self.ids)
            padded = Stepper(model, s.convention, len(layout), seq_len,
                             use_cache=False)(self.ids, self.mask)
            for i, (side, k) in enumerate(layout):
                real = padded[i, k:] if side != "right" else padded[i, :seq_len - k]
                records.append(self._judge("one masked forward", side, k, real, alone[k], tol))
            if s.has_cache:
                try:
                    records += self._through_cache(model, alone, tol)
                except CacheNotReturned:  # kv_cache says why; the masked forward was judged
                    pass
        return records

    def _through_cache(self, model, alone, tol) -> list[dict]:
        """The left-padded rows whose prefill holds a real token: prefill all but the last two
        columns (with the mask), then two one-token steps, as generate feeds a padded batch."""
        seq_len = self.seq_len
        picks = [i for i, (side, k) in enumerate(self.layout)
                 if side == "left" and k <= seq_len - 3]
        if not picks:
            return []
        cut = seq_len - 2
        rows, row_mask = self.ids[picks], self.mask[picks]
        stepper = Stepper(model, self.s.convention, len(picks), seq_len)
        self.s.count(rows)
        out = torch.cat([stepper(rows[:, :cut], row_mask[:, :cut]), stepper(rows[:, cut:cut + 1]),
                         stepper(rows[:, cut + 1:])], 1)  # (picks, T, V)
        return [self._judge("prefill + cached steps", "left", self.layout[i][1],
                            out[j, self.layout[i][1]:], alone[self.layout[i][1]], tol)
                for j, i in enumerate(picks)]

    @staticmethod
    def _judge(how: str, side: str, k: int, real: torch.Tensor, want: torch.Tensor,
               tol: float) -> dict:
        worst, allowed = scaled_excess(real - want, want, tol)
        if not torch.isfinite(real).all():
            worst = float("nan")
        return {"how": how, "side": side, "pad": k, "max_abs_diff": worst, "allowed": allowed}



# ---- grad_causal -------------------------------------------------------------------------------

def check_grad_causal(s: Subject) -> CheckResult:
    """One batched backward: row b's loss is the cross-entropy at its own position t_b only,
    so the gradient of row b with respect to the embedding output is d loss_t / d input."""
    seq_len = s.short_len(GRAD_LEN)
    positions = sample_positions(seq_len, GRAD_ROWS)
    gen = s.generator(23)
    ids = s.random_ids(len(positions), seq_len, gen).to(s.device)
    targets = torch.randint(0, s.vocab_size, (len(positions),), generator=gen).to(s.device)
    embedding = s.input_embedding
    captured: list[torch.Tensor] = []

    def capture(module, args, output):
        if captured or not isinstance(output, torch.Tensor) or output.dim() != 3 \
                or not output.is_floating_point():
            return None
        leaf = output.detach().requires_grad_(True)  # (B, T, D): the per-position input
        captured.append(leaf)
        return leaf.clone()  # a non-leaf, so in-place ops downstream stay legal

    handle = embedding.register_forward_hook(capture)
    try:
        with torch.enable_grad():
            s.count(ids)
            logits = logits_of(s.work(ids))  # (B, T, V)
            if not captured or not captured[0].shape[:2] == ids.shape:
                return skipped("grad_causal", f"{type(embedding).__name__} found as the input "
                               "embedding produced no (B, T, D) output in forward")
            rows = logits[torch.arange(len(positions)), torch.tensor(positions)]  # (B, V)
            loss = F.cross_entropy(rows, targets, reduction="sum")
            (grad,) = torch.autograd.grad(loss, captured[0])
    finally:
        handle.remove()
    size = grad.detach().abs().amax(-1).double().cpu().nan_to_num(float("inf"))  # (B, T)
    records, leaks, blind = [], [], []
    for b, t in enumerate(positions):
        later = size[b, t + 1:]
        nonzero = (later > tolerances.GRAD_CAUSAL_FUTURE).nonzero().flatten()
        leaked = [t + 1 + int(i) for i in nonzero]
        record = {"position": t, "grad_at_t": float(size[b, t]),
                  "max_grad_later": float(later.max()) if later.numel() else 0.0,
                  "later_positions_nonzero": leaked}
        records.append(record)
        if leaked:
            leaks.append(record)
        if not size[b, t] > tolerances.GRAD_CAUSAL_SELF:
            blind.append(record)
    evidence = {"seq_len": seq_len, "dtype": str(s.dtype), "embedding": type(embedding).__name__,
                "positions": records}
    if leaks:
        first = leaks[0]
        later = first["later_positions_nonzero"][:8]
        return CheckResult("grad_causal", False, f"the gradient of the loss at position "
                           f"{first['position']} reaches later inputs {later} (max |grad| "
                           f"{first['max_grad_later']:.3g}, must be exactly 0): the backward "
                           "pass reads the future", evidence, tolerances.GRAD_CAUSAL_FUTURE)
    if blind:
        return CheckResult("grad_causal", False, f"the gradient of the loss at position "
                           f"{blind[0]['position']} with respect to the input there is exactly 0: "
                           "the row does not learn from its own token", evidence,
                           tolerances.GRAD_CAUSAL_FUTURE)
    return CheckResult("grad_causal", True, f"losses at positions {positions} of a T={seq_len} "
                       "sequence: gradient exactly 0 at every later input, nonzero at their own",
                       evidence, tolerances.GRAD_CAUSAL_FUTURE)
