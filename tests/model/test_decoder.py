"""Decoder against the slow oracle, the input contract, the trace and the meta device."""

import math

import configs
import numpy as np
import pytest
import torch
from helpers import oracle_leaves, random_decoder

import decoder_audit as da
from decoder_audit import ContextLengthError, InputShapeError, TokenIdError
from decoder_audit.model.attention import apply_rope, eager_attention, rope_rotations

# The oracle walks the whole grid (every pair of norm, MLP, position kind, biases, tying and
# MHA/GQA/MQA) and the hand-named configs this module has always covered.
ORACLE = configs.grid() + configs.entries(
    "tiny-368", "ln-gelu-learned-biases-gqa-untied", "gqa-odd", "ln-gelutanh-nopos-attnbias-tied",
    "rms-relu-rope-mlpbias-tied", "ln-swiglu-rope-allbias-gqa", "rope-half-gqa",
    "rope-half-ln-biases-tied", "qk-norm-gqa", "qkv-bias-only", "wide-heads",
    "ln-nobias-tied", "gemma-like", "neox-like", "rope-llama3", "rope-linear-gqa",
    "rope-yarn-partial", "rope-dynamic", "gemma2-like", "window-every-layer", "olmo-like",
    "olmo2-like", "gemma3-like", "readout-bias-tied", "granite-like", "parallel-one-norm",
    "nope-layer", "opt-like", "mla-latent-eps", "xielu-like") + configs.entries(  # helper fam-positions
    "alibi-embedding-norm", "alibi-no-shift", "sinusoidal-offset", "post-norm-no-final",
    "qk-layernorm") + configs.entries(  # helper fam-sinks
    "sinks-windowed", "gpt-oss-like", "qk-norm-after-rope", "query-position-scale",
    "cohere2-moe-like")


@pytest.mark.parametrize("cfg", configs.params(ORACLE))
def test_decoder_equals_slow_oracle_in_float64(cfg):
    model = random_decoder(cfg, dtype=torch.float64)
    state = model.state_dict()
    for seq_len in range(1, cfg.max_seq_len + 1):
        for batch in (1, 3):
            if batch == seq_len:
                continue  # B != T, so no axis is identified by its size
            ids = torch.randint(0, cfg.vocab_size, (batch, seq_len))
            fast = model(ids)
            traced, _ = model.run_with_trace(ids)
            slow = da.oracle_logits(state, cfg, ids)
            assert fast.shape == (batch, seq_len, cfg.vocab_size)
            torch.testing.assert_close(fast, slow, atol=1e-10, rtol=0)
            torch.testing.assert_close(traced, slow, atol=1e-10, rtol=0)


@pytest.mark.parametrize("cfg", configs.params(configs.entries("tiny-368", "gqa-odd",
                                                                "rope-half-gqa", "qk-norm-gqa",
                                                                "qkv-bias-only", "wide-heads",
                                                                "gemma-like", "neox-like",
                                                                "rope-yarn-partial",
                                                                "rope-dynamic", "gemma2-like",
                                                                "window-every-layer",
                                                                "olmo-like", "olmo2-like",
                                                                "gemma3-like",
                                                                "readout-bias-tied",
                                                                "granite-like",
                                                                "parallel-one-norm",
                                                                "nope-layer", "opt-like",
                                                                "mla-latent-eps",
                                                                "xielu-like")
                                          + configs.entries("alibi-embedding-norm",
                                                            "alibi-no-shift", "sinusoidal-offset",
                                                            "post-norm-no-final",
                                                            "qk-layernorm")
                                          + configs.entries("sinks-windowed",
                                                            "qk-norm-after-rope",
                                                            "query-position-scale")))
