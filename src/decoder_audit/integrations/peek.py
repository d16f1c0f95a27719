"""The first batches of a trainer's dataloader, taken without moving the run: every random
state put back, the dataloader told its iteration ended."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy
import torch

def first_batches(dataloader: Any, count: int) -> list[Mapping]:
    """The first `count` batches `dataloader` yields (fewer when it has fewer). accelerate's
    DataLoaderShard is told its iteration ended, as when it runs out, so its gradient state
    holds no iteration of ours."""
    batches: list[Mapping] = []
    iterator = iter(dataloader)
    try:
        for _ in range(count):
            batches.append(next(iterator))
    except StopIteration:
        pass
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()
        end = getattr(dataloader, "end", None)
        if callable(end):
            end()
    return batches


@contextmanager
def preserved_random_state(dataloader: Any = None) -> Iterator[None]:
    """Every random state the run draws from, put back on leaving: torch's (CPU and each GPU),
    Python's, NumPy's, and the generators of the dataloader's samplers. The gate draws (the
    dropout of its train-mode probes, the sampler's shuffle when it looks at the first batches),
    and the run must train on the same batches with the same dropout as without it."""
    generators = _sampler_generators(dataloader)
    saved = [g.get_state() for g in generators]
    cpu, python, numpy_state = torch.get_rng_state(), random.getstate(), numpy.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        random.setstate(python)
        numpy.random.set_state(numpy_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for generator, state in zip(generators, saved):
            generator.set_state(state)


def _sampler_generators(dataloader: Any) -> list[torch.Generator]:
    """The torch.Generators a dataloader's samplers draw from (accelerate keeps the sampler
    under batch_sampler.batch_sampler)."""
    found: list[torch.Generator] = []
    for holder in (dataloader, getattr(dataloader, "base_dataloader", None)):
        for name in ("sampler", "batch_sampler"):
            part = getattr(holder, name, None)
            for sampler in (part, getattr(part, "sampler", None),
                            getattr(part, "batch_sampler", None),
                            getattr(getattr(part, "batch_sampler", None), "sampler", None)):
                generator = getattr(sampler, "generator", None)
                if isinstance(generator, torch.Generator) and all(generator is not g
                                                                  for g in found):
                    found.append(generator)
    synced = getattr(dataloader, "synchronized_generator", None)
    if isinstance(synced, torch.Generator) and all(synced is not g for g in found):
        found.append(synced)
    return found
