"""`ModelState`: what a model holds besides its weights, taken when the audit borrows the model and
put back before every fresh call, after every probe and check, and when the model is given back.

A module's forward may change the module: a position counter (`self.current_pos += T`, as
LLMs-from-scratch's kv-cache GPT-2 does), a cache kept in buffers (`self.cache_k = torch.cat(...)`,
or written in place as litgpt's preallocated buffers are), running statistics (batch norm in
train mode), a lazily built rotary table. The gate calls the model hundreds of times, in
probes the user never makes (a cached step, train mode): left in place, such a change is the
gate's damage, and every later check would judge another function than the one it was given
(the cache probe left the kv-cache GPT-2 at current_pos 1, and six checks then raised
IndexError). So the state is taken once and put back; where the model's answers to identical
calls drift with its own state, `determinism` says so under its own name (invariance.py).

What is held, per module (and per object one level below a module: a config, a cache holder):
  - every entry of its `__dict__` (plain attributes: ints, lists, tensors, the train flag) and
    of its `_buffers`, `_parameters` and `_modules` tables, by identity: a reassigned entry is
    put back, an added one removed;
  - a list, dict or set held there: a shallow copy, put back in place (the same object);
  - a tensor held there (a buffer, a tensor attribute, one inside such a container): its
    version counter, which every in-place write bumps, and a copy while the copies stay within
    COPY_BUDGET (smallest first: counters, masks, rotary tables, small caches); a bigger one
    written in place is named as not restored (`restore` returns it), never copied;
  - the parameters: never copied (the weights are the audit's subject, the memory bound is
    1.5x their size; a check that writes stress weights puts them back bit for bit); their
    identity and data pointer are held, so a storage swapped under a weight is named;
  - the hooks registered on each module: what the model registers on itself when called is
    removed after the probe or check that called it (the gate removes its own).
Before each of a check's fresh calls what the model changed is put back (Subject.run); what it
added (a lazily built table, a flag beside hooks it installed) stays until the check ends.
"""

from __future__ import annotations

import functools
import random
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..references.layouts import PLACED_BUFFERS

# Entries of a module's __dict__ that are torch's own bookkeeping (hooks and the tables held
# apart below), not the model's state.
# The train flags are not held here: a check sets them for its calls (train mode), and the
# Subject puts them back after it.
_TORCH_KEYS = frozenset(vars(nn.Module()))
_HOOK_KEYS = tuple(sorted(k for k in _TORCH_KEYS if "hooks" in k))
_TABLES = ("_buffers", "_parameters", "_modules")
# Tensors copied to be put back: at least this many bytes, or this share of the weights.
COPY_BUDGET_MIN = 64 * 2**20
COPY_BUDGET_SHARE = 0.05
_CONTAINERS = (list, dict, set)
_NOT_STATE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              types.ModuleType, functools.partial)
_ATOMIC = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset, range)


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except (RuntimeError, AttributeError):  # an inference tensor keeps no version counter
        return None


@dataclass
class _Tensor:
    """A tensor held by the model: its version when taken, and its copy when one was made."""

    tensor: torch.Tensor
    where: str
    version: int | None
    copy: torch.Tensor | None = None
    pointer: int | None = None  # parameters: their data pointer (a `.data =` swap keeps the object)


@dataclass
class _Table:
    """One dict of the model (a module's __dict__ or one of its tables, an object's __dict__) as
    taken: its entries by identity, and a shallow copy of each container among them. `owner`
    names it in messages ("GPTModel", "trf_blocks.0.att")."""

    owner: str
    table: dict
    entries: dict
    containers: dict = field(default_factory=dict)  # key -> (container, shallow copy)

    def __post_init__(self) -> None:
        # the whole table's keys and the identities of its values, for a fast "unchanged" (a
        # value held here stays alive, so its id is never reused)
        self.keys, self.ids = tuple(self.table), [*map(id, self.table.values())]

    def unchanged(self) -> bool:
        return tuple(self.table) == self.keys and [*map(id, self.table.values())] == self.ids


