"""The white-box weight checks (gate/checks/weights.py): params, tying, tying_grad."""

from __future__ import annotations

import pytest
import torch
import zoo

import decoder_audit as da
from decoder_audit.accounting.ledger import parameter_ledger
from decoder_audit.gate.checks import weights


def _seen(d_lookup, d_logits, h) -> dict[str, torch.Tensor]:
    """What the forward hooks keep: the gradients the lookup's and the readout's outputs
    received, and the readout's input."""
    return {"lookup_grads": [d_lookup], "readout_grads": [d_logits], "readout_in": h}


@pytest.mark.parametrize("row_block", [2, 2048])
def test_tied_gradient_sums_match_the_formula_at_small_scale(monkeypatch, row_block):
    """weights._compare_path_sums against dW = d_logits^T h + scatter(ids, d_lookup), written
    out with a Python loop, at gradients far below 1 (a fresh model's): `expected_max` must be
    the largest |expected| itself, not floored at 1 (mutant `expected_max: 1.0` made the
    tolerance tol * 1 instead of tol * max|expected|), `error` exactly the planted error."""
    monkeypatch.setattr(weights, "ROW_BLOCK", row_block)  # several row blocks, then one
    gen = torch.Generator().manual_seed(0)
    vocab, dim, batch, seq_len = 5, 3, 2, 3
    ids = torch.tensor([[0, 3, 3], [4, 0, 1]])  # (B, T); row 2 never looked up
    d_lookup = 1e-3 * torch.randn(batch, seq_len, dim, generator=gen, dtype=torch.float64)
    d_logits = 1e-3 * torch.randn(batch, seq_len, vocab, generator=gen, dtype=torch.float64)
    h = torch.randn(batch, seq_len, dim, generator=gen, dtype=torch.float64)
    readout = torch.zeros(vocab, dim, dtype=torch.float64)
    expected = torch.zeros(vocab, dim, dtype=torch.float64)
    for b in range(batch):
        for t in range(seq_len):
            for v in range(vocab):
                readout[v] += d_logits[b, t, v] * h[b, t]
            expected[ids[b, t]] += d_lookup[b, t]
    expected += readout
    emb = torch.zeros(vocab, dim, dtype=torch.float64, requires_grad=True)
    emb.grad = expected.clone()
    emb.grad[2, 1] += 1e-9  # the planted error, on a row no id looks up
    # private: the block-by-block sums at row blocks of 2 (ROW_BLOCK patched) are not visible
    # through audit(), which reports only the largest error
    sums = weights._compare_path_sums(emb, ids, _seen(d_lookup, d_logits, h), vocab)
    # the scale of the comparison: the largest of either path's sum and the readout path alone
    scale = max(float(expected.abs().max()), float(readout.abs().max()))
    assert sums["expected_max"] == pytest.approx(scale, rel=1e-12)
    assert scale < 0.1
    assert sums["readout_max"] == pytest.approx(float(readout.abs().max()), rel=1e-12)
    assert sums["error"] == pytest.approx(1e-9, rel=1e-6)
    assert sums["shared_minus_lookup"] == pytest.approx(
        float((emb.grad - (expected - readout)).abs().max()), rel=1e-12)


def test_a_params_failure_names_the_component_and_the_total():
    """check_params with two differences (one extra bias of D in layer 0, hence the total too)
    says both, the first and the last (mutant `len(problems) == 1 or True` kept the first
    only, so the detail no longer said the total was off)."""
    extra = zoo.TINY.d_model
    total = parameter_ledger(zoo.TINY).total
    detail = da.audit(zoo.extra_attention_bias(), checks=["params"])["params"].detail
    assert "layers.0.attn" in detail and f"(+{extra})" in detail
    assert f"total: analytic {total} vs measured {total + extra}" in detail


def test_a_declared_tie_that_holds_says_it_is_one_parameter_object():
    """The passing `tying` names what was verified: the readout found, the object identity."""
    tying = da.audit(zoo.decoder(zoo.TINY), checks=["tying"])["tying"]
    assert zoo.TINY.tie_embeddings and tying.passed
    assert tying.evidence["readout"] == "lm_head" and tying.evidence["structure"] == "one Parameter"
    assert "lm_head.weight" in tying.detail and "one Parameter" in tying.detail


def test_two_parameters_over_one_storage_are_named_as_such():
    """The shared-storage failure says what is wrong in the words of the contract: two
    Parameter objects (mutant: 'parameter objects', which the zoo's substring did not see)."""
    tying = da.audit(zoo.shared_storage_readout(), checks=["tying"])["tying"]
    assert not tying.passed and tying.evidence["structure"] == "shared storage"
    assert "two Parameter objects" in tying.detail and "one storage" in tying.detail


def test_tying_grad_fails_when_the_lookup_bypasses_its_module():
    """A model whose token lookup never goes through the token_embeddings module's call (no
    hook can see it) cannot show the tied gradient's two paths: `tying_grad` fails and says so
    (it names the readout it watched)."""
    model = zoo.decoder(zoo.TINY)
    lookup = model.token_embeddings

    class Unhooked(type(lookup)):
        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)  # nn.Module.__call__ runs the hooks; this not

    lookup.__class__ = Unhooked
    tying_grad = da.audit(model, checks=["tying_grad"])["tying_grad"]
    assert not tying_grad.passed
    assert "never run" in tying_grad.detail and "lm_head" in tying_grad.detail


