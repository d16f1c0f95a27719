"""A declared architecture checked on decoders written by others (`audit(model, spec=cfg)`):
each style's correct model passes every check, with params, tying, tying_grad, oracle and
dead_parameters run; each planted numerics defect fails the check that owns it; the layouts are
placed as the converter places them; what cannot be placed is named, never guessed."""

from __future__ import annotations

import configs
import pytest
import torch
import zoo_styles
from hf_compat import hf_class
from torch import nn

import decoder_audit as da
from decoder_audit.references import layouts

WHITE_BOX = ("params", "tying", "oracle", "dead_parameters")


@pytest.mark.parametrize("style", sorted(zoo_styles.STYLES))
def test_each_style_passes_against_its_spec_with_the_white_box_checks_run(style):
    spec = zoo_styles.SPECS[style]
    model = zoo_styles.STYLES[style]()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.random.get_rng_state()
    report = da.audit(model, spec=spec)
    assert report.passed, report.first_failure
    assert torch.equal(torch.random.get_rng_state(), rng)  # stress drawn from the gate's own
    for name in WHITE_BOX + (("tying_grad",) if spec.tie_embeddings else ()):
        assert report[name].passed and not report[name].skipped, name
    oracle = report["oracle"].evidence
    assert oracle["stressed"] and oracle["gradients"]["compared"] == len(before)
    assert oracle["dtype"] == "torch.float32" and oracle["batch"] != oracle["seq_len"]
    # float32 against float64: 256 ulps of the logit scale (tolerances.SHAPE_CHANGE_ULPS)
    assert report["oracle"].tolerance == 256 * torch.finfo(torch.float32).eps
    params = report["params"].evidence
    assert params["measured_total"] == da.parameter_ledger(spec).total
    assert sum(params["analytic"].values()) == sum(params["measured"].values()) == \
        params["analytic_total"]
    # the stress weights were written into the model and every one restored bit for bit
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


CASES = [(style, defect, check) for style, defects in sorted(zoo_styles.DEFECTS.items())
         for defect, check in defects.items()]


@pytest.mark.parametrize("style, defect, check", CASES,
                         ids=[f"{s}-{d}" for s, d, _ in CASES])
def test_each_planted_defect_fails_its_check(style, defect, check):
    report = da.audit(zoo_styles.STYLES[style](defect), spec=zoo_styles.SPECS[style])
    assert check in [c.name for c in report.failures], report.first_failure
    # the behavioural checks cannot see these: each keeps the model causal and shape-correct
    assert report["causal"].passed and report["shapes"].passed


def test_without_a_spec_tying_and_dead_parameters_still_run():
    """A learner's tied GPT without --spec: the tie is judged structurally and every weight must
    get a gradient; the ledger and the oracle are skipped, saying what would run them."""
    report = da.audit(zoo_styles.NanoGPT(), vocab_size=zoo_styles.V,
                      max_seq_len=zoo_styles.T)
    assert report.passed
    assert report["tying"].passed and report.facts.tie == "one Parameter"
    assert report["tying_grad"].passed and report["dead_parameters"].passed
    for name in ("params", "oracle"):
        assert report[name].skipped and "spec" in report[name].evidence["reason"]


def test_the_stage_that_first_differs_is_named():
    spec = zoo_styles.SPECS["tune"]
    report = da.audit(zoo_styles.TuneLlama("no_final_norm"), spec=spec)
    assert "final norm" in report["oracle"].detail
    model = zoo_styles.TuneLlama()
    model.layers[1].mlp_norm.eps = 1e-1  # layer 0 still computes what the spec says
    report = da.audit(model, spec=spec)
    assert report["oracle"].evidence["as_initialised"]["first_stage"].startswith("layer 1")
    model = zoo_styles.TuneLlama()
    model.layers[0].mlp_norm.eps = 1e-1
    report = da.audit(model, spec=spec)
    assert report["oracle"].evidence["as_initialised"]["first_stage"].startswith("layer 0")


def test_a_spec_the_weights_do_not_fit_is_a_params_failure_naming_every_difference():
    spec = zoo_styles.SPECS["nanogpt"].replace(n_layers=3)  # the module has two blocks
    report = da.audit(zoo_styles.NanoGPT(), spec=spec)
    failed = [c.name for c in report.failures]
    assert "params" in failed and "oracle" in failed
    differences = " ".join(report["params"].evidence["differences"])
    assert "layers.2.attn.q_proj.weight" in differences and "layers.2.ln1.weight" in differences


