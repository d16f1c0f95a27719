"""The plain call on peer libraries' models: `da.audit(model)` reads the config the model carries
as its spec (references/peer_configs.py) and runs params and oracle on it, with no spec= and no
vocab_size=. For each library: correct tiny models pass; a defect planted in the library's own
module (a forward or a buffer monkeypatched) fails oracle or params; an option no DecoderConfig
expresses fails both, named. TransformerLens and x-transformers are the real packages; nanoGPT
and litgpt are stand-ins (tests/zoo_peers.py says why). the real torchtune: test_peer_torchtune.py
(.ci/torchtune); the real litgpt: test_peer_litgpt.py (.ci/litgpt)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from zoo_peers import Config, GPTConfig, NanoGPT
from zoo_styles import SPECS, LitGPT

import decoder_audit as da

CHECKS = ["params", "oracle"]


def _spec_checks(model, **facts):
    report = da.audit(model, checks=CHECKS, **facts)
    return report, report["params"], report["oracle"]


def _refused(model, *names):
    """params and oracle both fail, naming every option in `names`."""
    report, params, oracle = _spec_checks(model)
    assert not params.passed and not oracle.passed, (params.detail, oracle.detail)
    for name in names:
        assert name in params.detail and name in oracle.detail, params.detail
    assert report.facts.reference == "spec" and report.facts.spec is None
    return params.detail


def _rms(x, weight, bias=None, eps=1e-5):  # a norm of the other kind than a LayerNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# ---- TransformerLens (the real package) ---------------------------------------------------------

lens = pytest.importorskip("transformer_lens")
LENS = dict(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_mlp=24, d_vocab=13, seed=0)


def _lens(**options):
    torch.manual_seed(0)
    kind = dict(act_fn="gelu", normalization_type="RMS", positional_embedding_type="rotary",
                n_key_value_heads=2)
    return lens.HookedTransformer(lens.HookedTransformerConfig(**{**LENS, **kind, **options}))


LENS_SCALED = dict(use_NTK_by_parts_rope=True, NTK_original_ctx_len=4, NTK_by_parts_factor=4.0,
                   rotary_base=100)  # Llama 3.1's scaling, biting within 8 positions


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
@pytest.mark.parametrize("options", [
    {}, dict(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
             n_key_value_heads=None), LENS_SCALED, dict(rotary_adjacent_pairs=True, rotary_dim=2),
], ids=["rotary", "gpt2", "ntk_by_parts", "adjacent_partial"])
def test_a_hooked_transformer_is_audited_from_its_config(options):
    model = _lens(**options)
    report, params, oracle = _spec_checks(model)
    assert params.passed and oracle.passed, (params.detail, oracle.detail)
    spec = report.facts.spec  # what the config declares, checked against an independent reading
    assert (spec.vocab_size, spec.n_kv_heads) == (13, options.get("n_key_value_heads", 2))
    assert report.facts.origin["vocab_size"] == "spec"
    if options is LENS_SCALED:
        assert spec.rope_scaling == {"type": "llama3", "factor": 4.0, "original_max_seq_len": 4,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def _lens_rope_unscaled(model):  # the sin/cos tables of the unscaled RoPE, base 100
    for block in model.blocks:
        model.cfg.use_NTK_by_parts_rope = False
        sin, cos = block.attn.calculate_sin_cos_rotary(4, 8, base=100)
        model.cfg.use_NTK_by_parts_rope = True
        block.attn.rotary_sin.copy_(sin)
        block.attn.rotary_cos.copy_(cos)


def _lens_layernorm(model):
    norm = model.blocks[1].ln2
    norm.forward = lambda x: F.layer_norm(x, x.shape[-1:], norm.w, None, norm.eps)


def _lens_tanh_gelu(model):
    model.blocks[0].mlp.act_fn = lambda x: F.gelu(x, approximate="tanh")


LENS_DEFECTS = {"rope_scaling_dropped": _lens_rope_unscaled, "layernorm": _lens_layernorm,
                "tanh_gelu": _lens_tanh_gelu}


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
@pytest.mark.parametrize("name", sorted(LENS_DEFECTS))
def test_a_defect_planted_in_a_hooked_transformer_fails_oracle(name):
    model = _lens(**LENS_SCALED)
    with torch.no_grad():
        LENS_DEFECTS[name](model)
    _, params, oracle = _spec_checks(model)
    assert params.passed and not oracle.passed, (params.detail, oracle.detail)


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
def test_a_hooked_transformer_option_no_spec_expresses_is_refused_by_name():
    """TransformerLens 3 adds a gated MLP's b_in after the gate's product, and divides scores by
    the layer index + 1 on request: neither is a DecoderConfig, so the audit fails closed."""
    model = _lens(gated_mlp=True, act_fn="silu", scale_attn_by_inverse_layer_idx=True)
    detail = _refused(model, "gated_mlp=True", "scale_attn_by_inverse_layer_idx=True")
    assert "2 of its options" in detail


# ---- x-transformers (the real package) ----------------------------------------------------------

xt = pytest.importorskip("x_transformers")


def _xt(wrapper=None, **decoder):
    torch.manual_seed(0)
    layers = xt.Decoder(dim=16, depth=2, heads=2, attn_dim_head=8, **decoder)
    options = {"use_abs_pos_emb": False, **(wrapper or {})}
    return xt.TransformerWrapper(num_tokens=13, max_seq_len=16, attn_layers=layers,
                                 **options).eval()


XT_ROTARY = dict(rotary_pos_emb=True, rotary_interpolation_factor=2.0,
                 rotary_base_rescale_factor=2.0)


@pytest.mark.parametrize("options", [XT_ROTARY, dict(rotary_pos_emb=True, ff_glu=True,
                                                     ff_swish=True, use_rmsnorm=True,
                                                     ff_no_bias=True)],
                         ids=["layernorm_gelu", "rmsnorm_swiglu"])
def test_an_x_transformers_decoder_is_audited_from_its_modules(options):
    report, params, oracle = _spec_checks(_xt(**options))
    assert params.passed and oracle.passed, (params.detail, oracle.detail)
    spec = report.facts.spec
    if options is XT_ROTARY:  # RotaryEmbedding(dim_head // 2): base 10000 * 2^(4 / (4 - 2))
        assert (spec.rotary_dim, spec.rope_layout) == (4, "interleaved")
        assert spec.rope_theta == pytest.approx(40000.0, rel=1e-5)
        assert spec.rope_scaling == {"type": "linear", "factor": 2.0}


def _xt_positions_halved(monkeypatch):  # the rotary positions interpolated twice
    rotary = xt.x_transformers.RotaryEmbedding
    real = rotary.forward
    monkeypatch.setattr(rotary, "forward", lambda self, t, offset=0: real(self, t / 2, offset))


def _xt_rmsnorm(monkeypatch):
    monkeypatch.setattr(xt.x_transformers.LayerNorm, "forward",
                        lambda self, x: _rms(x, self.gamma + float(self.unit_offset)))


def _xt_tanh_gelu(monkeypatch):
    monkeypatch.setattr(torch.nn.GELU, "forward", lambda self, x: F.gelu(x, approximate="tanh"))


XT_DEFECTS = {"rope_scaling": _xt_positions_halved, "rmsnorm": _xt_rmsnorm,
              "tanh_gelu": _xt_tanh_gelu}


@pytest.mark.parametrize("name", sorted(XT_DEFECTS))
def test_a_defect_planted_in_x_transformers_fails_oracle(name, monkeypatch):
    model = _xt(**XT_ROTARY)
    XT_DEFECTS[name](monkeypatch)
    _, params, oracle = _spec_checks(model)
    assert params.passed and not oracle.passed, (params.detail, oracle.detail)


def test_an_x_transformers_eps_of_its_own_is_refused_by_its_module():
    """x-transformers keeps no config: another eps in one norm is an option the reader did not
    read, found by comparing the modules with a Decoder built from the options it did read."""
    model = _xt(**XT_ROTARY)
    model.attn_layers.layers[1][0][0].ln.eps = 1e-2
    _refused(model, "attn_layers.layers.1.0.0.ln.eps=0.01")


@pytest.mark.parametrize("wrapper, decoder, option", [
    ({"use_abs_pos_emb": True}, {}, "pos_emb=AbsolutePositionalEmbedding"),
    ({}, dict(rotary_pos_emb=True, attn_qk_norm=True), "qk_norm=True"),
    ({}, dict(rotary_pos_emb=True, attn_kv_heads=1), "attn_kv_heads=1"),
], ids=["scaled_positions", "qk_norm", "kv_heads_mod"])
def test_an_x_transformers_option_no_spec_expresses_is_refused_by_name(wrapper, decoder, option):
    _refused(_xt(wrapper, **decoder), option)


# ---- nanoGPT (STAND-IN: tests/zoo_peers.py) -----------------------------------------------------

NANO = GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=3, n_embd=24)


@pytest.mark.parametrize("bias", [True, False])
def test_a_nanogpt_is_audited_from_its_gptconfig(bias):
    torch.manual_seed(0)
    model = NanoGPT(GPTConfig(**{**vars(NANO), "bias": bias})).eval()
    report, params, oracle = _spec_checks(model)
    assert params.passed and oracle.passed, (params.detail, oracle.detail)
    # learned positions: block_size is a hard limit, declared by the config
    assert report.facts.max_seq_len == 16 and report.facts.spec.d_ff == 4 * 24


def _nano_positions_shifted(model):  # position t reads the table's row t + 1 (off by one)
    wpe = model.transformer.wpe
    wpe.forward = lambda pos: F.embedding(pos + 1, wpe.weight)


def _nano_rmsnorm(model):
    norm = model.transformer.h[1].ln_1
    norm.forward = lambda x: _rms(x, norm.weight)


def _nano_eps(model):
    norm = model.transformer.ln_f
    norm.forward = lambda x: F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, 1e-2)


def _nano_tanh_gelu(model):
    model.transformer.h[0].mlp.gelu = torch.nn.GELU(approximate="tanh")


NANO_DEFECTS = {"positions_off_by_one": _nano_positions_shifted, "rmsnorm": _nano_rmsnorm,
                "eps": _nano_eps, "tanh_gelu": _nano_tanh_gelu}


@pytest.mark.parametrize("name", sorted(NANO_DEFECTS))
def test_a_defect_planted_in_nanogpt_fails_oracle(name):
    torch.manual_seed(0)
    model = NanoGPT(GPTConfig(**{**vars(NANO), "block_size": 17})).eval()
    NANO_DEFECTS[name](model)
    _, params, oracle = _spec_checks(model)
    assert params.passed and not oracle.passed, (params.detail, oracle.detail)


def test_nanogpts_last_position_shortcut_is_reported_not_broadcast():
    """nanoGPT's own forward without targets returns the last position's logits alone (B, 1, V):
    shapes names it, and oracle names the shape instead of comparing (B, 1, V) broadcast
    against the oracle's (B, T, V)."""

    class LastOnly(NanoGPT):
        def forward(self, idx, targets=None):
            logits, loss = super().forward(idx, targets)
            return (logits if targets is not None else logits[:, [-1], :]), loss

    torch.manual_seed(0)
    report = da.audit(LastOnly(NANO).eval(), checks=["shapes", *CHECKS])
    assert report["params"].passed and not report["shapes"].passed
    oracle = report["oracle"]
    assert not oracle.passed and "the logits' shape (2, 1, 37)" in oracle.detail, oracle.detail