class _ZeroInitBranch(torch.nn.Module):
    """Our tiny decoder with a low-rank branch on its readout, initialised as LoRA is: A random,
    B zero, so A's gradient is exactly 0 until B leaves zero. `dead=True` adds a Linear nothing
    calls."""

    def __init__(self, dead: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = da.Decoder(da.preset("tiny-368"))
        self.lora_a = torch.nn.Parameter(torch.randn(2, 4) * 0.1)  # (r, D)
        self.lora_b = torch.nn.Parameter(torch.zeros(8, 2))  # (V, r)
        self.unused = torch.nn.Linear(4, 4) if dead else None

    def forward(self, ids):
        logits, trace = self.inner.run_with_trace(ids)
        hidden = trace["ln_final"] if "ln_final" in trace else None
        return logits + (hidden @ self.lora_a.T @ self.lora_b.T if hidden is not None else 0)


def test_a_factor_behind_a_zero_initialised_partner_is_reached_not_dead():
    model = _ZeroInitBranch()
    check = da.audit(model, vocab_size=8, max_seq_len=4, checks=["dead_parameters"])[
        "dead_parameters"]
    assert check.passed, check.detail
    assert check.evidence["behind_zero_init"] == {"lora_a": ["lora_b"]}
    assert not model.lora_b.any()  # the zero factor is given back as it was
    dead = da.audit(_ZeroInitBranch(dead=True), vocab_size=8, max_seq_len=4,
                    checks=["dead_parameters"])["dead_parameters"]
    assert not dead.passed and dead.evidence["dead"] == ["unused.weight", "unused.bias"]


# ---- dead_parameters on Hugging Face classes (newcomer item 17) --------------------------------

def _hf_llama(tf):
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=12)
    return tf.LlamaForCausalLM(config).eval()


def test_a_plain_hugging_face_llama_runs_dead_parameters_and_passes():
    """It was skipped for every Hugging Face class; a LlamaForCausalLM takes nothing but text,
    so all of its parameters are judged, and each gets a gradient."""
    tf = pytest.importorskip("transformers")
    model = _hf_llama(tf)
    check = da.audit(model, checks=["dead_parameters"])["dead_parameters"]
    assert check.passed and not check.skipped, check.detail
    assert check.evidence["trainable"] == len(list(model.parameters()))
    assert check.evidence["other_inputs"] == [] and check.evidence["not_reached"] == []


def test_a_dead_parameter_planted_in_a_hugging_face_llama_fails():
    """A norm bias registered and never applied: the loss reads the norm's output, not the
    bias. (A Linear attached and never called is named as a part whose output the loss never
    reads, as a released class's pooler is, and not judged.)"""
    tf = pytest.importorskip("transformers")
    model = _hf_llama(tf)
    model.model.layers[0].input_layernorm.register_parameter(
        "bias", torch.nn.Parameter(torch.zeros(16)))
    model.model.spare = torch.nn.Linear(16, 16)
    check = da.audit(model, checks=["dead_parameters"])["dead_parameters"]
    assert not check.passed
    assert check.evidence["dead"] == ["model.layers.0.input_layernorm.bias"], check.detail
    assert check.evidence["not_reached"] == ["model.spare.weight", "model.spare.bias"]


def test_parts_for_another_input_or_objective_are_named_not_judged():
    """GPT-2 built with cross-attention: a text-only call never runs it (it needs
    encoder_hidden_states), so the loss never reads its output; its parameters are named and
    not judged. Every other parameter is, and a dead one among them still fails."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=37, n_embd=16, n_layer=2, n_head=2,
                                             n_positions=12, add_cross_attention=True)).eval()
    check = da.audit(model, checks=["dead_parameters"])["dead_parameters"]
    assert check.passed and not check.skipped, check.detail
    cross = [name for name, _ in model.named_parameters()
             if "crossattention" in name or "ln_cross_attn" in name]
    assert sorted(check.evidence["not_reached"]) == sorted(cross)
    model.transformer.ln_f.register_parameter("shift", torch.nn.Parameter(torch.zeros(16)))
    check = da.audit(model, checks=["dead_parameters"])["dead_parameters"]
    assert not check.passed and check.evidence["dead"] == ["transformer.ln_f.shift"]


def test_a_table_looked_up_at_its_padding_index_alone_is_inert_not_dead():
    """RoCBert's shape and pronunciation tables are fed zeros, their padding_idx, when their ids
    are not given: that row never learns, by nn.Embedding's definition."""
    from decoder_audit.gate.checks import reach

    table = torch.nn.Embedding(5, 3, padding_idx=0)
    with reach.reached(table) as ran:
        table(torch.zeros(2, 4, dtype=torch.long))
    assert ran.padding_only("weight")
    with reach.reached(table) as ran:
        table(torch.tensor([[0, 2]]))
    assert not ran.padding_only("weight")


def test_a_factor_behind_a_scale_started_at_zero_is_reached_not_dead():
    """Gemma 3n's correct_output_scale starts at 0: the per-layer path behind it gets no
    gradient until the scale leaves zero. A scale vector of zeros, like a zero matrix, is tried
    with small values before anything behind it is called dead."""
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(8, 4)
            self.branch = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.zeros(4))  # a gate started closed
            self.head = torch.nn.Linear(4, 8)

        def forward(self, ids):
            x = self.emb(ids)
            return self.head(x + self.scale * self.branch(x))

    check = da.audit(Gated(), vocab_size=8, max_seq_len=4,
                     checks=["dead_parameters"])["dead_parameters"]
    assert check.passed, check.detail
    assert check.evidence["behind_zero_init"] == {"branch.weight": ["scale"],
                                                  "branch.bias": ["scale"]}