def test_a_module_of_no_known_layout_needs_a_weights_map():
    class Renamed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = zoo_styles.ScratchGPT()

        def forward(self, ids):
            return self.inner(ids)

    spec = zoo_styles.SPECS["scratch"]
    # a wrapper's prefix is found ("inner.")
    assert da.audit(Renamed(), spec=spec, checks=["params"]).passed
    odd = zoo_styles.ScratchGPT()
    odd.emb = odd.tok_emb  # rename: no layout's embedding name is left
    del odd.tok_emb
    odd.forward = lambda ids: odd.out_head(odd.final_norm(odd.trf_blocks(
        odd.emb(ids) + odd.pos_emb(torch.arange(ids.shape[1])))))
    report = da.audit(odd, spec=spec, checks=["params", "oracle"])
    # fail closed: a declared spec that could not be checked is never a skip, nor a pass
    assert not report.passed
    for name in ("params", "oracle"):
        result = report[name]
        assert not result.passed and not result.skipped
        assert "weights_map" in result.detail and "token_embeddings.weight" in result.detail
        assert "tok_emb.weight" in result.detail  # what was looked for
        assert result.evidence["placed"] is False
    whole = da.audit(odd, spec=spec)
    assert not whole.passed and {"params", "oracle"} <= {c.name for c in whole.failures}

    def weights_map(state):
        renamed = {("tok_emb" + name[3:] if name.startswith("emb.") else name): t
                   for name, t in state.items()}
        return layouts.detect(renamed, spec).canonical(renamed)

    report = da.audit(odd, spec=spec, weights_map=weights_map, checks=["params", "oracle"])
    assert report.passed, report.first_failure
    assert report["oracle"].evidence["stressed"]  # the map's tensors are views: stress written


def test_a_weights_map_that_misses_a_weight_is_named():
    spec = zoo_styles.SPECS["tune"]
    model = zoo_styles.TuneLlama()

    def partial(state):
        full = layouts.detect(state, spec).canonical(state)
        return {name: t for name, t in full.items() if name != "layers.1.ffn.w3.weight"}

    report = da.audit(model, spec=spec, weights_map=partial, checks=["params", "oracle"])
    assert not report["params"].passed and not report["oracle"].passed
    assert "layers.1.ffn.w3.weight" in report["params"].detail
    assert "layers.1.mlp.w3.weight" in report["params"].evidence["leftover"]


def test_a_spec_that_disagrees_with_our_own_config_is_refused():
    model = da.Decoder(da.preset("tiny-368"))
    assert da.audit(model, spec=da.preset("tiny-368"), checks=["params"]).passed
    with pytest.raises(da.ConfigError, match="d_model"):
        da.audit(model, spec=da.preset("tiny-368").replace(d_model=8, n_heads=2))
    with pytest.raises(da.ConfigError, match="spec"):
        da.audit(zoo_styles.NanoGPT(), vocab_size=zoo_styles.V, weights_map=lambda s: s)


# ---- layouts placed as the converter places them ------------------------------------------

def _gpt2(tie: bool):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=29, n_embd=24, n_layer=2, n_head=6, n_positions=16,
                           tie_word_embeddings=tie)
    return tf.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_conv1d_layout_gives_the_converters_weights(tie):
    """The placement reads GPT-2's Conv1D (in, out) matrices transposed, its square c_proj too,
    and splits c_attn into q, k, v: the same tensors `from_hf` copies out."""
    from decoder_audit.references.hf import from_hf

    model = _gpt2(tie)
    converted = from_hf(model)
    named = dict(model.named_parameters(remove_duplicate=False))
    placement = layouts.detect(named, converted.config)
    assert placement.layout == "nanoGPT / GPT-2" and not placement.problems
    assert not placement.leftover
    mapped = placement.canonical({n: t.detach() for n, t in named.items()})
    expected = converted.state_dict()
    assert set(mapped) == set(expected) | {"lm_head.weight"}
    for name, tensor in expected.items():
        assert torch.equal(mapped[name], tensor), name


