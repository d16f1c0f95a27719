"""TrainConfig, the Python API's run settings, refuses what the command line refuses: a seed
outside what torch, numpy and Python's random all take ([0, 2^32)), and a number that is NaN or
infinite (NaN compares False with every bound, so `grad_clip=nan` used to pass them all and the
run diverged later). Each refusal is one ConfigError naming the field and the value."""

from __future__ import annotations

import math

import pytest

import decoder_audit as da
from decoder_audit.training.settings import TrainConfig


@pytest.mark.parametrize("field, value", [
    ("seed", -1), ("seed", 2**32), ("seed", 10**23), ("seed", 1.5), ("seed", True),
    ("grad_clip", math.nan), ("grad_clip", math.inf), ("lr", math.nan), ("lr", -math.inf),
    ("weight_decay", math.nan), ("min_lr_ratio", math.nan), ("val_fraction", math.inf),
    ("betas", (0.9, math.nan)), ("grad_clip", "1.0"),
])
def test_a_value_outside_its_range_is_refused_naming_the_field_and_value(field, value):
    with pytest.raises(da.ConfigError) as caught:
        TrainConfig(**{field: value})
    assert f"{field}={value!r}" in str(caught.value)


@pytest.mark.parametrize("field, value", [("seed", 0), ("seed", 2**32 - 1), ("grad_clip", 0.0),
                                          ("lr", None), ("lr", 1e-3), ("betas", (0.0, 0.999))])
def test_the_ends_of_each_range_are_taken(field, value):
    assert getattr(TrainConfig(**{field: value}), field) == value


def test_every_problem_is_named_in_the_one_error():
    """A NaN beside a bad seed: both named, so a user fixes them in one go."""
    with pytest.raises(da.ConfigError) as caught:
        TrainConfig(seed=-5, grad_clip=math.nan, steps=0)
    message = str(caught.value)
    assert "seed=-5" in message and "grad_clip=nan" in message and "steps=0" in message
