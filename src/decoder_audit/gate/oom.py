"""Running out of memory is the machine's limit, never the model's defect.

An allocation that fails while the gate runs (the model's own forward, or a check's tensors)
ends the audit as "could not run: out of memory" (`GateOutOfMemory`, a MemoryError: the command
line exits 2 with one line), never as a failed check naming a contract. A failure raised inside
a model call leaves it as `Exhausted`, a BaseException, past the checks' own `except Exception`
(where a model's exception is evidence: a rejected input, a refused path) to the runner.
"""

from __future__ import annotations

import re


class GateOutOfMemory(MemoryError):
    """The machine ran out of memory while the gate ran (`where`: a check or a probe): the audit
    could not run, and nothing about the model was judged. Running out of memory is the
    machine's limit, never the model's defect, so no check is failed for it. `needed` is the
    allocation that failed, in bytes, where the allocator said (None otherwise)."""

    def __init__(self, where: str, cause: BaseException) -> None:
        said = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        found = re.search(r"allocate (\d+) bytes|Tried to allocate ([\d.]+) ([KMGT]i?B)", said)
        self.where, self.cause = where, cause
        self.needed = (int(found.group(1)) if found and found.group(1) else
                       int(float(found.group(2)) * _UNITS[found.group(3)[0]]) if found else None)
        super().__init__(f"could not run: out of memory in {where} ({type(cause).__name__}: "
                         f"{said}); running out of memory is this machine's limit, not the "
                         "model's defect, so nothing was judged: free memory, audit in a 16-bit "
                         "dtype (--dtype bfloat16), or on a machine with more")


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class Exhausted(BaseException):
    """An allocation failure on its way out of a check: a BaseException, so the checks' own
    `except Exception` (where a model's exception is evidence, a rejected input or a refused
    path) lets it through to the runner, which ends the audit with GateOutOfMemory."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is an allocation failure: MemoryError, torch's
    OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError ("can't allocate memory")."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (MemoryError, Exhausted)) or type(exc).__name__ == "OutOfMemoryError" \
                or isinstance(exc, RuntimeError) and _ALLOCATION.search(str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


_ALLOCATION = re.compile(r"can't allocate memory|not enough memory|out of memory|"
                         r"Cannot allocate memory", re.IGNORECASE)