def test_hugging_face_llama_placed_with_rotate_half_equals_the_oracle():
    """Llama's weights as they lie (no permutation) under the spec that says its RoPE rotates
    halves: the oracle equals transformers' own forward."""
    tf = pytest.importorskip("transformers")
    from decoder_audit.references.hf import hf_spec

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=29, hidden_size=24, num_hidden_layers=2,
                            num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
                            max_position_embeddings=32, bos_token_id=0, eos_token_id=1)
    model = tf.LlamaForCausalLM(config).eval()
    spec = hf_spec(model)
    assert spec.rope_layout == "rotate_half"
    named = dict(model.named_parameters(remove_duplicate=False))
    mapped = layouts.detect(named, spec).canonical({n: t.detach().double()
                                                    for n, t in named.items()})
    ids = torch.randint(0, 29, (2, 9))
    with torch.no_grad():
        want = model.double()(ids).logits.double()  # 4.45 returns float32 logits
    torch.testing.assert_close(da.oracle_logits(mapped, spec, ids), want, atol=1e-5, rtol=0)


def _llama(tie: bool = False):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=12, tie_word_embeddings=tie,
                            bos_token_id=0, eos_token_id=1, attn_implementation="eager")
    return tf.LlamaForCausalLM(config).eval()


def _untied_copy(model):
    model.lm_head.weight = nn.Parameter(model.model.embed_tokens.weight.detach().clone())


def _extra_linear(model):
    model.model.extra = nn.Linear(16, 16)


def _eps(model):
    for layer in model.model.layers:
        layer.input_layernorm.variance_epsilon = 1e-2


def _scale(model):
    for layer in model.model.layers:
        attention = layer.self_attn
        if hasattr(attention, "scaling"):
            attention.scaling = 1.0 / attention.head_dim
        else:  # before 4.48 the scale is a literal: the same scores through q scaled
            factor = attention.head_dim ** -0.5
            attention.q_proj.register_forward_hook(lambda _m, _i, out: out * factor)


def _final_norm_missing(model):
    model.model.norm = nn.Identity()


HF_DEFECTS = {"untied_copy": (True, _untied_copy, "tying"),
              "extra_linear": (False, _extra_linear, "params"),
              "eps": (False, _eps, "oracle"), "scale": (False, _scale, "oracle"),
              "final_norm_missing": (False, _final_norm_missing, "params")}


def test_hugging_face_llama_needs_no_argument_and_passes():
    report = da.audit(_llama(), vocab_size=37)
    assert report.passed, report.first_failure
    assert report.facts.spec is not None and report.facts.reference == "spec"
    assert report["params"].passed and report["oracle"].evidence["stressed"]


@pytest.mark.parametrize("name", sorted(HF_DEFECTS))
def test_hugging_face_llama_defects_fail_against_its_config(name):
    tie, plant, check = HF_DEFECTS[name]
    model = _llama(tie)
    plant(model)
    report = da.audit(model, vocab_size=37)
    assert check in [c.name for c in report.failures], report.first_failure
    assert not report["oracle"].skipped


def test_above_the_gradient_limit_only_the_logits_are_compared(monkeypatch):
    from decoder_audit.gate.checks import spec as spec_checks

    monkeypatch.setattr(spec_checks, "GRADIENT_MAX_PARAMETERS", 1000)
    report = da.audit(zoo_styles.TuneLlama(), spec=zoo_styles.SPECS["tune"], checks=["oracle"])
    evidence = report["oracle"].evidence
    assert report.passed and evidence["stressed"] and "gradients" not in evidence
    assert "1,000" in report["oracle"].detail
    # the logits comparison alone still sees a wrong RoPE base
    report = da.audit(zoo_styles.TuneLlama("theta"), spec=zoo_styles.SPECS["tune"],
                      checks=["oracle"])
    assert not report.passed


def test_a_weights_map_that_copies_is_stressed_through_its_copies():
    """A map returning clones: the stress weights reach the module by where the map's probe
    says each value comes from, and every gradient is compared (spec_weights_map tests more)."""
    spec = zoo_styles.SPECS["scratch"]

    def copies(state):
        return {name: t.clone() for name, t in layouts.detect(state, spec).canonical(state).items()}

    model = zoo_styles.ScratchGPT()
    report = da.audit(model, spec=spec, weights_map=copies, checks=["params", "oracle"])
    assert report.passed, report.first_failure
    evidence = report["oracle"].evidence
    assert evidence["stressed"] and evidence["gradients"]["compared"] == len(
        list(model.parameters()))
    # what each canonical weight is made of is followed through the copy
    assert not report["params"].evidence["leftover"]
    report = da.audit(zoo_styles.ScratchGPT("eps"), spec=spec, weights_map=copies,
                      checks=["oracle"])
    assert not report.passed


