"""The gate on routed experts and latent attention: our tiny MoE and MLA Decoders pass every
check (the float64 oracle equal to them in values and gradients, every expert reached by
dead_parameters' probe, no row or later token read), each planted defect of zoo_experts fails
the check named for it, and a model that drops tokens over a declared capacity is caught
reading the batch."""

from __future__ import annotations

import configs
import pytest
import torch
import zoo_experts

import decoder_audit as da

# Skipped on a plain audit: no sliding window, the training paths train declares, a tie, and
# the routing checks of a model without routed experts.
SKIPPED = {"window", "packing", "checkpointing", "autocast", "model_loss", "router_aux_loss",
           "tying_grad",
           "routing_independence", "expert_gradients"}


@pytest.mark.parametrize("name", zoo_experts.CORRECT)
def test_tiny_moe_and_mla_decoders_pass_every_check(name):
    model = zoo_experts.correct(name)
    report = da.audit(model)
    assert report.passed, {c.name: c.detail for c in report.failures}
    assert {c.name for c in report.skipped} <= SKIPPED
    ran = {c.name for c in report.checks} - {c.name for c in report.skipped}
    assert {"oracle", "params", "dead_parameters", "causal", "batch_independence",
            "kv_cache", "padding"} <= ran


@pytest.mark.parametrize("name", ["moe-softmax-shared", "moe-topk-softmax-relu", "mla-moe"])
def test_the_dead_parameters_probe_routes_to_every_expert(name):
    """dead_parameters' probe (3 rows of min(16, max_seq_len) random tokens) sends a token to
    every expert of every routed layer of these models: so a dead expert is a defect, not an
    expert the probe missed. (A top-k choice of k of E experts per token, the logits of a fresh
    router close to each other: E=5, k=2 misses an expert with chance (3/5)^18 ~ 1e-4.)"""
    model = zoo_experts.correct(name)
    cfg = model.config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (3, min(16, cfg.max_seq_len)), generator=generator)
    _, trace = model.run_with_trace(ids)
    for i in range(cfg.n_layers):
        if cfg.routes(i):
            chosen = (trace[f"layers.{i}.ffn.gates"] != 0).flatten(0, 1).any(0)  # (E,)
            assert chosen.all(), (i, chosen)


@pytest.mark.parametrize("case", zoo_experts.MUTANTS, ids=lambda case: case.name)
def test_each_planted_defect_fails_its_check(case):
    report = da.audit(case.build(), checks=[case.expect], **case.kwargs)
    check = report[case.expect]
    assert not check.passed and case.says in check.detail, check.detail
    assert "exception" not in check.evidence, check.detail


@pytest.mark.parametrize("name", ["moe-softmax-shared", "moe-sigmoid-bias", "moe-grouped",
                                  "moe-topk-softmax-relu", "mla-moe"])
def test_a_router_of_zeros_ties_every_score_and_the_correct_model_passes_the_oracle(name):
    """With every router weight 0 each token's experts all score alike: which k are chosen is
    the tie rule's, not a defect. The oracle breaks ties by torch.topk's rule on its own float64
    scores, as the model's router does on its own (the oracle chose the first k by index, and a
    correct model failed by 2e-4 against 2.9e-6 allowed)."""
    model = zoo_experts.tied(name)
    _, trace = model.run_with_trace(torch.zeros(1, 3, dtype=torch.long))
    routed = [i for i in range(model.config.n_layers) if model.config.routes(i)]
    scores = trace[f"layers.{routed[0]}.ffn.router"][0, 0]  # (E,) one token's router logits
    assert bool((scores == scores[0]).all())  # the premise: every score tied
    check = da.audit(model, checks=["oracle"])["oracle"]
    assert check.passed and not check.skipped, check.detail


@pytest.mark.parametrize("defect", ["topk_weights_not_renormalised", "expert_left_out_of_the_sum",
                                    "routed_scaling_ignored"])
def test_with_every_score_tied_a_routing_defect_still_fails_the_oracle(defect):
    case = next(case for case in zoo_experts.MUTANTS if case.name == defect)
    name = {"routed_scaling_ignored": "moe-sigmoid-bias"}.get(defect, "moe-softmax-shared")
    plant = {"topk_weights_not_renormalised": zoo_experts._routing(1, normalize_topk=False),
             "expert_left_out_of_the_sum": zoo_experts._silenced("layers.1.ffn.experts.2"),
             "routed_scaling_ignored": zoo_experts._routing(1, routed_scaling=1.0)}[defect]
    check = da.audit(zoo_experts.tied(name, plant), checks=["oracle"])["oracle"]
    assert not check.passed and case.says in check.detail, check.detail


def test_dropping_tokens_over_a_declared_capacity_is_caught_reading_the_batch():
    """capacity_factor=1.0: each expert takes ceil(B*T*k/E) tokens of a forward, in batch-major
    order; a row's later tokens are dropped when earlier rows filled the expert. A correct
    implementation of a declared capacity, and a genuine leak for a causal LM."""
    cfg = configs.named("moe-capacity")
    report = da.audit(zoo_experts.decoder(cfg, seed=3), checks=["batch_independence", "prefix",
                                                                 "oracle"])
    assert report["oracle"].passed  # the oracle drops the same tokens
    assert not report["batch_independence"].passed and not report["prefix"].passed


