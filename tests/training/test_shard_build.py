"""`train(shard=True)` builds the model sharded and gates it sharded: a preset or config is laid
out on the meta device and each rank draws only its own rows (`distributed.build_sharded`), so
no rank ever holds the whole model, and the gate runs on that sharded model, every rank alike,
on the path training takes. One process (a one-rank group): nothing is split, but the code path
is the sharded one. The two-rank runs are tests/training/test_shard.py (the same results as one
unsharded process) and .ci/distributed (two nodes)."""

from __future__ import annotations

import pytest
import torch
import zoo_generation

from decoder_audit import Decoder, preset
from decoder_audit.training import GateRefusal, gatekeeper, train

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed missing")

RUN = {"steps": 2, "batch_size": 8, "warmup": 1, "seed": 5}


def _spy(monkeypatch) -> tuple[list[str], list[set[str]]]:
    """The devices of the weights of every Decoder built before the gate runs, and the kinds
    of tensor the gate's model holds as its weights."""
    built, audited = [], []
    init, audit = Decoder.__init__, gatekeeper.audit

    def spy_init(self, config, *, device=None, dtype=None):
        init(self, config, device=device, dtype=dtype)
        if not audited:
            built.append({p.device.type for p in self.parameters()})

    def spy_audit(model, **options):
        audited.append({type(p).__name__ for p in model.parameters()})
        return audit(model, **options)

    monkeypatch.setattr(Decoder, "__init__", spy_init)
    monkeypatch.setattr(gatekeeper, "audit", spy_audit)
    return built, audited


def test_a_fresh_sharded_run_is_built_on_the_meta_device_and_gated_sharded(monkeypatch):
    """Before: `Decoder(cfg)` built whole on the CPU, the gate run on that unsharded copy, and
    only then sharded."""
    built, audited = _spy(monkeypatch)
    result = train("tiny-368", shard=True, progress=False, verbose=False, **RUN)
    # every Decoder built before the gate (the run's, and the gate's own meta-device copy that
    # names the weights) held no weight: the run's was allocated only once sharded
    assert built and all(devices == {"meta"} for devices in built), built
    assert audited == [{"DTensor"}]  # every weight the gate read was a shard
    # the run trained what the gate passed: the seed's weights, moved by its two steps
    torch.manual_seed(RUN["seed"])
    fresh = Decoder(preset("tiny-368"))
    moved = max((result.model.state_dict()[n] - t).abs().max().item()
                for n, t in fresh.state_dict().items())
    assert result.step == RUN["steps"] and moved > 0


def test_the_sharded_gate_refuses_a_leak_on_the_training_path(monkeypatch):
    """A leak only backward sees (the final norm mixes positions in its gradient): the sharded
    gate's grad_causal check refuses it before a step, as the unsharded gate does."""
    built, audited = _spy(monkeypatch)
    seen = []
    with pytest.raises(GateRefusal) as refused:
        train(zoo_generation.leaky_backward(), shard=True, progress=False, verbose=False,
              callback=lambda step, row: seen.append(step), **RUN)
    assert "grad_causal" in refused.value.failed
    assert audited == [{"DTensor"}] and seen == []


def test_a_resumed_sharded_run_is_loaded_sharded_and_resumes_bitwise(tmp_path, monkeypatch):
    """Resuming a sharded checkpoint builds the Decoder on the meta device, shards it, and each
    rank reads only its own rows (`distributed.load_sharded_for_training`); before, the whole
    model was loaded on every rank first. Resumed from step 2, the run equals the run of 4."""
    import shutil

    out, copy = tmp_path / "run", tmp_path / "copy"

    def keep(step, row):  # the step-2 checkpoint, before step 4 overwrites it
        if step == 2:
            shutil.copytree(out / "checkpoint", copy / "checkpoint")
            shutil.copy2(out / "metrics.jsonl", copy / "metrics.jsonl")

    from decoder_audit.storage import sharded

    straight = train("tiny-368", shard=True, progress=False, verbose=False, out=out,
                     save_every=2, callback=keep, **{**RUN, "steps": 4})
    _, audited = _spy(monkeypatch)
    loads, load = [], sharded.load_sharded_state

    def spy_load(folder, model, **options):  # the weights read before the gate, into what
        if not audited:
            loads.append(sharded.holds_dtensors(model))
        return load(folder, model, **options)

    monkeypatch.setattr(sharded, "load_sharded_state", spy_load)
    resumed = train(shard=True, progress=False, verbose=False, resume=copy)
    assert loads == [True]  # read once, into the sharded model: each rank its own rows
    assert audited == [{"DTensor"}]
    assert resumed.step == 4
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name