def _twin_map(state):
    """The torch.nn twin's names (nn.MultiheadAttention's fused in_proj, an nn.Sequential MLP)
    on the canonical ones: chunks of in_proj are views, so the stress weights reach it."""
    out = {"token_embeddings.weight": state["token_embedding.weight"],
           "position_embeddings.weight": state["position"],
           "ln_final.weight": state["ln_final.weight"], "ln_final.bias": state["ln_final.bias"],
           "lm_head.weight": state["readout.weight"]}
    layers = {name.split(".")[1] for name in state if name.startswith("blocks.")}
    for i in sorted(layers):
        b, o = f"blocks.{i}", f"layers.{i}"
        for part in ("weight", "bias"):
            for norm in ("ln1", "ln2"):
                out[f"{o}.{norm}.{part}"] = state[f"{b}.{norm}.{part}"]
            fused = state[f"{b}.attn.in_proj_{part}"].chunk(3)
            for name, tensor in zip(("q_proj", "k_proj", "v_proj"), fused):
                out[f"{o}.attn.{name}.{part}"] = tensor
            out[f"{o}.attn.output_proj.{part}"] = state[f"{b}.attn.out_proj.{part}"]
            out[f"{o}.ffn.w1.{part}"] = state[f"{b}.mlp.0.{part}"]
            out[f"{o}.ffn.w2.{part}"] = state[f"{b}.mlp.2.{part}"]
    return out


def test_the_torch_twin_passes_its_own_config_as_spec_through_a_weights_map():
    """nn.MultiheadAttention and nn.LayerNorm, not our code: the twin carries our DecoderConfig
    but not our names, so without a spec it is a black box; with its config as the spec and a
    weights_map every white-box check runs on it."""
    import configs

    from decoder_audit.references.torch_twin import TorchTwin

    cfg = configs.named("twin-gelutanh-biases-tied")
    torch.manual_seed(0)
    twin = TorchTwin(cfg).eval()
    assert da.audit(twin, checks=["oracle"])["oracle"].skipped
    report = da.audit(twin, spec=cfg, weights_map=_twin_map)
    assert report.passed, report.first_failure
    for name in ("params", "tying", "tying_grad", "oracle"):
        assert report[name].passed and not report[name].skipped, name
    assert report["oracle"].evidence["stressed"]


def _qwen(family: str, head_dim: int = 4):
    name = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    config_class, model_class = hf_class(f"{name}Config"), hf_class(f"{name}ForCausalLM")
    torch.manual_seed(0)
    config = config_class(vocab_size=37, hidden_size=16, intermediate_size=24,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=head_dim, bos_token_id=0, eos_token_id=1)
    return model_class(config).eval()


@pytest.mark.parametrize("family, head_dim", [("qwen2", 4), ("qwen3", 4), ("qwen3", 8)])
def test_qwen_attention_variants_are_their_configs_spec(family, head_dim):
    """Qwen2's q/k/v biases without an output bias, Qwen3's per-head q/k RMSNorm (and its heads
    wider than D / H, as in Qwen3 0.6B): read from the config, placed, and proven against the
    oracle with no argument."""
    model = _qwen(family, head_dim)
    report = da.audit(model)
    assert report.passed, report.first_failure
    spec = report.facts.spec
    assert (spec.attn_bias, spec.output_bias, spec.qk_norm) == (
        (True, False, False) if family == "qwen2" else (False, False, True))
    assert report["params"].passed and report["oracle"].evidence["stressed"]
    assert spec.head_dim == head_dim


def test_qwen_variant_defects_fail_params_naming_the_weight():
    model = _qwen("qwen3")
    model.model.layers[1].self_attn.q_norm = nn.Identity()  # the q norm dropped from one layer
    report = da.audit(model)
    assert "layers.1.attn.q_norm.weight" in report["params"].detail
    model = _qwen("qwen2")
    layer = model.model.layers[0].self_attn
    layer.o_proj = nn.Linear(16, 16, bias=True)  # an output bias Qwen2 does not have
    report = da.audit(model)
    assert not report["params"].passed
    assert any("layers.0.attn.output_proj.bias" in d and "attn_output_bias=False" in d
               for d in report["params"].evidence["differences"])


