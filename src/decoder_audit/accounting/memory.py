"""Will it fit? The bytes a config's weights need, against the memory this machine has, checked
before a single weight is allocated.

A config with V = 10^9 would otherwise die inside `torch.empty` with an allocator traceback (or
be killed by the kernel with no message at all). `ledger` and `account` answer on the meta
device; `check_fits` answers the same question for the commands that allocate, from the analytic
parameter count (`parameter_ledger`), so nothing is built to find out.

Available memory: on the CPU the kernel's MemAvailable, lowered to the cgroup's limit less its
usage when the process runs in a container; on a GPU what `torch.cuda.mem_get_info` reports free.
When neither can be read the check passes (it only refuses what cannot possibly fit).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DecoderConfig
from ..errors import ConfigError
from .ledger import parameter_ledger

# cgroup v2, then v1: (limit file, usage file).
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_bytes(device: str | torch.device = "cpu") -> int | None:
    """Bytes that can still be allocated on `device`, or None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found = [value for value in (_meminfo_available(), _cgroup_available()) if value is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit_text = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 1 << 60:  # no limit set
            return None
        return max(int(limit_text) - usage, 0)
    return None


def weight_bytes(cfg: DecoderConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the unique weights of a Decoder with this config (a tied readout once)."""
    return parameter_ledger(cfg).total * torch.empty((), dtype=dtype).element_size()


def check_fits(cfg: DecoderConfig, *, copies: float = 1.0, what: str = "its weights",
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               available: int | None = None) -> None:
    """ConfigError when `copies` times the weights (in `dtype`) exceed the memory available on
    `device`; `what` names what the copies are for. Nothing is allocated."""
    params = parameter_ledger(cfg).total
    need = int(weight_bytes(cfg, dtype) * copies)
    have = _short_of(need, device, available)
    if have is None:
        return
    raise ConfigError(
        f"the model does not fit in memory: {what} need {_gb(need)} ({params:,} parameters x "
        f"{torch.empty((), dtype=dtype).element_size()} bytes"
        + (f" x {copies:g}" if copies != 1 else "")
        + f"), but only {_gb(have)} is available on {torch.device(device).type}; nothing was "
        f"allocated (vocab_size={cfg.vocab_size}, d_model={cfg.d_model}, "
        f"n_layers={cfg.n_layers}; `decoder-audit account` sizes a config without building it)")


def check_logits_fit(rows: int, seq_len: int, vocab_size: int, *, element_bytes: int,
                     device: str | torch.device = "cpu", available: int | None = None,
                     what: str = "") -> None:
    """ConfigError when one forward's logits alone, rows x seq_len x vocab_size values of
    `element_bytes`, exceed the memory available on `device`: a floor of what any step of that
    batch takes (whatever the model's blocks, checkpointing or sharding), so a batch refused
    here could never run, and one that passes may still be cut by the gate's own fit. `what`
    names the setting that chose the rows. Nothing is allocated."""
    need = rows * seq_len * vocab_size * element_bytes
    have = _short_of(need, device, available)
    if have is None:
        return
    raise ConfigError(
        f"{what}: one forward's logits alone are {rows:,} rows x {seq_len:,} tokens x "
        f"{vocab_size:,} values x {element_bytes} bytes = {_gb(need)}, but only {_gb(have)} is "
        f"available on {torch.device(device).type}; nothing was allocated")


def _short_of(need: int, device: str | torch.device, available: int | None) -> int | None:
    """The bytes available on `device` (or `available`) where `need` exceeds them; None where
    it fits, or where the memory cannot be read (only what cannot possibly fit is refused)."""
    have = available_bytes(device) if available is None else available
    return have if have is not None and need > have else None


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:,.1f} GB"
