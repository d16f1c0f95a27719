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

import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...generation.convention import Convention, Stepper, established, numbered
from ...objective import logits_of
from .. import tolerances
from ..measure import all_finite, sample_positions, scaled_excess
from ..result import CheckResult
from ..subject import Subject, model_failures_carried

# Tokens the padding probes cover (capped by max_seq_len).
PAD_LEN = 12
# Positions t whose loss gradient is taken (rows of one batched backward).
GRAD_LEN = 12
GRAD_ROWS = 6


def probe_convention(s: Subject) -> tuple[Convention, str]:
    """The call convention established by calling the model (a fact, found before the checks:
    `generation.convention.established`), and why its cache cannot be stepped ("" when it can
    or it keeps none)."""
    conv = s.facts.convention
    if conv.name == "decoder" or not (conv.cached or conv.masked) or s.short_len(2) < 2:
        return conv, ""  # ours, nothing to try, or no room for a cached step
    ids = s.random_ids(1, 2, s.generator(20)).to(s.device)
    s.count(ids)
    return established(s.work, conv, ids)


# ---- padding -----------------------------------------------------------------------------------

def check_padding(s: Subject) -> CheckResult:
    """Rows left- and right-padded by k random pad ids (mask 0) in one batch, against each real
    prefix run alone; the left-padded rows also through the cache (the path generate takes)."""
    seq_len = s.short_len(PAD_LEN)
    if seq_len < 2:
        return CheckResult("padding", True, "max_seq_len is 1: no room for a pad", {},
                           s.shape_tolerance())
    gen = s.generator(22)
    x = s.random_ids(1, seq_len, gen)[0]  # (T,)
    pads = sorted({k for k in (1, 2, seq_len // 2, seq_len - 1) if 1 <= k < seq_len})
    # first the row itself with an all-ones mask (and position_ids where the model takes them):
    # it must equal the plain run before any pad can be judged
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
    # position_ids of a padded row start where the model numbers its rows (generate measures
    # it the same way: RoBERTa's family counts from padding_idx + 1)
    if s.convention.position_ids and s.convention.masked:
        s.count(x[None])  # the origin probe's forward
    conv, origin = numbered(s.work, s.convention, x[None].to(s.device),
                            s.probe_ids.pad_token_id)
    probe = _PaddingProbe(s, conv, x, torch.stack(rows), torch.stack(masks), layout)
    records = probe.run()
    tol = probe.tol
    failures = [r for r in records if _failed(r)]
    evidence = {"seq_len": seq_len, "pads": pads, "dtype": str(s.dtype),
                "convention": probe.conv.name, "rows": records,
                "position_origin": origin}
    if failures:
        # Left padding and the cache are how prompts are batched for generation; a row whose
        # real tokens move when pads FOLLOW them (right padding, what a training collator
        # builds), or under a mask of all ones, breaks the training path too.
        training = any(r["how"] == "one masked forward" and r["side"] in ("right", "no")
                       for r in failures)
        return CheckResult("padding", False, _padding_failure(probe, failures[0], origin),
                           evidence, tol,
                           paths=("training", "generation") if training else ("generation",))
    raised = next((r for r in records if "raised" in r), None)
    cached = (" and through the cache" if any(r["how"].startswith("prefill") and "raised" not in r
                                              for r in records) else "")
    if raised is not None:  # raising without pads too: the cache path is kv_cache's to judge
        cached = (f"; through the cache not judged: its prefill and cached steps raise without "
                  f"pads too ({raised['raises_without_pads']}), which kv_cache judges")
    return CheckResult("padding", True, f"rows left-padded by k in {pads} (positions from the "
                       f"mask) equal the row alone on their real tokens{cached}; right padding "
                       "leaves them unchanged", evidence, tol)


def _failed(record: dict) -> bool:
    """A compared record beyond its tolerance, or a raise that only the pads bring about."""
    if "raised" in record:
        return not record["raises_without_pads"]
    return not record["max_abs_diff"] <= record["allowed"]


def _padding_failure(probe: _PaddingProbe, r: dict, origin: int | None) -> str:
    """The message for the first failing record `r`: which path, and what reaches the real
    tokens (measured: a second filling of the pads tells read pads from counted ones)."""
    conv, seq_len = probe.conv, probe.seq_len
    head = f"{r['how']}: "
    if "raised" in r:
        return (head + f"the left-padded rows raised {r['raised']}, while the same prefill and "
                "cached steps of the row without pads run: the "
                "model's cache path breaks on a padded batch (the path generate takes for a "
                "batch of prompts); its one masked forward was measured")
    if r["pad"] == 0:
        given = "" if not conv.position_ids else (
            f" (with position_ids {origin}..{origin + seq_len - 1}, which reproduce its own "
            "numbering without a mask)" if origin is not None else
            f" (with position_ids 0..{seq_len - 1}: no first position tried, 0 or "
            "padding_idx + 1 where it declares a padding id, reproduces its own numbering)")
        return (head + f"without any pad, an all-ones attention_mask{given} changes the logits "
                f"by up to {r['max_abs_diff']:.3g} (allowed {r['allowed']:.1e}): the model "
                "numbers positions otherwise or misreads the mask")
    head += (f"a row {r['side']}-padded by {r['pad']} differs from the row alone on its real "
             f"tokens by up to {r['max_abs_diff']:.3g} (allowed {r['allowed']:.1e}): ")
    if r["how"] != "one masked forward":  # every row of the masked forward was right
        return head + ("the same row in one masked forward is right, so the path through the "
                       "cache mishandles the pads: the prefill leaves in the cache what the "
                       "mask hid, or the cached steps count the pads as positions (from the "
                       "cache length)")
    if probe.pads_read(r["side"], r["pad"]):
        return head + ("the pads' content reaches the real tokens (another filling of the pads "
                       "changes them): some layer reads the pads despite the mask (an "
                       "attention that ignores it, or a convolution or recurrence it does not "
                       "reach)")
    if r["side"] == "right":  # the pads follow the real tokens: a causal row cannot see them
        return head + ("the pads' content does not matter but their number does: the real "
                       "tokens depend on how many tokens follow them")
    why = ("the pads' content does not matter but their number does: the mask is honoured and "
           "pads count as positions")
    if conv.name != "decoder" and not conv.position_ids:
        why += " (the model takes no position_ids)"
    return head + why


class _PaddingProbe:
    """The padded batch and the real prefixes alone, run and compared. Non-finite logits on a
    real token fail: a pad query whose every key is masked must not give NaN that reaches the
    real rows through 0 * NaN (DEFECTS.md C14; Hugging Face's eager attention in float64 adds
    finfo(float64).min and runs its softmax in float32, where that is -inf)."""

    def __init__(self, s: Subject, conv: Convention, x, ids, mask, layout) -> None:
        self.s, self.conv, self.x, self.layout = s, conv, x, layout
        self.ids, self.mask = ids.to(s.device), mask.to(s.device)
        self.seq_len = ids.shape[1]
        self.tol = s.shape_tolerance()

    def run(self) -> list[dict]:
        s, seq_len, layout, model, tol = self.s, self.seq_len, self.layout, self.s.work, self.tol
        records = []
        with torch.no_grad():
            alone = {}
            for k in sorted({k for _, k in layout}):  # each real prefix alone (T - k, V)
                prefix = self.x[None, :seq_len - k].to(s.device)
                s.count(prefix)
                # called as the masked batch is (use_cache=False where it takes it), only the
                # mask and pads differing: a model whose logits move with use_cache (Dory) is
                # not a padding defect; the cached rows are held to the plain call instead
                alone[k] = Stepper(model, self.conv, 1, seq_len - k, use_cache=False)(prefix)[0]
            s.count(self.ids)
            padded = Stepper(model, self.conv, len(layout), seq_len,
                             use_cache=False)(self.ids, self.mask)  # (rows, T, V)
            for i, (side, k) in enumerate(layout):
                real = padded[i, k:] if side != "right" else padded[i, :seq_len - k]
                records.append(self._judge("one masked forward", side, k, real, alone[k], tol))
            if s.has_cache:  # the facts say its cache can be stepped
                records += self._cached_or_raised(model, alone, tol)
        return records

    def _cached_or_raised(self, model, alone, tol) -> list[dict]:
        """`_through_cache`, or where the model raises on it, one record of the raise: a
        failure when the same cached steps run without pads (the padded batch breaks them),
        not judged when they raise without pads too (the cache path itself, which kv_cache
        judges). Either way the masked forward's records stand."""
        try:
            with model_failures_carried(self.s):
                return self._through_cache(model, alone, tol)
        except Exception as exc:  # noqa: BLE001 - the model raised: evidence, not a crash
            said = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        unpadded = self._unpadded_cache_error()
        return [{"how": "prefill + cached steps", "side": "left", "pad": self.layout[1][1],
                 "max_abs_diff": None, "allowed": None, "raised": said,
                 "raises_without_pads": unpadded}]

    def _unpadded_cache_error(self) -> str:
        """What the cached steps `_through_cache` takes raise on the row without pads (its
        mask all ones), "" when they run."""
        cut, row = self.seq_len - 2, self.x[None].to(self.s.device)  # (1, T)
        stepper = Stepper(self.s.work, self.conv, 1, self.seq_len)
        self.s.count(row)
        try:
            with model_failures_carried(self.s):
                stepper(row[:, :cut], torch.ones_like(row[:, :cut]))
                stepper(row[:, cut:cut + 1])
                stepper(row[:, cut + 1:])
        except Exception as exc:  # noqa: BLE001 - the model's own error
            return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        return ""

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
        stepper = Stepper(model, self.conv, len(picks), seq_len)
        self.s.count(rows)
        out = torch.cat([stepper(rows[:, :cut], row_mask[:, :cut]), stepper(rows[:, cut:cut + 1]),
                         stepper(rows[:, cut + 1:])], 1)  # (picks, T, V)
        if self.conv.name == "hugging face":  # cached calls keep the plain call's use_cache
            alone = {}
            for k in {self.layout[i][1] for i in picks}:
                prefix = self.x[None, :seq_len - k].to(self.s.device)
                self.s.count(prefix)
                alone[k] = logits_of(model(prefix))[0]
        return [self._judge("prefill + cached steps", "left", self.layout[i][1],
                            out[j, self.layout[i][1]:], alone[self.layout[i][1]], tol)
                for j, i in enumerate(picks)]

    def pads_read(self, side: str, k: int) -> bool:
        """Whether the real tokens of the row padded by k on `side` change when only its pads'
        ids change (both fillings in one masked batch, so nothing else differs)."""
        i = self.layout.index((side, k))
        row, mask = self.ids[i], self.mask[i]
        slots = (mask == 0).nonzero().flatten()
        other = row.clone()
        other[slots] = self.s.other_ids(row[slots][None].cpu(), self.s.generator(24))[0].to(
            row.device)
        both = torch.stack([row, other])  # (2, T)
        self.s.count(both)
        with torch.no_grad():
            out = Stepper(self.s.work, self.conv, 2, self.seq_len,
                          use_cache=False)(both, mask.expand(2, -1))  # (2, T, V)
        real = mask.bool()
        worst, allowed = scaled_excess(out[0, real] - out[1, real], out[0, real], self.tol)
        return not worst <= allowed

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
    grad = _input_gradient(s, ids, positions, targets)
    if not all_finite(grad):  # NaN reaches every input: no position can be judged
        rows = sorted({int(t) for t in (~torch.isfinite(grad)).any(-1).nonzero()[:, 1]})
        return CheckResult("grad_causal", False, f"d loss / d input holds NaN or inf at "
                           f"positions {rows[:8]}: the forward or backward overflowed (dtype "
                           f"{str(s.dtype).removeprefix('torch.')}), so nothing was judged and "
                           "nothing is called a leak", {"seq_len": seq_len,
                                                        "dtype": str(s.dtype),
                                                        "non_finite_positions": rows})
    size = grad.detach().abs().amax(-1).double().cpu()  # (B, T)
    records = []
    for b, t in enumerate(positions):
        later = size[b, t + 1:]
        nonzero = (later > tolerances.GRAD_CAUSAL_FUTURE).nonzero().flatten()
        records.append({"position": t, "grad_at_t": float(size[b, t]),
                        "max_grad_later": float(later.max()) if later.numel() else 0.0,
                        "later_positions_nonzero": [t + 1 + int(i) for i in nonzero]})
    evidence = {"seq_len": seq_len, "dtype": str(s.dtype),
                "embedding": type(s.input_embedding).__name__, "positions": records}
    return _grad_verdict(records, positions, seq_len, evidence)


class _NoInputGradient(Exception):
    """d loss / d input cannot be taken on this model; the message says why."""


def probe_input_gradient(s: Subject) -> tuple[str, str]:
    """(why d loss / d input cannot be taken, why no backward runs through the model on this
    device), each "" when it can: facts, found before the checks by one backward of two
    tokens. A backend with no backward on this device (flex attention on CPU) raises
    NotImplementedError as soon as its input requires grad, where the same forward runs without
    gradients: every check that takes a gradient is then skipped with that reason."""
    seq_len = s.short_len(2)
    ids = s.random_ids(1, seq_len, s.generator(25)).to(s.device)
    targets = torch.zeros(1, dtype=torch.long, device=s.device)
    try:
        _input_gradient(s, ids, [seq_len - 1], targets)
    except _NoInputGradient as why:
        return str(why), ""
    except NotImplementedError as exc:
        return "", _no_backward(s, ids, exc)
    except Exception:  # noqa: BLE001 - any other failure is the model's: the check shows it
        return "", ""
    return "", ""


def _no_backward(s: Subject, ids: torch.Tensor, exc: NotImplementedError) -> str:
    """Why no backward runs on this device, when the forward that raised `exc` with gradients
    runs without them; "" (the checks then show the model's failure) when it does not."""
    try:
        s.run(ids)
    except Exception:  # noqa: BLE001 - the forward itself fails: not a missing backward
        return ""
    said = (str(exc).strip().splitlines() or [""])[0][:200]
    return (f"no backward on {s.device.type}: the forward runs, but with gradients it raises "
            f"{type(exc).__name__} ({said}), a backend with no backward on this device; audit "
            "on a device that has one to check the gradients")


def _input_gradient(s: Subject, ids: torch.Tensor, positions: list[int],
                    targets: torch.Tensor, run: Callable[[torch.Tensor], Any] | None = None
                    ) -> torch.Tensor:
    """d (sum over rows b of the loss at position t_b) / d (the input embedding's output),
    (B, T, D); _NoInputGradient when it cannot be taken (see `_refuses_eval_backward`)."""
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
            logits = logits_of((run or s.forward)(ids))  # (B, T, V)
            if not captured or not captured[0].shape[:2] == ids.shape:
                raise _NoInputGradient(f"{type(embedding).__name__} found as the input embedding "
                                       "produced no (B, T, D) output in forward")
            rows = logits[torch.arange(len(positions)), torch.tensor(positions)]  # (B, V)
            loss = F.cross_entropy(rows, targets, reduction="sum")
            try:
                (grad,) = torch.autograd.grad(loss, captured[0])
            except Exception as exc:  # noqa: BLE001 - only the refusal below is excused
                if not _refuses_eval_backward(exc):
                    raise  # any other failure of the backward is the model's, and fails
                said = (str(exc).strip().splitlines() or [""])[0][:200]
                raise _NoInputGradient("the model refuses a backward pass in eval mode (its "
                                       f"backward raised {type(exc).__name__}: {said})") from None
    finally:
        handle.remove()
    return grad


# What a model's backward says when it refuses to run outside training mode (a reversible
# network recomputes its activations in backward and insists on model.train()).
_WANTS_TRAIN_MODE = re.compile(r"\.train\(\)|train(ing)? mode", re.IGNORECASE)


def _refuses_eval_backward(exc: BaseException) -> bool:
    """Whether the backward's exception is the model declining eval mode, in its own words.

    The gate audits the model in eval mode, and it does not retry in train mode: that switches
    on dropout (often functional, keyed on `self.training`, so it cannot be turned off from
    outside), updates running statistics (the user's model would come back changed) and makes
    each forward random, so "exactly 0 at every later input" would be judged on another
    function. So the check is skipped with the model's reason (the facts' probe finds it). Only
    an exception whose message asks for training mode counts: any other exception raised by
    the backward (an in-place write autograd rejects, a shape error) is a defect of the backward
    and still fails."""
    return _WANTS_TRAIN_MODE.search(str(exc)) is not None


def _grad_verdict(records: list[dict], positions: list[int], seq_len: int,
                  evidence: dict) -> CheckResult:
    leaks = [r for r in records if r["later_positions_nonzero"]]
    blind = [r for r in records if not r["grad_at_t"] > tolerances.GRAD_CAUSAL_SELF]
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
