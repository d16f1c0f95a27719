"""torchtitan's Llama 3 under the gate: `python examples/trainers/torchtitan_llama.py`.

TitanCall calls a torchtitan decoder as its trainer does (positions, and the block-causal masks
of flex attention); spec_of reads its config as the spec, whose weights the layout "torchtitan
Llama 3" finds. In a torchtitan job, run it on the model before the first step (the debug
flavor here; on CPU the inner attention is SDPA: flex attention has no backward there)."""

from __future__ import annotations

from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import llama3_configs

import decoder_audit as da
from decoder_audit.integrations import TitanCall, spec_of


def main() -> None:
    config = llama3_configs["debugmodel"](attn_backend="flex")
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = config.build()
    model.init_states()
    report = da.audit(TitanCall(model), spec=spec_of(config), intervention_len=16)
    print(report.summary())
    print(" ", report["params"].detail)


if __name__ == "__main__":
    main()
