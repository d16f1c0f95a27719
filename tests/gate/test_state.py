"""The gate leaves every model as it found it (gate/state.py): plain attributes, buffers, caches
kept in the module, train/eval and requires_grad flags, the weights and every global RNG are the
same after `audit` as before; and where the model's own state moves its answers between
identical calls, `determinism` says so and names what moved.

The stateful models are `zoo_foreign.StatefulGPT`, LLMs-from-scratch's kv-cache GPT-2 in small
(a position counter and caches in buffers), and, where the package is installed (a release
environment: `python tests/releases.py llms-from-scratch==1.0.19`), that GPT-2 itself."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from zoo_foreign import V, StatefulGPT

import decoder_audit as da
from decoder_audit.gate.state import ModelState

FACTS = {"vocab_size": V, "max_seq_len": 16, "intervention_len": 16}
TORCH_KEYS = set(vars(nn.Module()))


def _everything(model: nn.Module) -> dict:
    """An independent record of all a model holds: every module's own attributes (tensors
    cloned, containers copied) and tables, the flags, the weights, and the three global RNGs."""
    record = {}
    for prefix, module in model.named_modules():
        for key, value in vars(module).items():
            if key in TORCH_KEYS - {"training", "_buffers", "_parameters"}:
                continue
            if key in ("_buffers", "_parameters"):
                value = {k: (v, None if v is None else v.detach().clone()) for k, v in value.items()}
            elif isinstance(value, torch.Tensor):
                value = (value, value.clone())
            elif isinstance(value, list):
                value = (value, list(value))
            record[f"{prefix}.{key}"] = value
    record["requires_grad"] = [p.requires_grad for p in model.parameters()]
    record["rng"] = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    return record


def _differences(before: dict, after: dict) -> list[str]:
    wrong = []
    for key in before.keys() | after.keys():
        a, b = before.get(key), after.get(key)
        if key == "rng":
            same = torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])
        elif isinstance(a, dict):
            same = a.keys() == b.keys() and all(
                a[k][0] is b[k][0] and (a[k][1] is None or torch.equal(a[k][1], b[k][1]))
                for k in a)
        elif isinstance(a, tuple) and isinstance(a[1], torch.Tensor):
            same = a[0] is b[0] and torch.equal(a[1], b[1])
        elif isinstance(a, tuple):
            same = a[0] is b[0] and a[1] == b[1]
        else:
            same = a == b
        if not same:
            wrong.append(key)
    return sorted(wrong)


def _found_in_a_used_state() -> StatefulGPT:
    """The model as a user hands it over: some history (lengths seen, a last hidden state,
    running statistics), its embedding frozen, its attention in train mode (a mixed state)."""
    model = StatefulGPT(from_counter=True)
    model.lengths_seen.append(5)
    model.last_hidden = torch.randn(1, 5, 16)
    with torch.no_grad():
        model.running_mean.fill_(0.25)
    model.embed.weight.requires_grad_(False)
    model.att.train()
    return model


def test_a_stateful_model_is_given_back_as_found():
    model = _found_in_a_used_state()
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    before = _everything(model)
    report = da.audit(model, training=da.TrainingPath(4, 16), **FACTS)
    assert _differences(before, _everything(model)) == []
    assert model.current_pos == 0 and model.att.cache_k is None  # the cache probe's, put back
    assert any("current_pos" in note for note in report.notes), report.notes


def test_the_kv_cache_gpt_passes_every_check_it_can_run():
    """The cache probe (a use_cache=True call) advances current_pos; a model left so reads
    shifted positions and, at full length, past its table: six checks raised IndexError."""
    for model in (StatefulGPT(), StatefulGPT(from_counter=True)):
        report = da.audit(model, **FACTS)
        assert report.passed, report.first_failure


def test_a_counter_that_never_resets_fails_determinism_alone_and_names_what_moved():
    report = da.audit(StatefulGPT(rows=256, limit=16, drift=True), **FACTS)
    assert [c.name for c in report.failures] == ["determinism"], report.first_failure
    check = report["determinism"]
    assert check.evidence["stateful"] and "current_pos" in check.detail
    assert any("current_pos: 0 -> 16" in moved for moved in check.evidence["state_moved"])


def test_a_counter_that_runs_past_its_table_is_still_the_models_state():
    """The second call from the moved state raises (positions 16.. of a 16-row table)."""
    check = da.audit(StatefulGPT(drift=True), checks=["determinism"], **FACTS)["determinism"]
    assert not check.passed and check.evidence["stateful"]
    assert "IndexError" in check.detail and "current_pos" in check.detail


def test_noise_is_not_called_state():
    """A model that draws noise in eval mode and changes nothing in itself: the old verdict."""
    class Noisy(StatefulGPT):
        def forward(self, in_idx, use_cache=False, cache=None):
            return super().forward(in_idx) + 1e-3 * torch.randn(*in_idx.shape, V)

    check = da.audit(Noisy(), checks=["determinism"], **FACTS)["determinism"]
    assert not check.passed and not check.evidence["stateful"]


def test_state_restore_puts_back_in_place_writes_and_names_what_it_could_not_copy(monkeypatch):
    """A buffer written in place is copied back (same object); one above the copy budget is
    named, not copied; a weight whose storage was swapped is named."""
    import decoder_audit.gate.state as state

    model = StatefulGPT()
    model.register_buffer("big", torch.zeros(1000))
    monkeypatch.setattr(state, "COPY_BUDGET_MIN", 4000)  # room for everything but `big`
    monkeypatch.setattr(state, "COPY_BUDGET_SHARE", 0.0)
    held = ModelState(model)
    buffer = model.running_mean
    with torch.no_grad():
        buffer.add_(1.0), model.big.add_(1.0)
    model.head.bias.data = torch.zeros(V)
    model.current_pos, model.extra = 7, "added"
    assert "StatefulGPT.current_pos: 0 -> 7" in held.changes()
    lost = held.restore()
    assert model.running_mean is buffer and torch.equal(buffer, torch.zeros(16))
    assert model.current_pos == 0 and not hasattr(model, "extra")
    assert any(line.startswith("StatefulGPT.big (1000)") for line in lost), lost
    assert any("head.bias" in line for line in lost), lost
    assert held.changes() == [] and held.restore() == []  # said once


def test_the_llms_from_scratch_kv_cache_gpt2_itself():
    gpt2 = pytest.importorskip("llms_from_scratch.kv_cache.gpt2")
    cfg = {"vocab_size": 97, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 1,
           "drop_rate": 0.1, "qkv_bias": False}
    torch.manual_seed(0)
    model = gpt2.GPTModel(cfg)
    report = da.audit(model, vocab_size=97, max_seq_len=16, intervention_len=16)
    assert report.passed, report.first_failure
    assert model.current_pos == 0


class InstallsHooksWhenCalled(StatefulGPT):
    """Registers a forward hook on its attention at its first call and marks it with a flag, as
    transformers installs its output-capturing hooks on the first output_attentions call."""

    def forward(self, in_idx, use_cache=False, cache=None):
        if not getattr(self, "_hooks_installed", False):
            self.att.register_forward_hook(lambda module, args, out: None)
            self._hooks_installed = True
        return super().forward(in_idx, use_cache, cache)


def test_hooks_the_model_installs_on_itself_go_with_their_flag():
    model = InstallsHooksWhenCalled()
    report = da.audit(model, **FACTS)
    assert report.passed, report.first_failure
    assert not hasattr(model, "_hooks_installed") and len(model.att._forward_hooks) == 0
    held = ModelState(model)
    model(torch.zeros(1, 3, dtype=torch.long))
    held.restore(full=False)  # between a check's calls: the flag and its hook stay together
    assert model._hooks_installed and len(model.att._forward_hooks) == 1
    held.restore()
    assert not hasattr(model, "_hooks_installed") and len(model.att._forward_hooks) == 0


# ---- the process's settings (issue 44: the process left as found) ----------------------------

def _settings() -> tuple:
    return (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
            torch.get_num_threads(), torch.is_anomaly_enabled())


class _SetsInForward(nn.Module):
    """tiny-368 whose forward calls a process-wide setter first (and then raises, `raises`)."""

    SETTERS = {
        "torch.set_default_dtype": lambda: torch.set_default_dtype(torch.float64),
        "torch.use_deterministic_algorithms": lambda: torch.use_deterministic_algorithms(True),
        "torch.set_num_threads": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
        "torch.autograd.set_detect_anomaly": lambda: torch.autograd.set_detect_anomaly(True),
    }

    def __init__(self, setter: str, raises: bool = False) -> None:
        super().__init__()
        self.setter, self.raises = setter, raises
        torch.manual_seed(0)
        self.inner = da.Decoder(da.preset("tiny-368"))

    def forward(self, ids):
        self.SETTERS[self.setter]()
        if self.raises:
            raise RuntimeError("the forward fails after changing the setting")
        return self.inner(ids)


@pytest.mark.parametrize("setter", list(_SetsInForward.SETTERS))
def test_a_forward_changing_a_process_setting_fails_determinism_and_is_put_back(setter):
    before = _settings()
    report = da.audit(_SetsInForward(setter), vocab_size=8, max_seq_len=4)
    assert _settings() == before  # the process is given back as found
    assert [c.name for c in report.failures] == ["determinism"], report.first_failure
    check = report["determinism"]
    assert setter in check.detail and check.evidence["process_settings"], check.detail
    assert any(setter in note for note in report.notes)


@pytest.mark.parametrize("setter", ["torch.set_default_dtype", "torch.set_num_threads"])
def test_a_forward_that_raises_after_changing_a_setting_leaves_the_process_as_found(setter):
    before = _settings()
    report = da.audit(_SetsInForward(setter, raises=True), vocab_size=8, max_seq_len=4,
                      checks=["shapes", "determinism"])
    assert _settings() == before
    assert not report["shapes"].passed


def test_a_model_that_touches_no_setting_says_nothing_of_them():
    report = da.audit(da.Decoder(da.preset("tiny-368")), checks=["determinism", "oracle"])
    assert report.passed and report["determinism"].evidence["process_settings"] == []
    assert not any("process-wide" in note for note in report.notes)