def test_gradients_equal_the_oracle(cfg):
    model = random_decoder(cfg, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    weights = torch.randn(2, cfg.max_seq_len, cfg.vocab_size, dtype=torch.float64)
    # the oracle gets its own leaf per Parameter object: a tied weight is one leaf under two names
    leaves = oracle_leaves(model, ids, weights)
    for pname, param in model.named_parameters():
        torch.testing.assert_close(param.grad, leaves[pname].grad, atol=1e-10, rtol=0)


def test_oracle_stays_exact_when_attention_scores_are_large():
    """Scores in the thousands (Q and K scaled 20x; the gate's stress run goes to 1e6): the
    softmax must subtract the row maximum, or exp overflows to inf and the oracle returns NaN."""
    cfg = configs.named("gqa-odd")
    model = random_decoder(cfg, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.q_proj.weight.mul_(20.0)
            layer.attn.k_proj.weight.mul_(20.0)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    logits, trace = model.run_with_trace(ids)
    largest = max(float(trace[f"layers.{i}.attn.scores"].abs().max()) for i in range(cfg.n_layers))
    assert largest > 1e3
    torch.testing.assert_close(da.oracle_logits(model.state_dict(), cfg, ids), logits.detach(),
                               atol=1e-10, rtol=0)


def test_oracle_reads_a_tied_state_dict_without_its_head():
    """A tied state dict may omit lm_head.weight: the oracle reads out with the embedding."""
    cfg = configs.named("ln-gelutanh-nopos-attnbias-tied")
    model = random_decoder(cfg, dtype=torch.float64)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    torch.testing.assert_close(da.oracle_logits(state, cfg, ids), model(ids).detach(),
                               atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["tiny-368", "gqa-odd"])  # LayerNorm, RMSNorm
def test_norm_eps_of_the_config_reaches_every_norm(name):
    """eps = 0.1 moves the logits far more than 1e-10 (the oracle reads cfg.norm_eps): a norm
    that falls back to its library default (1e-5 or dtype eps) fails."""
    cfg = configs.named(name).replace(norm_eps=0.1)
    model = random_decoder(cfg, dtype=torch.float64, std=0.1)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    slow = da.oracle_logits(model.state_dict(), cfg, ids)
    torch.testing.assert_close(model(ids).detach(), slow, atol=1e-10, rtol=0)
    default = da.oracle_logits(model.state_dict(), cfg.replace(norm_eps=1e-5), ids)
    assert float((slow - default).abs().max()) > 1e-4


@pytest.mark.parametrize("cfg", configs.params(configs.entries("tiny-368", "gqa-odd")))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_every_parameter_has_the_requested_dtype(cfg, dtype):
    assert {p.dtype for p in da.Decoder(cfg, dtype=dtype).parameters()} == {dtype}


def test_last_only_returns_the_last_row_on_every_path():
    cfg = configs.named("gqa-odd")
    model = random_decoder(cfg, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (3, 5))
    full = model(ids)
    torch.testing.assert_close(model(ids, last_only=True), full[:, -1:], atol=1e-12, rtol=0)
    mask = torch.ones_like(ids)
    torch.testing.assert_close(model(ids, mask, last_only=True), full[:, -1:], atol=1e-12, rtol=0)


def test_a_cache_for_another_batch_size_is_refused_naming_both():
    model = da.Decoder(configs.named("gqa-odd"))
    cache = model.new_cache(batch=2)
    with pytest.raises(InputShapeError, match=r"batch size B=3 but the cache was built for B=2"):
        model(torch.zeros(3, 5, dtype=torch.long), cache=cache)


def test_fp32_fast_path_matches_float64_oracle():
    cfg = configs.named("gqa-odd")
    model = da.Decoder(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    slow = da.oracle_logits(model.state_dict(), cfg, ids)
    torch.testing.assert_close(model(ids).double(), slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", configs.params(configs.entries("gqa-odd", "tiny-368")))
def test_a_bfloat16_model_computes_in_bfloat16_close_to_its_float32_twin(cfg):
    """The same weights rounded to bf16: logits in bf16 on both paths, within bf16 rounding
    (eps 7.8e-3, a few layers) of the float32 model. RoPE rotates bf16 activations by float32
    angles and must hand bf16 back to the attention."""
    model = random_decoder(cfg, std=0.3)
    half = da.Decoder(cfg, dtype=torch.bfloat16)
    half.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    want = model(ids).detach()
    for got in (half(ids).detach(), half.run_with_trace(ids)[0].detach()):
        assert got.dtype == torch.bfloat16
        assert float((got.float() - want).abs().max()) < 0.05 * float(want.abs().max())


def test_gqa_equals_mha_with_duplicated_kv_heads():
    """DEFECTS 21: query head h reads KV head h // group, i.e. repeat_interleave order."""
    gqa_cfg = configs.named("gqa-odd")
    mha_cfg = gqa_cfg.replace(n_kv_heads=None)
    gqa = random_decoder(gqa_cfg, dtype=torch.float64)
    mha = da.Decoder(mha_cfg, dtype=torch.float64)
    group, dh = gqa_cfg.kv_group_size, gqa_cfg.head_dim
    state = {}
    for name, tensor in gqa.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = tensor.view(gqa_cfg.kv_heads, dh, -1)  # (Hkv, Dh, D)
            tensor = heads.repeat_interleave(group, dim=0).reshape(-1, tensor.shape[-1])
        state[name] = tensor
    mha.load_state_dict(state)
    ids = torch.randint(0, gqa_cfg.vocab_size, (2, 5))
    torch.testing.assert_close(gqa(ids), mha(ids), atol=1e-12, rtol=0)


def test_tied_readout_is_h_times_embedding_transpose():
    model = da.Decoder(da.preset("tiny-368"))
    ids = torch.randint(0, 8, (2, 3))
    logits, trace = model.run_with_trace(ids)
    torch.testing.assert_close(logits, trace["ln_final"] @ model.token_embeddings.weight.T)


# ---- initialisation --------------------------------------------------------------------------

# GPT-2's scheme (Radford et al. 2019, section 2.3; nanoGPT's _init_weights): every matrix and
# embedding ~ N(0, 0.02); the two projections that write into the residual stream ~ N(0, 0.02 /
# sqrt(2L)) (two residual adds per block); biases 0; norm gains 1.
GPT2_STD = 0.02
RESIDUAL_PROJECTIONS = ("attn.output_proj.weight", "ffn.w2.weight")
# Shapes large enough that the sample std of the smallest matrix is within 3% of the true std at
# 5 standard errors (k_proj of llama-debug: 64 x 256 entries, standard error 1/sqrt(2n) = 0.55%),
# while the residual std differs from 0.02 by a factor sqrt(2L) >= 2.
INIT_CONFIGS = {
    "gpt2-small-2-layers": da.preset("gpt2-small").replace(n_layers=2, vocab_size=2000,
                                                           max_seq_len=256),
    "llama-debug": da.preset("llama-debug"),
}


@pytest.mark.parametrize("name", INIT_CONFIGS)
def test_each_weight_is_initialised_with_its_own_std(name):
    cfg = INIT_CONFIGS[name]
    model = da.Decoder(cfg)
    residual_std = GPT2_STD / (2 * cfg.n_layers) ** 0.5
    residual = []
    for pname, param in model.named_parameters():
        values = param.detach().double().flatten()
        if pname.endswith(".bias"):
            assert torch.equal(values, torch.zeros_like(values)), pname
        elif pname.startswith("ln_final.") or ".ln1." in pname or ".ln2." in pname:
            assert torch.equal(values, torch.ones_like(values)), pname
        else:
            residual += [pname] if pname.endswith(RESIDUAL_PROJECTIONS) else []
            want = residual_std if pname.endswith(RESIDUAL_PROJECTIONS) else GPT2_STD
            n, std = values.numel(), float(values.std())
            assert abs(std / want - 1) < 5 / (2 * n) ** 0.5, f"{pname}: std {std:.5f} vs {want:.5f}"
            assert abs(float(values.mean())) < 5 * want / n ** 0.5, pname
    assert len(residual) == 2 * cfg.n_layers, residual


# ---- the input contract ---------------------------------------------------------------------

@pytest.mark.parametrize("ids, error, message", [
    (torch.zeros(2, 5, dtype=torch.long), ContextLengthError,
     "T=5 exceeds max_seq_len=4; the input is rejected, never cropped"),
    (torch.zeros(2, 0, dtype=torch.long), ContextLengthError, "T=0 must be at least 1"),
    (torch.tensor([[1, 8]]), TokenIdError,
     "token id 8 at batch 0, position 1 is outside [0, vocab_size=8)"),
    (torch.tensor([[1, 2], [-1, 0]]), TokenIdError, "token id -1 at batch 1, position 0"),
    (torch.zeros(2, 3), InputShapeError, "integer dtype, got dtype=torch.float32"),
    (torch.zeros(2, 3, dtype=torch.bool), InputShapeError, "dtype=torch.bool"),
    (torch.zeros(3, dtype=torch.long), InputShapeError,
     "rank 2 (B, T), got rank 1 with shape (3,)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), InputShapeError, "got rank 3"),
    (torch.zeros(0, 3, dtype=torch.long), InputShapeError, "batch size B=0"),
    (torch.tensor([[0, 3, 8]]), TokenIdError, "token id 8 at batch 0, position 2"),
    ([[1, 2]], InputShapeError, "must be a torch.Tensor (B, T), got list"),
])
def test_bad_input_raises_a_typed_error_naming_the_value(ids, error, message):
    model = da.Decoder(da.preset("tiny-368"))
    for run in (model, lambda x: model.run_with_trace(x)):
        with pytest.raises(error) as info:
            run(ids)
        assert message in str(info.value)
        assert isinstance(info.value, da.DecoderInputError) and isinstance(info.value, ValueError)


def test_overlength_is_rejected_before_any_lookup():
    model = da.Decoder(da.preset("tiny-368"))
    called = []
    model.token_embeddings.register_forward_pre_hook(lambda *a: called.append(1))
    with pytest.raises(ContextLengthError):
        model(torch.zeros(1, 5, dtype=torch.long))
    assert called == []


def test_every_legal_length_and_two_batch_sizes_run():
    model = da.Decoder(da.preset("tiny-368"))
    for batch in (2, 3):
        for seq_len in range(1, 5):
            assert model(torch.randint(0, 8, (batch, seq_len))).shape == (batch, seq_len, 8)


# ---- the trace ------------------------------------------------------------------------------

def test_trace_records_every_site_with_its_declared_shape():
    cfg = configs.named("gqa-odd")
    model = da.Decoder(cfg)
    ids = torch.randint(0, cfg.vocab_size, (3, 5))
    logits, trace = da.run_with_trace(model, ids)
    assert trace.shape_mismatches() == []
    assert trace["layers.1.attn.pattern"].shape == (3, 6, 5, 5)
    assert trace["layers.0.attn.k"].shape == (3, 2, 5, 4)
    assert trace["layers.0.ffn.hidden"].shape == (3, 5, 37)
    # the traced logits are the eager path's; the oracle computes them independently
    torch.testing.assert_close(trace["logits"].double(),
                               da.oracle_logits(model.state_dict(), cfg, ids), atol=1e-5, rtol=0)
    first = next(iter(trace))
    assert first == "tokens"


def test_attention_rows_sum_to_one_with_zero_future_probability():
    model = da.Decoder(da.preset("tiny-368"))
    _, trace = model.run_with_trace(torch.randint(0, 8, (3, 4)))
    for layer in range(2):
        pattern = trace[f"layers.{layer}.attn.pattern"]
        torch.testing.assert_close(pattern.sum(-1), torch.ones(3, 2, 4))
        assert (pattern.triu(1) == 0).all()


def test_plain_forward_records_nothing(monkeypatch):
    def refuse(*args):
        raise AssertionError("the plain forward must not record")
    monkeypatch.setattr(da.Trace, "record", refuse)
    da.Decoder(configs.named("ln-swiglu-rope-allbias-gqa"))(torch.randint(0, 19, (2, 4)))


@pytest.mark.parametrize("name", ["tiny-368", "gqa-odd"])  # learned positions, RoPE
def test_trace_records_every_declared_site(name):
    cfg = configs.named(name)
    _, trace = da.Decoder(cfg).run_with_trace(torch.randint(0, cfg.vocab_size, (3, 2)))
    assert trace.shape_mismatches() == []


def test_a_decoder_needs_a_config_object():
    with pytest.raises(TypeError, match="Decoder needs a DecoderConfig, got dict"):
        da.Decoder(da.preset("tiny-368").to_dict())


def test_to_dtype_converts_every_parameter_and_keeps_the_tie():
    model = da.Decoder(da.preset("tiny-368")).to(torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.lm_head.weight is model.token_embeddings.weight
    # recurse=False moves only the Decoder's own parameters (it has none): the blocks stay
    model.to_empty(device="meta", recurse=False)
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_a_tied_readout_does_not_redraw_the_embedding():
    """The embedding owns the shared weight and draws it; the tied head draws nothing, so the
    tied model's embedding is the untied model's (same seed, same draws in the same order)."""
    cfg = da.preset("tiny-368")
    torch.manual_seed(0)
    tied = da.Decoder(cfg)
    torch.manual_seed(0)
    untied = da.Decoder(cfg.replace(tie_embeddings=False))
    assert torch.equal(tied.token_embeddings.weight, untied.token_embeddings.weight)


def test_meta_construction_allocates_nothing():
    with torch.device("meta"):
        model = da.Decoder(da.preset("gpt2-xl"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    logits = model(torch.zeros(1, 8, dtype=torch.long, device="meta"))
    assert logits.shape == (1, 8, 50257) and logits.device.type == "meta"


# ---- RoPE -----------------------------------------------------------------------------------

def _rope_by_hand(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Interleaved RoPE written out as 2x2 rotations: row t of x (T, Dh), pair (x[2j], x[2j+1])
    turned by the angle t * theta^(-2j/Dh) (DESIGN.md; RoFormer eq. 34 in the CS336 layout)."""
    seq_len, head_dim = x.shape
    out = torch.empty_like(x)
    for t in range(seq_len):
        for j in range(head_dim // 2):
            angle = t * theta ** (-2.0 * j / head_dim)
            c, s = math.cos(angle), math.sin(angle)
            a, b = float(x[t, 2 * j]), float(x[t, 2 * j + 1])
            out[t, 2 * j], out[t, 2 * j + 1] = c * a - s * b, s * a + c * b
    return out


def test_rope_rotates_each_interleaved_pair_by_its_own_angle():
    """Exact against the hand rotation, so a wrong sign, frequency, base or pairing fails."""
    cfg = configs.rope_only(head_dim=8, max_seq_len=12, rope_theta=100.0)
    rotations = rope_rotations(cfg, 12, torch.device("cpu"), torch.float64)
    x = torch.randn(12, 8, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, rotations), _rope_by_hand(x, 100.0),
                               atol=1e-12, rtol=0)


def test_rope_rotate_half_equals_hugging_face_llama():
    """The "rotate_half" layout against transformers' own Llama rotary code (its cos/sin tables
    built from the same angles, pair j = (x[j], x[j + Dh/2]))."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, seq_len, theta = 8, 12, 100.0
    cfg = configs.rope_only(head_dim=head_dim, max_seq_len=seq_len, rope_theta=theta)
    rotations = rope_rotations(cfg, seq_len, torch.device("cpu"), torch.float64)
    x = torch.randn(1, 1, seq_len, head_dim, dtype=torch.float64)  # (B, H, T, Dh)
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq  # (T, Dh/2)
    table = torch.cat((angles, angles), dim=-1)[None]  # (1, T, Dh): HF repeats the halves
    want, _ = apply_rotary_pos_emb(x, x, table.cos(), table.sin())
    torch.testing.assert_close(apply_rope(x, rotations, "rotate_half"), want, atol=1e-12, rtol=0)
    assert not torch.allclose(apply_rope(x, rotations, "interleaved"), want)


def test_rope_worked_example():
    """Dh = 4, theta = 100: pair 0 turns by t radians, pair 1 by t / 10. At t = 3 the unit
    vector (1, 0) of pair 0 becomes (cos 3, sin 3): counter-clockwise."""
    cfg = configs.rope_only(head_dim=4, max_seq_len=4, rope_theta=100.0)
    rotations = rope_rotations(cfg, 4, torch.device("cpu"), torch.float64)
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64).expand(4, 4)
    got = apply_rope(x, rotations)[3]
    want = torch.tensor([math.cos(3), math.sin(3), math.cos(0.3), math.sin(0.3)],
                        dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-15, rtol=0)


def test_rope_relative_position_property():
    """<R(m) q, R(n) k> depends only on m - n."""
    cfg = configs.rope_only(head_dim=8, max_seq_len=12, rope_theta=100.0)
    rotations = rope_rotations(cfg, 12, torch.device("cpu"), torch.float64)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rotated_q = apply_rope(q.expand(12, 8), rotations)  # (T, Dh)
    rotated_k = apply_rope(k.expand(12, 8), rotations)
    dots = rotated_q @ rotated_k.T  # (T, T): entry (m, n)
    for offset in range(-3, 4):
        diagonal = torch.diagonal(dots, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))


def test_rope_rotations_stay_float32_in_a_bf16_model():
    """DEFECTS 16: angles are computed in float64 and held in at least float32."""
    cfg = configs.named("gqa-odd")
    rotations = rope_rotations(cfg, 6, torch.device("cpu"), torch.bfloat16)
    assert rotations.dtype == torch.complex64  # float32 real and imaginary parts


# ---- CS336 component snapshots --------------------------------------------------------------

def _snapshot(reference, name):
    return torch.from_numpy(np.load(reference / f"{name}.npz")["array"])


def _attention_inputs():
    tensors = []
    for seed, shape in ((1, (4, 12, 64)), (2, (4, 16, 64)), (3, (4, 16, 64))):
        torch.manual_seed(seed)
        tensors.append(torch.randn(*shape))
    torch.manual_seed(5)
    return (*tensors, torch.randn(4, 12, 16) > 0.5)


def test_cs336_rope_snapshot(cs336_reference):
    torch.manual_seed(4)
    x = torch.randn(4, 12, 64)
    cfg = configs.rope_only(head_dim=64, max_seq_len=12, rope_theta=10000.0)
    rotations = rope_rotations(cfg, 12, x.device, x.dtype)
    torch.testing.assert_close(apply_rope(x, rotations), _snapshot(cs336_reference, "test_rope"),
                               atol=1e-6, rtol=0)


def test_cs336_attention_snapshots(cs336_reference):
    q, k, v, mask = _attention_inputs()
    z, _, pattern = eager_attention(q, k, v, mask)
    torch.testing.assert_close(z, _snapshot(cs336_reference, "test_scaled_dot_product_attention"),
                               atol=1e-6, rtol=0)
    assert (pattern[~mask] == 0).all()
    split = lambda t: t.reshape(2, 2, *t.shape[1:])  # (4, ...) -> (2, 2, ...)
    z4, _, _ = eager_attention(split(q), split(k), split(v), split(mask))
    torch.testing.assert_close(
        z4, _snapshot(cs336_reference, "test_4d_scaled_dot_product_attention"), atol=1e-6, rtol=0)


def test_ids_on_the_meta_device_are_refused_by_weights_that_hold_values():
    model = da.Decoder(da.preset("tiny-368"))
    with pytest.raises(da.InputShapeError, match="meta"):
        model(torch.zeros(1, 2, dtype=torch.long, device="meta"))
    on_meta = da.Decoder(da.preset("tiny-368"), device="meta")  # accounting counts FLOPs so
    assert on_meta(torch.zeros(1, 2, dtype=torch.long, device="meta")).device.type == "meta"
