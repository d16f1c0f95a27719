"""Sizing a decoder before building it: parameters, memory, and every forward matrix multiply.

`account(cfg, batch_size=1, seq_len=None)` works from the config alone (no weight is allocated):

- parameters come from `parameter_ledger(cfg)`, regrouped and labelled with their conventions
  (total unique, without embeddings, tied vs untied);
- memory is the weights in fp32 / bf16 / fp16, the AdamW training footprint, and an activation
  estimate whose assumptions are written beside it;
- FLOPs are listed matmul by matmul, derived from the shapes the model's code multiplies, and
  summed into four groups. Each (m x n)(n x p) product costs 2mnp.

The analytic count is then checked against a measurement: the model is built on the meta
device (shapes only) and run under `torch.utils.flop_counter.FlopCounterMode` (see `measured`).
Nothing analytic grows with the number of experts E (each is a formula in E); the measurement
builds every expert as a module, so beyond `measured.MAX_MEASURED_EXPERTS` of them (or where a
tensor of the forward would be too large for torch to size) it is skipped, and
`Accounting.measure_skipped` says why.

Modules: `ledger` (the parameter ledger, analytic and measured), `memory` (will the weights fit,
checked before allocating), `results` (the dataclasses and conventions), `analytic` (parameters,
memory, matmuls from the config), `measured` (the FlopCounterMode cross-check), `plot` (the
context sweep). `account` below puts them together.

Shape letters: B batch, T sequence length, D d_model, H query heads, Hkv KV heads, Dh head width,
F FFN width, V vocabulary, L layers.
"""

from __future__ import annotations

from typing import Any

from ..config import DecoderConfig
from ..errors import ContextLengthError, InputShapeError
from .analytic import (
    dominant_groups,
    forward_matmuls,
    group_totals,
    memory_estimate,
    parameter_counts,
)
from .measured import measured_flops, unmeasurable
from .results import Accounting


def _check_sizes(cfg: DecoderConfig, batch_size: Any, seq_len: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputShapeError(f"batch size B={batch_size!r} must be an integer >= 1")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ContextLengthError(f"sequence length T={seq_len!r} must be an integer >= 1")
    if seq_len > cfg.max_seq_len:
        raise ContextLengthError(
            f"sequence length T={seq_len} exceeds max_seq_len={cfg.max_seq_len}; account a "
            f"config with a longer context instead (e.g. cfg.replace(max_seq_len={seq_len}))")


def account(cfg: DecoderConfig, batch_size: int = 1, seq_len: int | None = None, *,
            measure: bool = True) -> Accounting:
    """Parameters, memory and every forward matmul of a decoder with this config, at (B, T).

    seq_len defaults to cfg.max_seq_len. With measure=True the analytic FLOPs are checked
    against FlopCounterMode on the meta device (no weight is allocated either way), unless the
    config or (B, T) is too large to build or run there: `measure_skipped` then says why."""
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(f"account needs a DecoderConfig, got {type(cfg).__name__}")
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    _check_sizes(cfg, batch_size, seq_len)
    params = parameter_counts(cfg)
    matmuls = forward_matmuls(cfg, batch_size, seq_len)
    groups = group_totals(matmuls, cfg)
    total = sum(mm.flops for mm in matmuls)
    skipped = unmeasurable(cfg, batch_size, seq_len) if measure else None
    return Accounting(
        config=cfg,
        batch_size=batch_size,
        seq_len=seq_len,
        parameters=params,
        memory=memory_estimate(cfg, params.total, batch_size, seq_len),
        matmuls=matmuls,
        groups=groups,
        forward_flops=total,
        forward_backward_flops=3 * total,
        dominant=dominant_groups(groups),
        measured=(measured_flops(cfg, batch_size, seq_len, groups, total)
                  if measure and skipped is None else None),
        measure_skipped=skipped,
    )