def test_a_field_a_nanogpt_fork_adds_is_refused_by_name():
    """A fork that adds a field (grouped-query attention, say) computes something nanoGPT's
    config does not declare: refused, named, never read as nanoGPT."""
    from dataclasses import make_dataclass

    Forked = make_dataclass("GPTConfig", [("n_kv_head", int, 1)], bases=(GPTConfig,))
    torch.manual_seed(0)
    model = NanoGPT(Forked(**vars(NANO))).eval()
    _refused(model, "n_kv_head=1")


# ---- litgpt (STAND-IN: tests/zoo_peers.py's Config on tests/zoo_styles.py's LitGPT) --------------

def _lit_config(**changes):
    spec = SPECS["litgpt"]
    return Config(**{"name": "tiny-llama", "block_size": 16, "n_layer": 2, "n_embd": 32,
                     "n_head": 4, "n_query_groups": 2, "vocab_size": 37, "padded_vocab_size": 37,
                     "norm_class_name": "RMSNorm", "norm_eps": spec.norm_eps,
                     "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
                     "mlp_class_name": "LLaMAMLP", "intermediate_size": spec.d_ff, **changes})


@pytest.mark.parametrize("defect, check", [(None, None), ("eps", "oracle"),
                                            ("activation", "oracle")])
def test_a_litgpt_stand_in_is_audited_from_its_config(defect, check):
    model = LitGPT(defect=defect).eval()
    model.config = _lit_config()
    _, params, oracle = _spec_checks(model)
    assert params.passed, params.detail
    assert oracle.passed is (check is None), oracle.detail


def test_a_litgpt_option_no_spec_expresses_is_refused_by_name():
    model = LitGPT().eval()
    model.config = _lit_config(shared_attention_norm=True, n_expert=4)
    _refused(model, "shared_attention_norm=True", "n_expert=4")
