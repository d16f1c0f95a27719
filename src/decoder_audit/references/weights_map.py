"""A user's weights_map (`audit(..., weights_map=fn)`, `--weights-map FILE.py:FN`): a function
from the module's state dict to {canonical name: tensor}, for a layout no table holds. It is
user code, run guarded (`run_weights_map`): an exception, sys.exit or os._exit inside it, or an
in-place edit of the module's parameters, is its failure (`WeightsMapError`), reported, never
the end of the process; what it returns is checked as an argument is
(`WeightsMapReturnError`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

from ..errors import ConfigError

WeightsMap = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
"""A user's mapping: the module's state dict (its names) -> {canonical name: tensor}."""


class WeightsMapError(ConfigError):
    """A weights_map that raised, exited, edited the module's parameters in place, or returned
    something other than {canonical name: tensor}; the message names the map and what it did."""


class WeightsMapReturnError(WeightsMapError):
    """A weights_map that returned something other than {canonical name: tensor} (a list,
    None, a dict holding a non-tensor or a key that is not a name). What a map returns is
    input, checked as an argument is: `audit()` raises this (the command line exits 2 with its
    one line), where what the map does when run (raises, exits, edits the module) is
    evidence, a failing params and oracle."""


class _Exited(BaseException):
    """os._exit called inside a weights_map (a BaseException: the map's own `except Exception`
    does not swallow it)."""


def map_label(weights_map: WeightsMap) -> str:
    """The map as a report names it: its function's name, or a callable object's class."""
    return getattr(weights_map, "__qualname__", type(weights_map).__name__)


def run_weights_map(weights_map: WeightsMap, state: Mapping[str, torch.Tensor],
                    where: str = "") -> dict[str, torch.Tensor]:
    """The map's {canonical name: tensor} for `state`, or WeightsMapError naming the map and
    what it did instead (`where` says what it was given). The map is user code: an exception,
    sys.exit or os._exit inside it, or an in-place edit of the tensors it was given (the
    module's own parameters), is its failure, reported; none of them ends the process or
    decides its exit status."""
    label = f"weights_map {map_label(weights_map)}"
    versions = {name: t._version for name, t in state.items()}
    try:
        with _exit_refused():
            mapped = weights_map(state)
    except _Exited as exc:
        raise WeightsMapError(f"{label} called os._exit({exc.args[0]}){where}: a map returns "
                              "{canonical name: tensor}; the exit was refused, and the gate's "
                              "verdict decides the exit status") from None
    except SystemExit as exc:
        raise WeightsMapError(f"{label} called sys.exit({exc.code!r}){where}: a map returns "
                              "{canonical name: tensor}; the exit was refused, and the gate's "
                              "verdict decides the exit status") from None
    except Exception as exc:  # noqa: BLE001 - the map's failure is its evidence
        raise WeightsMapError(f"{label} raised {type(exc).__name__}{where}: {exc}") from None
    edited = [name for name, t in state.items() if t._version != versions[name]]
    if edited:
        raise WeightsMapError(f"{label} changed {len(edited)} of the module's parameters in "
                              f"place (first {edited[0]}){where}: a map reads the state dict and "
                              "returns tensors made from it, never writing into it")
    return _tensors_of(label, mapped)


def _tensors_of(label: str, mapped) -> dict[str, torch.Tensor]:
    """A map's output as {canonical name: tensor}, or WeightsMapReturnError naming what it
    is."""
    if not isinstance(mapped, Mapping):
        what = "None (no return statement?)" if mapped is None else \
            f"a {type(mapped).__name__}"
        raise WeightsMapReturnError(f"{label} returned {what}, not a dict "
                                    "{canonical name: tensor}")
    keys = [key for key in mapped if not isinstance(key, str)]
    if keys:
        raise WeightsMapReturnError(f"{label} returned keys that are not names: {keys[:3]!r}")
    bad = [(key, value) for key, value in mapped.items() if not isinstance(value, torch.Tensor)]
    if bad:
        key, value = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise WeightsMapReturnError(
            f"{label} returned a {type(value).__name__} for {key!r}{more}: each value must be a "
            "torch.Tensor computed from the state dict's tensors (a list or a numpy array has "
            "left torch: the gate can neither follow it to the module's parameters nor write "
            "through it)")
    return dict(mapped)


@contextmanager
def _exit_refused() -> Iterator[None]:
    """Within the block, os._exit raises _Exited instead of ending the process at once (it
    cannot be caught otherwise); restored after."""
    real = os._exit

    def refused(status: int = 0) -> None:
        raise _Exited(status)

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real
