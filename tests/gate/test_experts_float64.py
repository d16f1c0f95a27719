"""The float64 confirmation where routed experts run through a kernel that refuses float64.

transformers 5 runs a Mixtral-style model's experts through torch._grouped_mm, which refuses
float64 and groups the tokens an expert receives, so a token can round by an ulp with the tokens
that share its expert (the later tokens of its row, the other rows). The gate confirms such a
movement on a float64 copy whose experts run their eager loop; a dependence that keeps its size
there is still a leak. The wobble is planted (a grouped kernel that rounds by its group's size,
as measured on dots3_note_text and inkling2_loop_text: 5.96e-08), so the test cannot pass by a
lucky draw of the weights."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("transformers")
moe = pytest.importorskip("transformers.integrations.moe")
if "grouped_mm" not in getattr(moe, "ALL_EXPERTS_FUNCTIONS", {}):
    pytest.skip("this transformers release has no experts implementations", allow_module_level=True)

import torch  # noqa: E402

import decoder_audit as da  # noqa: E402

V = 64
ULP = torch.finfo(torch.float32).eps


def tiny_mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              num_local_experts=4, num_experts_per_tok=2,
                              max_position_embeddings=64, attn_implementation="eager")
    return tf.MixtralForCausalLM(config).eval()


def planted_kernel():
    """The stock grouped kernel (float32 only), then each token's output rounded up by 1 or 2
    ulps with the number of tokens its first expert receives in the call (what a grouped kernel's
    blocking does)."""
    stock = moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"]

    def grouped(self, hidden_states, top_k_index, top_k_weights):
        out = stock(self, hidden_states, top_k_index, top_k_weights)  # (N, D)
        first = top_k_index[:, 0]
        group_size = torch.bincount(first, minlength=self.num_experts)[first]  # (N,)
        return out * (1 + ULP * (group_size % 3).to(out.dtype))[:, None]

    return grouped


def audit(monkeypatch, leak: float = 0.0, across_rows: bool = False):
    """The tiny Mixtral on the planted kernel, with `leak` times the sum of the later tokens (or
    of the other rows) added to each routed layer's output (a dependence in every dtype and
    experts loop)."""
    monkeypatch.setitem(moe.ALL_EXPERTS_FUNCTIONS._local_mapping, "grouped_mm", planted_kernel())
    if leak:
        block = tf.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock
        routed = block.forward

        def leaking(self, hidden_states):  # (B, T, D)
            later = (hidden_states.sum(0, keepdim=True) if across_rows else
                     hidden_states.flip(1).cumsum(1).flip(1)) - hidden_states
            return routed(self, hidden_states) + leak * later

        monkeypatch.setattr(block, "forward", leaking)
    model = tiny_mixtral()
    assert model.config._experts_implementation == "grouped_mm"
    return da.audit(model, checks=["causal", "batch_independence"])


def test_a_grouped_kernel_s_rounding_is_confirmed_on_the_eager_experts_in_float64(monkeypatch):
    report = audit(monkeypatch)
    for name in ("causal", "batch_independence"):
        result = report[name]
        assert result.passed, (name, result.detail)
        wide = result.evidence["float64"]
        assert wide is not None and wide["passed"], (name, wide)
    # the float32 rows did move: the confirmation, not an exact comparison, passed them
    assert report["causal"].evidence["float64"]["float32_max_change_earlier"] > 0
    assert report["batch_independence"].evidence["variants"][0]["max_abs_diff"] > 0


def test_the_stock_kernel_refuses_float64_so_only_the_eager_switch_confirms(monkeypatch):
    """The premise: without the switch to the eager loop no float64 copy of the model runs."""
    model = tiny_mixtral().double()
    with pytest.raises(RuntimeError):
        model(torch.zeros(1, 4, dtype=torch.long))
    model.set_experts_implementation("eager")
    assert model(torch.zeros(1, 4, dtype=torch.long)).logits.dtype == torch.float64


def test_a_dependence_of_an_ulp_inside_the_routed_layer_is_still_a_leak(monkeypatch):
    """A leak as small as the rounding (earlier logits moved by ~1e-6, within the float32 jitter
    allowance of 64 ulps of the logit scale) keeps its size in the float64 copy: the
    confirmation runs there and refuses it."""
    report = audit(monkeypatch, leak=ULP / 64)
    causal = report["causal"]
    assert not causal.passed
    wide = causal.evidence["float64"]
    assert wide is not None and not wide["passed"] and wide["max_change_earlier"] > wide["allowed"]


def test_a_leak_of_1e_5_inside_the_routed_layer_fails_causal_unconfirmed(monkeypatch):
    """Far past any rounding: no float64 copy is asked; the rows stay independent."""
    report = audit(monkeypatch, leak=1e-5)
    causal = report["causal"]
    assert not causal.passed and causal.evidence["float64"] is None
    assert report["batch_independence"].passed


def test_a_dependence_of_an_ulp_on_the_other_rows_is_still_a_batch_leak(monkeypatch):
    report = audit(monkeypatch, leak=ULP / 64, across_rows=True)
    rows = report["batch_independence"]
    assert not rows.passed
    wide = rows.evidence["float64"]
    assert wide is not None and not wide["passed"] and wide["max_abs_diff"] > wide["allowed"]