def test_a_gradient_only_defect_fails_the_oracle_naming_the_weight():
    """A weight detached inside the forward: every logit is right, its gradient is not."""
    report = da.audit(zoo_styles.TuneLlama("detached_weight"), spec=zoo_styles.SPECS["tune"])
    oracle = report["oracle"]
    assert not oracle.passed and oracle.tolerance is not None
    assert oracle.evidence["stress"]["max_abs_logit_error"] <= oracle.evidence["stress"]["allowed"]
    grads = oracle.evidence["gradients"]
    assert grads["max_abs_grad_error"] > grads["allowed"]
    assert grads["worst_parameter"].endswith("mlp.w2.weight")
    assert grads["worst_parameter"] in oracle.detail


def test_post_norm_is_traced_to_the_first_block():
    """Post-norm changes what leaves block 0 (the stage is the block, not its norm's input)."""
    report = da.audit(zoo_styles.NanoGPT("post_norm"), spec=zoo_styles.SPECS["nanogpt"],
                      checks=["oracle"])
    assert report["oracle"].evidence["as_initialised"]["first_stage"].startswith("layer 0")


def test_weights_the_spec_does_not_have_are_named_with_the_field_that_says_so():
    spec = zoo_styles.SPECS["nanogpt"].replace(mlp_bias=False)  # the module has MLP biases
    report = da.audit(zoo_styles.NanoGPT(), spec=spec, checks=["params"])
    differences = report["params"].evidence["differences"]
    assert any("layers.0.ffn.w1.bias" in d and "mlp_bias=False" in d for d in differences)
    assert not report["params"].evidence["leftover"]  # named as the bias it is, not left over
    spec = zoo_styles.SPECS["scratch"].replace(attn_bias=False)
    differences = da.audit(zoo_styles.ScratchGPT(), spec=spec,
                           checks=["params"])["params"].evidence["differences"]
    assert any("layers.1.attn.k_proj.bias" in d and "attn_bias=False" in d for d in differences)


def test_missing_weights_fail_the_oracle_naming_the_first():
    spec = zoo_styles.SPECS["tune"].replace(n_layers=3)
    report = da.audit(zoo_styles.TuneLlama(), spec=spec, checks=["oracle"])
    oracle = report["oracle"]
    assert not oracle.passed and oracle.tolerance is not None
    assert oracle.evidence["missing"][0] == "layers.2.ln1.weight"
    assert "layers.2.ln1.weight" in oracle.detail and str(len(oracle.evidence["missing"])) in \
        oracle.detail


def test_a_weights_map_may_list_the_tied_head_first():
    """The tie counts once, as the embedding, whichever name the map gives first."""
    spec = zoo_styles.SPECS["nanogpt"]

    def head_first(state):
        mapped = layouts.detect(state, spec).canonical(state)
        return {"lm_head.weight": mapped.pop("lm_head.weight"), **mapped}

    report = da.audit(zoo_styles.NanoGPT(), spec=spec, weights_map=head_first,
                      checks=["params"])
    assert report.passed, report.first_failure


def test_a_weights_map_may_give_a_constant_for_a_weight_the_module_lacks():
    """A zero bias made up by the map is a tensor of no parameter: the ledger says so."""
    spec = zoo_styles.SPECS["tune"].replace(mlp_bias=True)

    def zero_biases(state):
        mapped = layouts.detect(state, zoo_styles.SPECS["tune"]).canonical(state)
        for name in [n for n in mapped if ".ffn." in n]:
            mapped[name.replace(".weight", ".bias")] = torch.zeros(mapped[name].shape[0])
        return mapped

    report = da.audit(zoo_styles.TuneLlama(), spec=spec, weights_map=zero_biases,
                      checks=["params", "oracle"])
    assert report["oracle"].passed  # zero biases: the same function
    assert not report["params"].passed
    assert any("ffn" in d for d in report["params"].evidence["differences"])


