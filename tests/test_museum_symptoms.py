"""The museum's symptom measures (tests/museum/symptoms.py) read 0 on correct models and more than
a row's threshold on a planted copy of each row's defect, in the project's own transformers:
the figures the museum reports mean what they say. Fast (tiny models, CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from museum import builders, numerics, symptoms

transformers = pytest.importorskip("transformers")
V = builders.V
ROUNDING = 1e-5  # float32 rounding of logits near 1


def _llama(**fields):
    return builders._hf("Llama", num_key_value_heads=2, **fields)


def _mistral(window):
    return builders._hf("Mistral", layers=1, num_key_value_heads=2, sliding_window=window)


class _Bidirectional(nn.Module):
    """Each position's logits read the mean of all positions' embeddings: a leak by design."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, 16), nn.Linear(16, V)

    def forward(self, input_ids):
        h = self.embed(input_ids)  # (B, T, 16)
        return self.head(h + h.mean(dim=1, keepdim=True))


class _PerBatchMeanLoss(nn.Module):
    """A Llama whose labels= loss is the micro-batch mean, whatever num_items_in_batch says."""

    def __init__(self):
        super().__init__()
        self.inner = _llama()

    def forward(self, input_ids, labels=None, **kwargs):
        out = self.inner(input_ids=input_ids)
        if labels is not None:
            out.loss = symptoms.next_token_ce(out.logits, labels)
        return out


def test_future_leak_reads_zero_on_a_causal_model_and_the_leak_of_a_bidirectional_one():
    assert symptoms.future_leak(_llama(), V) == 0.0
    torch.manual_seed(0)
    assert symptoms.future_leak(_Bidirectional(), V) > 1e-3


def test_window_read_reads_zero_inside_a_held_window_and_the_read_of_a_dropped_one():
    assert symptoms.window_read(_mistral(builders.WINDOW), V, window=builders.WINDOW) == 0.0
    assert symptoms.window_read(_mistral(None), V, window=builders.WINDOW) > 1e-3


def test_cached_decoding_of_a_correct_model_matches_its_full_forward():
    model = _llama()
    assert symptoms.cached_vs_full(model, V) < ROUNDING
    assert symptoms.cached_vs_full(model, V, prefill=6, chunk=3) < ROUNDING


def test_the_loss_measures_hold_a_correct_loss_and_catch_one_that_ignores_the_item_count():
    model = _llama()
    for measure in (symptoms.loss_with_labels, symptoms.loss_with_items,
                    symptoms.loss_with_shift_labels):
        assert measure(model, V) < ROUNDING, measure.__name__
    assert symptoms.loss_with_items(_PerBatchMeanLoss(), V) > 1.0


def test_dead_gradients_counts_a_parameter_the_forward_never_reads():
    model = _llama()
    assert symptoms.dead_gradients(model, V) == 0
    model.register_parameter("unused_scale", nn.Parameter(torch.ones(4)))
    assert symptoms.dead_gradients(model, V) == 1


def test_packed_leak_reads_zero_where_position_ids_mark_the_documents():
    assert symptoms.packed_leak(_llama(), V, use_cache=False) == 0.0


def test_aux_loss_gradient_reads_zero_on_a_router_that_returns_its_logits_and_flags_a_softmax():
    """transformers#45120 planted: the router returns its probabilities where its logits belong,
    and the load-balancing loss takes a softmax of them again."""
    def routers(model):
        found = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        if not found:
            pytest.skip("this release's routers are no module returning (logits, weights, "
                        "indices)")
        return found

    correct, _ = builders.mixtral_moe()
    routers(correct)
    assert numerics.aux_loss_gradient(correct, V) < ROUNDING

    def softmaxed(module, inputs, output):
        logits, weights, chosen = output
        return logits.float().softmax(-1), weights, chosen

    planted, _ = builders.mixtral_moe()  # planted before its first forward, where transformers
    for router in routers(planted):      # hooks its recorder of the returned logits
        router.register_forward_hook(softmaxed)
    assert numerics.aux_loss_gradient(planted, V) > 0.5  # 1 - 1/E of the gradient lost, E = 4


def test_attention_vs_definition_reads_zero_on_opt_and_flags_scores_divided_by_d():
    """transformers#38277 planted: OPT's query scaled by 1/d where 1/sqrt(d) belongs (what the
    4.52 refactor did by scaling twice)."""
    model, _ = builders.opt_lm()
    assert numerics.attention_vs_definition(model, V) < ROUNDING
    for layer in model.model.decoder.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim ** -1.0
    assert numerics.attention_vs_definition(model, V) > 1e-2


def test_routed_outside_groups_reads_zero_on_glm4_moe_and_flags_choices_in_another_group(
        monkeypatch):
    """Choices moved into the group the scores did not choose (each expert index shifted by one
    group of 2), as transformers#45440's 0.0 fill did once the biased scores were negative."""
    model, _ = builders.glm4_moe_grouped()
    assert numerics.routed_outside_groups(model, V) == 0.0
    router = next(m for m in model.modules() if hasattr(m, "e_score_correction_bias"))
    assert hasattr(router, "num_group"), "this release routes inside the MoE block"
    forward = type(router).forward

    def other_group(self, hidden_states):
        logits, weights, indices = forward(self, hidden_states)
        return logits, weights, (indices + 2) % 4

    monkeypatch.setattr(type(router), "forward", other_group)
    assert numerics.routed_outside_groups(model, V) == 1.0


def test_attention_vs_definition_reads_multi_query_gpt_bigcode_and_flags_an_inverted_scale():
    """transformers#40041 planted: GPT-BigCode's scores multiplied by sqrt(d), not divided."""
    model, _ = builders.gpt_bigcode_lm()
    assert numerics.attention_vs_definition(model, V) < ROUNDING
    for block in model.transformer.h:
        block.attn.scaling = block.attn.head_dim ** 0.5
    assert numerics.attention_vs_definition(model, V) > 1e-2


def test_checkpoint_readout_bias_holds_phi_and_flags_a_readout_that_drops_the_bias():
    """A Llama (no readout bias in its class) loading a checkpoint that carries lm_head.bias
    drops it, as Phi's class did in 4.48.0 (transformers#35625)."""
    phi, _ = builders.phi_lm()
    assert numerics.checkpoint_readout_bias(phi, V) < ROUNDING
    assert numerics.checkpoint_readout_bias(_llama(), V) > 1e-2


def test_rotary_vs_declared_holds_a_partial_rotation_and_flags_a_whole_head_one():
    """transformers#48241 planted: a MiniMax-M2 rotating its whole head (no partial factor)
    where its checkpoint declares 4 of 8 features."""
    partial, _ = builders.minimax_m2_legacy_rotary()
    assert numerics.rotary_vs_declared(partial, V, rotary_dim=4) < ROUNDING
    whole = builders._hf("MiniMaxM2", head_dim=8, num_local_experts=4, **builders.EXPERTS)
    assert numerics.rotary_vs_declared(whole, V, rotary_dim=4) > 1e-2


def test_padded_cached_vs_alone_holds_a_llama_and_flags_a_cache_that_keeps_the_pads():
    """A left-padded row through the cache equals the row alone on a correct model; planted: the
    steps are sent without the mask, so the row's pads count as keys (what a mask cut at the
    wrong offset does)."""
    model = _llama()
    assert symptoms.padded_cached_vs_alone(model, V) < ROUNDING
    forward = model.forward

    def unmasked(*args, attention_mask=None, **kwargs):
        return forward(*args, **kwargs)

    model.forward = unmasked
    assert symptoms.padded_cached_vs_alone(model, V) > 1e-3