class ModelState:
    """The model's state as taken (see the module docstring); `restore()` puts it back and names
    what it could not, `changes()` names what differs now without touching anything."""

    def __init__(self, model: nn.Module, *, keep_parameters: bool = True) -> None:
        self.tables: list[_Table] = []
        self.tensors: dict[int, _Tensor] = {}
        self.generators: list[tuple[torch.Generator, torch.Tensor]] = []
        self.hooks: list[_Table] = []
        seen: set[int] = set()
        for prefix, module in model.named_modules():
            owner = prefix or type(model).__name__
            own = {k: v for k, v in vars(module).items() if k not in _TORCH_KEYS}
            self._hold(owner, vars(module), own, seen, deeper=True)
            for table in _TABLES:
                if table == "_parameters" and not keep_parameters:
                    continue  # FSDP2 swaps a sharded model's parameters in and out itself
                if not getattr(module, table):
                    continue  # a forward that adds a buffer or module adds it to __dict__
                self._hold(owner, getattr(module, table), dict(getattr(module, table)), seen,
                           deeper=table == "_buffers", weights=table == "_buffers")
            # hooks the model registers on itself when called (transformers installs its
            # output-capturing hooks on the first output_attentions call, and marks them with
            # an attribute): put back with that attribute, after a probe or check only (the
            # gate's own hooks are in place during a check, and removed by it)
            self.hooks += [_Table(owner, hooks, dict(hooks)) for key in _HOOK_KEYS
                           if isinstance(hooks := vars(module).get(key), dict)]
        self.parameters = [_Tensor(p, name, None, None, _pointer(p))
                           for name, p in model.named_parameters()]
        weights = sum(p.tensor.numel() * p.tensor.element_size() for p in self.parameters)
        self._copy_within(max(COPY_BUDGET_MIN, int(COPY_BUDGET_SHARE * weights)))

    def _hold(self, owner: str, table: dict, entries: dict, seen: set[int], *,
              deeper: bool, weights: bool = False) -> None:
        """Hold `table` (its `entries`), the containers and tensors in it, and (`deeper`) one
        level of the plain objects it holds. In a buffer table (`weights`), a buffer that holds
        a weight (PLACED_BUFFERS: DeepSeek-V3's selection bias) is held as the parameters are:
        its entry, never its values, which the stress weights write and put back themselves."""
        held = _Table(owner, table, entries)
        self.tables.append(held)
        for key, value in entries.items():
            where = f"{owner}.{key}"
            if isinstance(value, nn.Parameter) or isinstance(value, nn.Module):
                continue  # parameters are held below; modules are walked by named_modules
            if weights and key in PLACED_BUFFERS:
                continue
            if isinstance(value, torch.Tensor):
                self._hold_tensor(value, where)
            elif isinstance(value, torch.Generator):
                self.generators.append((value, value.get_state()))
            elif isinstance(value, _CONTAINERS):
                held.containers[key] = (value, _shallow(value))
                for item in list(value.values() if isinstance(value, dict) else value):
                    if isinstance(item, torch.Tensor) and not isinstance(item, nn.Parameter):
                        self._hold_tensor(item, f"{where}[...]")
            elif deeper and _plain_object(value) and id(value) not in seen:
                seen.add(id(value))  # one level below the module: a config, a cache holder
                self._hold(where, vars(value), dict(vars(value)), seen, deeper=False)

    def _hold_tensor(self, tensor: torch.Tensor, where: str) -> None:
        self.tensors.setdefault(id(tensor), _Tensor(tensor, where, _version(tensor)))

    def _copy_within(self, budget: int) -> None:
        """Copies of the held tensors, smallest first, while their bytes stay within budget."""
        for held in sorted(self.tensors.values(), key=lambda t: t.tensor.numel()):
            size = held.tensor.numel() * held.tensor.element_size()
            if held.version is None or size > budget or held.tensor.is_meta:
                continue
            budget -= size
            held.copy = held.tensor.detach().clone()

    # ---- putting it back -------------------------------------------------------------------
    def restore(self, *, full: bool = True) -> list[str]:
        """Put every table, container and copied tensor back as taken; return what could not be
        (a tensor too large to copy written in place, a weight whose storage was swapped).
        `full=False`, before each of a check's calls: what the model changed is put back, but
        what it added (a lazily built table, a flag) stays and its hooks are not looked at,
        until the check ends (`full`): within a check the gate's own hooks are in place."""
        for held in self.tables:
            _restore_table(held, full)
        for held in self.hooks if full else ():
            _restore_table(held, full)
        for generator, state in self.generators:
            generator.set_state(state)
        lost = []
        with torch.no_grad():
            for held in self.tensors.values():
                if held.version is None or _version(held.tensor) == held.version:
                    continue
                if held.copy is None or held.copy.shape != held.tensor.shape:
                    lost.append(f"{held.where} {_size(held.tensor)} (written in place; too large "
                                "to copy, so not put back)")
                    held.version = _version(held.tensor)  # said once
                    continue
                held.tensor.copy_(held.copy)
                held.version = _version(held.tensor)
        # the weights' values are the gate's to keep (a check that writes stress weights puts
        # them back bit for bit): only a swapped storage (`param.data = ...`) is looked for
        for param in self.parameters if full else ():
            if _pointer(param.tensor) != param.pointer:
                lost.append(f"the weight {param.where} (its storage was replaced by the model's "
                            "own forward: weights are never copied)")
                param.pointer = _pointer(param.tensor)
        return lost

    def changes(self, *, additions: bool = True) -> list[str]:
        """What differs from the state as taken, one line each (e.g. "GPTModel.current_pos: 0 ->
        12"), without putting anything back; `additions=False` leaves out entries added since
        (a lazily built cache, a flag) and the hooks."""
        found = []
        for held in self.tables + (self.hooks if additions else []):
            found += _table_changes(held, additions)
        found += [f"{t.where} (written in place)" for t in self.tensors.values()
                  if t.version is not None and _version(t.tensor) != t.version]
        return found