@pytest.mark.parametrize("spec, weights_map, named", [
    ({"vocab_size": 37}, None, "spec"), (zoo_styles.SPECS["tune"], "not a function", "weights_map"),
])
def test_a_spec_that_is_not_a_config_or_a_map_that_is_not_a_function_is_refused(
        spec, weights_map, named):
    with pytest.raises(da.ConfigError, match=named):
        da.audit(zoo_styles.TuneLlama(), spec=spec, weights_map=weights_map)


def test_a_block_the_forward_never_runs_is_named_as_that_stage():
    report = da.audit(zoo_styles.NanoGPT("skipped_block"), spec=zoo_styles.SPECS["nanogpt"],
                      checks=["oracle"])
    stage = report["oracle"].evidence["as_initialised"]["first_stage"]
    assert stage.startswith("unknown") and "layer 1" in stage  # block 1's module never ran


def test_the_oracle_reports_its_progress_and_the_gradient_limit_is_inclusive(monkeypatch):
    from decoder_audit.gate.checks import spec as spec_checks

    model = zoo_styles.TuneLlama()
    monkeypatch.setattr(spec_checks, "GRADIENT_MAX_PARAMETERS",
                        sum(p.numel() for p in model.parameters()))
    steps = []
    report = da.audit(model, spec=zoo_styles.SPECS["tune"], checks=["oracle"],
                      progress=lambda check, step: steps.append((check, step)))
    assert "gradients" in report["oracle"].evidence  # exactly at the limit: still compared
    assert any(check == "oracle" and "layer 2/2" in step for check, step in steps)


def test_nanogpt_without_biases_is_its_spec_with_norm_bias_false():
    """nanoGPT's bias=False: LayerNorms without a shift and Linears without biases."""
    spec = zoo_styles.SPECS["nanogpt"].replace(norm_bias=False, attn_bias=False, mlp_bias=False)
    report = da.audit(zoo_styles.NanoGPT(bias=False), spec=spec)
    assert report.passed, report.first_failure
    assert report["params"].evidence["measured_total"] == da.parameter_ledger(spec).total
    # against the spec with biases, each missing shift is named with the field that asks for it
    report = da.audit(zoo_styles.NanoGPT(bias=False), spec=zoo_styles.SPECS["nanogpt"],
                      checks=["params"])
    assert any("layers.0.ln1.bias" in d for d in report["params"].evidence["differences"])


def _gemma():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.GemmaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=12, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return tf.GemmaForCausalLM(config).eval()


def _unscaled_embedding(model):
    embedding = model.model.embed_tokens
    if hasattr(embedding, "embed_scale"):
        embedding.embed_scale.fill_(1.0)
    else:  # transformers 4: the model scales the embedding's output by sqrt(D) itself
        embedding.register_forward_hook(lambda _m, _i, out: out / model.config.hidden_size ** 0.5)


def _exact_gelu_gate(model):
    model.model.layers[1].mlp.act_fn = nn.GELU()  # the spec's GeGLU gate is tanh GELU


def test_gemma_is_its_configs_spec_and_its_defects_fail_the_oracle():
    """Gemma: GeGLU, RMSNorm gains 1 + w, the embedding scaled by sqrt(D), heads of 12 over a
    width of 16, tied; read from its config with no argument."""
    report = da.audit(_gemma())
    assert report.passed, report.first_failure
    spec = report.facts.spec
    assert (spec.mlp, spec.norm_offset, spec.embedding_scale, spec.head_dim) == \
        ("geglu", 1.0, 4.0, 12)
    assert report["oracle"].evidence["stressed"] and report["tying_grad"].passed
    for plant in (_unscaled_embedding, _exact_gelu_gate):
        model = _gemma()
        plant(model)
        report = da.audit(model, checks=["oracle"])
        assert not report["oracle"].passed, plant.__name__


def test_the_oracle_check_is_reproducible():
    """Its ids, stress weights and gradient projection are drawn from the gate's seeds: the
    same model gives the same evidence twice."""
    model = zoo_styles.TuneLlama()  # built once: torch's global RNG moves between the audits
    runs = []
    for _ in range(2):
        runs.append(da.audit(model, spec=zoo_styles.SPECS["tune"],
                             checks=["oracle"])["oracle"].evidence)
        torch.rand(7)
    assert runs[0]["as_initialised"] == runs[1]["as_initialised"]
    assert runs[0]["stress"] == runs[1]["stress"]