def test_an_expert_the_router_never_chooses_is_named_not_failed_by_dead_parameters():
    """Its gradient is 0 because no token went there, not because it is cut off: named as not
    judged (the expert_never_reached mutant, called but contributing nothing, still fails)."""
    model = zoo_experts.correct("moe-sigmoid-bias")
    with torch.no_grad():
        model.layers[1].ffn.router.selection_bias[3] = -10.0  # never among a token's top 2
    check = da.audit(model, checks=["dead_parameters"])["dead_parameters"]
    assert check.passed, check.detail
    assert check.evidence["unrouted_experts"] == ["layers.1.ffn.experts.3"]
    assert "layers.1.ffn.experts.3" in check.detail


class _Wrapped(torch.nn.Module):
    """A module of its own holding our Decoder under `net.`: audited against a declared spec,
    its weights found by their names (the decoder-audit layout, experts and latents included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.net = model

    def forward(self, ids):
        return self.net(ids)


@pytest.mark.parametrize("name, mutant", [("moe-sigmoid-bias", "routed_scaling_ignored"),
                                          ("mla-q-latent", "rotary_part_on_the_wrong_features")])
def test_a_module_declaring_the_spec_is_placed_stressed_and_its_defect_caught(name, mutant):
    cfg = configs.named(name)
    facts = dict(spec=cfg, vocab_size=cfg.vocab_size, max_seq_len=cfg.max_seq_len,
                 checks=["params", "oracle"])
    report = da.audit(_Wrapped(zoo_experts.correct(name)), **facts)
    assert report.passed, {c.name: c.detail for c in report.failures}
    assert report["oracle"].evidence["stressed"]  # the stress weights were written and compared
    case = next(case for case in zoo_experts.MUTANTS if case.name == mutant)
    report = da.audit(_Wrapped(case.build()), **facts)
    assert report["params"].passed and not report["oracle"].passed


@pytest.mark.parametrize("case", zoo_experts.ROUTING_MUTANTS, ids=lambda case: case.name)
def test_each_routing_check_alone_catches_its_mutant(case):
    report = da.audit(case.build())
    assert [c.name for c in report.failures] == [case.expect], {
        c.name: c.detail for c in report.failures}
    assert case.says in report[case.expect].detail


@pytest.mark.parametrize("build", [zoo_experts.UNCHOSEN_EXPERT, zoo_experts.QUIET_EXPERTS],
                         ids=["expert-never-chosen", "quiet-experts-no-capacity"])
def test_the_routing_mutants_correct_twins_pass_every_check(build):
    report = da.audit(build())
    assert report.passed, {c.name: c.detail for c in report.failures}
    assert not report["routing_independence"].skipped and not report["expert_gradients"].skipped


def test_the_routing_checks_are_skipped_with_their_reason_on_a_dense_or_latent_model():
    report = da.audit(zoo_experts.correct("mla-q-latent"),
                      checks=["routing_independence", "expert_gradients"])
    for name in ("routing_independence", "expert_gradients"):
        assert report[name].skipped and "n_experts" in report[name].detail


@pytest.mark.parametrize("seed", range(4))
def test_a_correct_moe_passes_the_exact_batch_comparisons_at_the_training_shape(seed):
    """8 experts, one per token: a token is often alone in its expert in one batch and shares
    it in another. Before the experts multiplied row by row, batch_independence, causal at the
    training shape and train_mode failed on 4e-9 (an ulp): `train` refused a correct model."""
    from decoder_audit.gate.facts import TrainingPath

    cfg = configs.named("moe-sigmoid-bias").replace(n_experts=8, experts_per_token=1,
                                                    n_shared_experts=0)
    torch.manual_seed(seed)
    report = da.audit(da.Decoder(cfg), training=TrainingPath(2, 4),
                      checks=["batch_independence", "causal", "prefix", "train_mode"])
    assert report.passed, {c.name: c.detail for c in report.failures}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_expert_gradients_probe_reaches_every_expert_of_a_sharp_grouped_router(seed):
    """Router logits 100x those of a fresh model (a trained router's are large): raising the
    target 1 above the largest left another group's two best ahead of the target's group, so
    an expert was never chosen and named as cut off (before the probe pushed the others down)."""
    cfg = configs.named("moe-grouped")
    torch.manual_seed(seed)
    model = da.Decoder(cfg)
    with torch.no_grad():
        for layer in model.layers:
            layer.ffn.router.weight.mul_(100.0)
    check = da.audit(model, checks=["expert_gradients"])["expert_gradients"]
    assert check.passed and check.evidence["not_reached"] == [], check.detail


def test_the_gates_memory_forecast_counts_a_tokens_k_experts():
    """verify's pre-flight prices one block's activations at the widest MLP a token passes
    through: OLMoE's 8 experts of 1024 (8192 wide), not its d_ff of 1024."""
    from decoder_audit.gate.peak import _inputs, _Shape

    cfg = da.preset("olmoe-1b-7b").replace(n_layers=2, max_seq_len=64)
    rows = {row.name: row for row in _inputs(_Shape(cfg, torch.float32, 1))}
    block = rows["activations of one block, no grad"]
    B_times_T = rows[next(n for n in rows if n.startswith("logits"))].bytes // (4 * cfg.vocab_size)
    qkv = (16 + 2 * 16) * 128
    assert block.bytes == B_times_T * (3 * 8 * 1024 + 4 * 2048 + qkv) * 4
