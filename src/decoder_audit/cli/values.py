"""The numeric options' values: every integer and float option of every command declares its
range here, and argparse refuses a value outside it before anything runs, in one line naming
the option, the value and the range (exit status 2):

    decoder-audit train: error: argument --seed: 100000000000000000000000 is not an integer
    from 0 to 4294967295 (2^32 - 1: what torch, numpy and Python's random all take as a seed)

What the ranges guard against: an integer the code it reaches cannot hold (torch takes int64
sizes and seeds below 2^64; `--seed 10^23` and `account --batch 10^20` raised "Overflow"), and a
float that is NaN or infinite, or negative where that means nothing (`--grad-clip nan` trained,
then "diverged"). A value inside the range may still be refused by the library for what it
means (a --vocab-size the model does not have); that refusal names the option too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..training.settings import SEED_BOUND, SEED_MAX

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
# torch.set_num_threads takes a C int.
INT32_MAX = (1 << 31) - 1


def integer(low: int = INT64_MIN, high: int = INT64_MAX, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`; `why` says where the bounds come from
    (shown after them)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text} is not an integer from {low} to {high}" + (f" ({why})" if why else ""))
        return value

    parse.range = (low, high)  # read by the tests: every numeric option has one
    return parse


def count(low: int = 1) -> Callable[[str], int]:
    """A size or a number of things: an integer from `low` to 2^63 - 1 (torch's sizes and
    integers are int64)."""
    return integer(low, INT64_MAX, "2^63 - 1: an int64, as torch takes it")


# The one seed type.
seed = integer(0, SEED_MAX, SEED_BOUND)
# An id or label value: any int64 (a tensor's element).
token_value = integer(INT64_MIN, INT64_MAX, "an int64")
# A thread count (torch.set_num_threads takes a C int).
threads = integer(1, INT32_MAX, "2^31 - 1, what torch.set_num_threads takes")


def number(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False, what: str = "") -> Callable[[str], float]:
    """An argparse type: a finite float in the interval from `low` to `high` (open at an end
    where `*_open`); NaN and the infinities are refused whatever the interval."""
    interval = (("(" if low_open else "[") + _end(low) + ", " + _end(high)
                + (")" if high_open or high == math.inf else "]"))

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = (math.isfinite(value) and (value > low if low_open else value >= low)
                  and (value < high if high_open else value <= high))
        if not inside:
            raise argparse.ArgumentTypeError(f"{text} is not a finite number in {interval}"
                                             + (f" ({what})" if what else ""))
        return value

    parse.range = (low, high)
    return parse


def _end(bound: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(bound, f"{bound:g}")


def positive(what: str = "") -> Callable[[str], float]:
    """A finite number > 0."""
    return number(0.0, low_open=True, what=what)


def non_negative(what: str = "") -> Callable[[str], float]:
    """A finite number >= 0."""
    return number(0.0, what=what)


def warmup_warning(args, default_steps: int) -> str | None:
    """What a --warmup longer than the run's steps means, or None: the learning rate rises for
    the whole run and never reaches --lr (at --warmup 10^18 --steps 2 it ends at 2e-18 of it,
    which trained silently). Said, not refused: a short run with a long warmup is a choice some
    make (a smoke test of the loop). A resumed run's settings are its own (checked apart)."""
    if getattr(args, "resume", None) or args.warmup is None:
        return None
    steps = args.steps if args.steps is not None else default_steps
    if args.warmup <= steps:
        return None
    given = f"--steps {steps}" if args.steps is not None else f"{steps} steps by default"
    return (f"--warmup={args.warmup} is longer than the run ({given}): the learning rate rises "
            f"for every step and ends at {steps}/{args.warmup} of the peak --lr")