def test_a_weights_map_sees_shape_only_stand_ins_of_the_modules_dtype():
    """The map is first run on meta tensors (nothing allocated for a large model) in each
    parameter's own dtype, so a map that casts or checks dtypes sees what it will see later."""
    seen = []

    def recording(state):
        seen.append({(t.device.type, t.dtype) for t in state.values()})
        return _twin_map(state)

    from decoder_audit.references.torch_twin import TorchTwin

    cfg = configs.named("twin-gelutanh-biases-tied")
    twin = TorchTwin(cfg).double()
    report = da.audit(twin, spec=cfg, weights_map=recording, checks=["params"])
    assert report.passed and seen[0] == {("meta", torch.float64)}
    # the report names the map: its function's name, or a callable object's class
    assert "recording" in report["params"].evidence["layout"]

    class Mapper:
        def __call__(self, state):
            return _twin_map(state)

    report = da.audit(twin, spec=cfg, weights_map=Mapper(), checks=["params"])
    assert "Mapper" in report["params"].evidence["layout"]


class _ReadsOutWithTheEmbedding(nn.Module):
    """nanoGPT with no lm_head module at all: logits = h @ wte.weight^T (a tie by the forward)."""

    def __init__(self):
        super().__init__()
        self.inner = zoo_styles.NanoGPT()
        del self.inner.lm_head

    def forward(self, ids):
        gpt = self.inner
        pos = torch.arange(ids.shape[1])
        x = gpt.transformer.wte(ids) + gpt.transformer.wpe(pos)
        for block in gpt.transformer.h:
            x = block(x)
        return gpt.transformer.ln_f(x) @ gpt.transformer.wte.weight.T


def test_a_readout_by_the_embedding_itself_is_the_tied_head_under_a_wrapper():
    report = da.audit(_ReadsOutWithTheEmbedding(), spec=zoo_styles.SPECS["nanogpt"],
                      checks=["params", "oracle"], max_seq_len=None)
    assert report.passed, report.first_failure
    assert report["params"].evidence["layout"] == "nanoGPT / GPT-2 (under 'inner')"


class _Wrapped(nn.Module):
    """Our Decoder inside a module of its own (no config of its own: the spec is the claim)."""

    def __init__(self, cfg):
        super().__init__()
        self.inner = da.Decoder(cfg)

    def forward(self, ids):
        return self.inner(ids)


def test_a_sandwich_norm_or_a_position_table_the_spec_lacks_names_its_field():
    gemma2 = configs.named("gemma2-like")
    report = da.audit(_Wrapped(gemma2), spec=gemma2.replace(sandwich_norm=False),
                      checks=["params"])
    assert any("ln1_post.weight" in d and "sandwich_norm=False" in d
               for d in report["params"].evidence["differences"])
    olmo = configs.named("olmo-like")  # its norms learn nothing; a module whose norms learn
    report = da.audit(_Wrapped(olmo.replace(norm_affine=True, norm_bias=True)), spec=olmo,
                      checks=["params"])
    assert any("ln1.weight" in d and "norm_affine=False" in d
               for d in report["params"].evidence["differences"])
    nobias = configs.named("ln-nobias-tied")  # a shift where the spec has none
    report = da.audit(_Wrapped(nobias.replace(norm_bias=True)), spec=nobias, checks=["params"])
    assert any("ln1.bias" in d and "norm_bias=False" in d and "norm_affine" not in d
               for d in report["params"].evidence["differences"])
    learned = da.preset("tiny-368")
    report = da.audit(_Wrapped(learned), spec=learned.replace(pos="rope"), checks=["params"])
    assert any("position_embeddings.weight" in d and "pos='rope'" in d
               for d in report["params"].evidence["differences"])


def test_torchtunes_q_and_k_norms_are_found_under_their_scale_names():
    """torchtune names a norm's gain `scale`, its q/k norms too (Qwen3 in torchtune)."""
    spec = zoo_styles.SPECS["tune"].replace(qk_norm=True)
    report = da.audit(zoo_styles.TuneLlama(qk_norm=True), spec=spec, checks=["params", "oracle"])
    assert report.passed, report.first_failure
    assert report["oracle"].evidence["gradients"]["compared"] == len(
        list(zoo_styles.TuneLlama(qk_norm=True).parameters()))