def _restore_table(held: _Table, full: bool) -> None:
    table, entries = held.table, held.entries
    if not held.unchanged():
        for key in [k for k in table if full and k not in entries and k not in _TORCH_KEYS]:
            del table[key]
        for key, value in entries.items():
            if table.get(key, _MISSING) is not value:
                table[key] = value
    for container, copy in held.containers.values():
        if not _same_items(container, copy):
            _put_back(container, copy)


def _table_changes(held: _Table, additions: bool) -> list[str]:
    found = []
    table, entries = held.table, held.entries
    for key in table if additions else ():
        if key not in entries and key not in _TORCH_KEYS:
            found.append(f"{held.owner}.{key}: added")
    for key, value in entries.items():
        now = table.get(key, _MISSING)
        if now is not value and not _equal_atoms(now, value):
            found.append(f"{held.owner}.{key}: {_brief(value)} -> {_brief(now)}")
    for key, (container, copy) in held.containers.items():
        if table.get(key) is container and not _same_items(container, copy):
            found.append(f"{held.owner}.{key}: {type(container).__name__} changed in place")
    return found


_MISSING = object()


def _equal_atoms(a, b) -> bool:
    """Two immutable values that are equal (an int reassigned to the same number)."""
    try:
        return isinstance(a, _ATOMIC) and type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a tuple of tensors compares elementwise: not equal
        return False


def _shallow(container):
    return dict(container) if isinstance(container, dict) else type(container)(container) \
        if isinstance(container, set) else list(container)


def _same_items(container, copy) -> bool:
    if len(container) != len(copy):
        return False
    if isinstance(container, dict):
        return all(container.get(k, _MISSING) is v for k, v in copy.items())
    if isinstance(container, set):
        return container == copy
    return all(a is b for a, b in zip(container, copy))


def _put_back(container, copy) -> None:
    if isinstance(container, list):
        container[:] = copy
    else:
        container.clear()
        container.update(copy)


def _plain_object(value) -> bool:
    """An object of the model's own kind (a config, a cache holder): not a class, a function, a
    method or a Python module, and with a __dict__ of its own."""
    if isinstance(value, _NOT_STATE) or type(value).__module__ in ("builtins", "functools"):
        return False
    try:
        return isinstance(vars(value), dict)
    except TypeError:
        return False


def _pointer(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.data_ptr()
    except (RuntimeError, NotImplementedError):  # a DTensor, a meta tensor
        return None


def _size(tensor: torch.Tensor) -> str:
    return f"({', '.join(map(str, tensor.shape))}), {tensor.numel() * tensor.element_size() / 2**20:.1f} MiB"


def _brief(value) -> str:
    if value is _MISSING:
        return "absent"
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__}(...)"


# ---- the process's settings ---------------------------------------------------------------
def _deterministic() -> tuple[bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


# The process-wide settings a forward can change for everything that runs after it, as (name,
# read, write): the dtype of every tensor made without one, which kernels may run (and whether
# a nondeterministic one raises), the intra-op threads (speed, and the order float sums are
# taken in), autograd's anomaly mode (every backward traced and slowed), float32 matmul
# precision (TF32 on GPUs).
SETTINGS = (
    ("torch.set_default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("torch.use_deterministic_algorithms (mode, warn_only)", _deterministic,
     lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    ("torch.set_num_threads", torch.get_num_threads, torch.set_num_threads),
    ("torch.autograd.set_detect_anomaly (mode, check_nan)", _anomaly,
     lambda v: torch.autograd.set_detect_anomaly(v[0], check_nan=v[1])),
    ("torch.set_float32_matmul_precision", torch.get_float32_matmul_precision,
     torch.set_float32_matmul_precision),
)


class ProcessSettings:
    """The process-wide SETTINGS as taken; `restore()` puts back each one that differs and says
    which, `changes()` says which differ without touching them."""

    def __init__(self) -> None:
        self.taken = [read() for _, read, _ in SETTINGS]

    def changes(self) -> list[str]:
        return [f"{name}: {_shown(then)} -> {_shown(read())}"
                for (name, read, _), then in zip(SETTINGS, self.taken) if read() != then]

    def restore(self) -> list[str]:
        changed = self.changes()
        for (_, read, write), then in zip(SETTINGS, self.taken):
            if read() != then:
                write(then)
        return changed


def _shown(value) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else repr(value)


@contextmanager
def host_rngs_kept() -> Iterator[None]:
    """Within the block, Python's `random` and (where it is imported) numpy's global RNG may be
    drawn from; afterwards both are as they were (torch's own streams the runner forks)."""
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


def seed_host_rngs(seed: int) -> None:
    """torch's global RNG, Python's `random` and (where imported) numpy's, all seeded."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
