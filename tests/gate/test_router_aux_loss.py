"""`router_aux_loss` on transformers' own routed classes (Mixtral, Qwen2-MoE with a dense first
layer, OLMoE; gpt-oss, whose router adds a bias and takes the top k before its softmax;
GraniteMoE, top k before the softmax; MiniMax-M2, a sigmoid router with a selection bias): a
training step with output_router_logits=True, held to the routers' own weights. Each defect is
planted in the library's module; the correct models pass.

The expectations are independent of the model: the router logits from each router's weight on
the input it received, the aux loss by its formula (written here once more, in the test, from
the Switch Transformer paper's definition over the top k), the loss as cross entropy plus the
config's coefficient times it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import decoder_audit as da
from decoder_audit.gate import model_facts
from hf_compat import _router_logits_softmaxed, hf_class

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

COMMON = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=12,
              bos_token_id=0, eos_token_id=1, pad_token_id=None, num_experts_per_tok=2,
              router_aux_loss_coef=0.02)
FAMILIES = {"mixtral": ("Mixtral", dict(num_local_experts=4)),
            "qwen2_moe": ("Qwen2Moe", dict(num_experts=4, moe_intermediate_size=8,
                                           shared_expert_intermediate_size=12,
                                           mlp_only_layers=[0])),
            "olmoe": ("Olmoe", dict(num_experts=4, norm_topk_prob=False)),
            "gpt_oss": ("GptOss", dict(num_local_experts=4, head_dim=8, sliding_window=4)),
            "granitemoe": ("GraniteMoe", dict(num_local_experts=4)),
            "minimax_m2": ("MiniMaxM2", dict(num_local_experts=4, head_dim=8))}


def _built(family: str = "mixtral", **config) -> nn.Module:
    torch.manual_seed(0)
    name, fields = FAMILIES[family]
    c = hf_class(f"{name}Config")(**{**COMMON, **fields, **config})
    model = hf_class(f"{name}ForCausalLM")(c).eval()
    with torch.no_grad():  # a router bias (gpt-oss) initialised at 0 would hide a dropped one
        for router in _routers(model):
            if getattr(router, "bias", None) is not None:
                router.bias.normal_(0.0, 1.0)
    return model


def _routers(model: nn.Module) -> list[nn.Module]:
    """The routed layers' router modules, in layer order (mlp.gate, mlp.router or
    block_sparse_moe.gate, by family)."""
    blocks = [getattr(layer, "mlp", None) or layer.block_sparse_moe
              for layer in model.model.layers]
    return [getattr(block, "router", None) or block.gate for block in blocks
            if hasattr(block, "experts")]


def _read(family: str, model: nn.Module) -> nn.Module:
    """The model, skipped where this release lays the family out otherwise than the families
    table reads it (GraniteMoE's experts before transformers 5): there the gate audits it
    black-box, saying so, and router_aux_loss has no spec to hold it to."""
    if model_facts(model).spec is None:
        pytest.skip(f"{family} is audited black-box on transformers {tf.__version__}")
    return model


def _model(family: str = "mixtral", **config) -> nn.Module:
    """A correct model of the family; skipped on a release whose routers return probabilities
    (transformers#45120, 5.0 to 5.5): there the correct model is the defect (below)."""
    model = _read(family, _built(family, **config))
    if _router_logits_softmaxed(model):
        pytest.skip("this release's routers return probabilities as router_logits "
                    "(#45120; gpt-oss's in 4.55-4.57): `test_the_released_double_softmax_fails` "
                    "holds it")
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_released_double_softmax_fails(family):
    """transformers 5.0 to 5.5 (#45120, fixed in 5.6.0): the routers returned softmax
    probabilities as router_logits and the load-balancing loss softmaxed them again, a loss
    with no useful gradient. gpt-oss in 4.55 to 4.57 the same way: its router returned the
    routing scores (the top k's softmax scattered over E), recorded as router_logits (fixed in
    5.0.0). The gate fails it naming the layer; a release without it skips."""
    model = _read(family, _built(family))
    if not _router_logits_softmaxed(model):
        pytest.skip("this release's routers return their logits (no #45120 here)")
    result = _audit(model)
    assert not result.passed and "layers." in result.detail


def _router(model: nn.Module) -> nn.Module:
    """Layer 1's router where it is a module that returns (logits, weights, indices)
    (transformers 5); before it the block chose inside its own forward."""
    gate = _routers(model)[-1]
    if isinstance(gate, nn.Linear):
        pytest.skip("the router is a Linear whose choice is made inside the block's forward "
                    "(transformers 4): no module returns the logits to plant the defect in")
    return gate


def _planted(model: nn.Module, hook, router: nn.Module | None = None) -> nn.Module:
    """`hook` on the last routed layer's router (or `router`); skipped where the router_logits
    the model returns are not that module's output on this release (MiniMax-M2 in 5.0 records
    them elsewhere), so the plant would change nothing the model returns."""
    ids = torch.arange(6).reshape(1, 6) % COMMON["vocab_size"]
    # transformers hooks its recorders on a model's first forward, after the plant: the plant
    # runs first on the model, and a copy taken before it is the unplanted reference
    unplanted = copy.deepcopy(model)
    (router or _router(model)).register_forward_hook(hook)
    with torch.no_grad():
        before = unplanted(input_ids=ids, output_router_logits=True).router_logits[-1]
        after = model(input_ids=ids, output_router_logits=True).router_logits[-1]
    if torch.equal(before, after):
        pytest.skip(f"transformers {tf.__version__} returns router_logits recorded elsewhere "
                    "than the router module's output")
    return model


def _audit(model: nn.Module) -> da.CheckResult:
    return da.audit(model, checks=["router_aux_loss"])["router_aux_loss"]


def _switch_aux(logits: torch.Tensor, experts: int, k: int) -> float:
    """E * sum_e F_e P_e over router logits (N, E), from the definition."""
    probs = logits.double().softmax(-1)
    chosen = probs.topk(k, -1).indices
    share = torch.stack([(chosen == e).any(-1).double().mean() for e in range(experts)])
    return float(experts * (share * probs.mean(0)).sum())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_training_step_with_the_load_balancing_loss_passes(family):
    model = _model(family)
    # the test's own record of what each router received in the check's forward
    routers = _routers(model)
    inputs: dict[int, torch.Tensor] = {}
    for i, router in enumerate(routers):
        router.register_forward_pre_hook(
            lambda m, a, i=i: inputs.__setitem__(i, a[0].detach().clone()))
    result = _audit(model)
    assert result.passed and not result.skipped, result.detail
    ev = result.evidence
    assert ev["train_mode"] and ev["coef"] == 0.02
    logits = torch.cat([nn.functional.linear(
        inputs[i].reshape(-1, 16).double(), r.weight.detach().double(),
        None if getattr(r, "bias", None) is None else r.bias.detach().double())
        for i, r in enumerate(routers)])  # (L N, E)
    assert ev["expected"] == pytest.approx(_switch_aux(logits, 4, 2), rel=1e-9)
    assert ev["added"] == pytest.approx(0.02 * ev["expected"], rel=1e-4)
    # every router's gradient holds the aux term, far above rounding
    assert len(ev["gradients"]) == len(routers)
    assert all(g["aux_gradient"] > 100 * g["allowed"] for g in ev["gradients"])


def test_a_dense_model_skips_it():
    model = hf_class("LlamaForCausalLM")(hf_class("LlamaConfig")(
        **{k: v for k, v in COMMON.items() if k not in ("num_experts_per_tok",
                                                         "router_aux_loss_coef")}))
    assert _audit(model).skipped


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_returned_router_logits_that_are_not_the_routers_fail(family):
    """The router returns its logits with the experts rolled by one (what it returns is not
    what it computed and chose from). The library's aux loss is computed from the returned
    tensor, so a check that recomputed it from them would agree; the router weight does not."""
    model = _model(family)

    def rolled(module, inputs, output):
        logits, weights, chosen = output
        return logits.roll(1, -1), weights, chosen

    result = _audit(_planted(model, rolled))
    assert not result.passed
    assert "layers.1" in result.detail and "differ" in result.detail, result.detail
    moved = {r["layer"]: r for r in result.evidence["router_logits"]}[1]
    assert moved["max_abs_diff"] > 100 * moved["allowed"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_returned_router_logits_already_softmaxed_fail(family):
    """The router returns probabilities where logits belong: the library then takes a softmax
    of a softmax in its aux loss, and agrees with itself."""
    model = _model(family)

    def softmaxed(module, inputs, output):
        logits, weights, chosen = output
        return logits.float().softmax(-1).to(logits.dtype), weights, chosen

    result = _audit(_planted(model, softmaxed))
    assert not result.passed
    assert "layers.1" in result.detail and "distribution" in result.detail, result.detail


def test_gpt_oss_router_logits_returned_without_their_bias_fail():
    """gpt-oss's router chooses and weighs by W x + b: logits returned without the bias are not
    what it chose from (the load-balancing loss then balances other experts' shares); the
    recomputation adds the bias the spec declares, so the returned tensor differs."""
    model = _model("gpt_oss")

    def unbiased(module, inputs, output):
        logits, *rest = output
        return (logits - module.bias, *rest)

    result = _audit(_planted(model, unbiased))
    assert not result.passed
    assert "layers.1" in result.detail and "differ" in result.detail, result.detail


def test_a_load_balancing_loss_left_out_of_the_loss_fails():
    model = _model()
    model.router_aux_loss_coef = 0.0  # the config says 0.02: the forward adds nothing
    report = da.audit(model, checks=["model_loss", "router_aux_loss"])
    result = report["router_aux_loss"]
    assert not result.passed and report["model_loss"].passed
    assert result.evidence["added"] == pytest.approx(0.0, abs=1e-5)
    assert "not added" in result.detail and "0.02" in result.detail


def test_a_load_balancing_loss_added_with_another_coefficient_fails():
    model = _model()
    model.router_aux_loss_coef = 0.05  # the config declares 0.02
    result = _audit(model)
    assert not result.passed
    ev = result.evidence
    assert ev["added"] == pytest.approx(0.05 * ev["expected"], rel=1e-4)
    assert "0.05" in result.detail and "0.02" in result.detail


def test_a_load_balancing_loss_added_detached_fails(monkeypatch):
    """Its value is right (loss = CE + 0.02 aux to the last digit), but no gradient of it
    reaches the routers: only the backward shows it."""
    modeling = __import__(type(_model()).__module__, fromlist=["load_balancing_loss_func"])
    stock = modeling.load_balancing_loss_func
    monkeypatch.setattr(modeling, "load_balancing_loss_func",
                        lambda *a, **k: stock(*a, **k).detach())
    result = _audit(_model())
    assert not result.passed
    assert result.evidence["added"] == pytest.approx(0.02 * result.evidence["expected"], rel=1e-4)
    assert "detached" in result.detail, result.detail


def test_a_load_balancing_loss_off_its_formula_fails(monkeypatch):
    """The formula without its factor E (the mean over experts instead of the sum times E)."""
    modeling = __import__(type(_model()).__module__, fromlist=["load_balancing_loss_func"])
    stock = modeling.load_balancing_loss_func
    monkeypatch.setattr(modeling, "load_balancing_loss_func", lambda *a, **k: stock(*a, **k) / 4)
    result = _audit(_model())
    assert not result.passed
    assert result.evidence["aux_loss"] == pytest.approx(result.evidence["expected"] / 4, rel=1e-4)


def test_the_expected_aux_loss_is_the_switch_transformer_formula():
    """The gate's aux (router_loss.load_balancing) against the definition written above, on
    random logits, and its tie bounds: a token whose k-th and (k+1)-th logits are equal may
    route either way, so the bounds span both choices."""
    from decoder_audit.gate.checks.router_loss import load_balancing

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 4, generator=gen, dtype=torch.float64)
    aux, info = load_balancing(logits, 4, 2, torch.float32)
    assert float(aux) == pytest.approx(_switch_aux(logits, 4, 2), rel=1e-12)
    assert info["near_ties"] == 0 and info["bounds"][0] == info["bounds"][1]
    tied = logits.clone()
    tied[0] = torch.tensor([3.0, 1.0, 1.0, -2.0], dtype=torch.float64)  # 2nd and 3rd tie
    _, info = load_balancing(tied, 4, 2, torch.float32)
    swapped = tied.clone()
    swapped[0] = torch.tensor([3.0, 1.0 - 1e-9, 1.0, -2.0], dtype=torch.float64)
    either = sorted([_switch_aux(tied, 4, 2), _switch_aux(swapped, 4, 2)])
    assert info["near_ties"] == 1
    assert info["bounds"][0] == pytest.approx(either[0], abs=1e-8)
    assert info["bounds"][1] == pytest.approx(either[1], abs=1e-8)


def test_gpt_oss_older_router_form_is_read_by_the_routing_checks():
    """gpt-oss in 4.55 to 4.57: its router returns (weights (N, E), indices), not transformers
    5's (logits, weights, indices). routing_independence reads its weights and expert_gradients
    forces its choice through that form: a correct model passes both (they raised on the tuple
    before); a router whose weights come from another row of the batch fails
    routing_independence. Transformers 5 skips (the 3-tuple form is tested above)."""
    model = _read("gpt_oss", _built("gpt_oss"))
    router = _routers(model)[-1]
    with torch.no_grad():
        form = router(torch.zeros(3, COMMON["hidden_size"]))
    if len(form) != 2:
        pytest.skip(f"transformers {tf.__version__}'s gpt-oss router returns {len(form)} values")
    report = da.audit(model, checks=["routing_independence", "expert_gradients"])
    assert report.passed, report.first_failure

    def from_the_next_row(module, inputs, output):
        weights, chosen = output  # (N, E), (N, k): token n given token n + 1's weights
        return weights.roll(-1, 0), chosen.roll(-1, 0)

    router.register_forward_hook(from_the_next_row)
    result = da.audit(model, checks=["routing_independence"])["routing_independence"]
    assert not result.passed, result.detail
