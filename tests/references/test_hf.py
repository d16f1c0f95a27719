"""Hugging Face GPT-2 and Llama as independent references under transferred weights.

Tolerances (measured with every weight ~ N(0, 0.3), logits O(1), T = max_seq_len):
  GPT-2  float32 ~5e-7, float64 ~1e-15  -> asserted 1e-5 and 1e-10.
  Llama  float32 ~5e-7, float64 ~4e-7   -> asserted 1e-5 and 2e-6: transformers computes the
         rotary angles (and RMSNorm) in float32 even for a float64 model, which bounds the float64
         comparison near 1e-6; our own float64 path agrees with the float64 oracle to 1e-12.
Round trips (HF -> ours -> HF, ours -> HF -> ours) are bitwise.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import configs
import pytest
import torch
from helpers import random_decoder, randomise, tiny_decoder
from hf_compat import rope_kwargs, written_rope, yarn_bug

import decoder_audit as da
from decoder_audit.references import hf as hfref
from decoder_audit.references import hf_weights
from decoder_audit.references.hf_config import config_from_hf, hf_family
from decoder_audit.references.hf_weights import hf_tensors_to_ours

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()  # tiny vocabularies trigger harmless special-token warnings

V, D, H, F, T = 29, 24, 6, 37, 32  # odd sizes; Dh = 4


def _gpt2(tied: bool, seed: int = 0):
    config = tf.GPT2Config(vocab_size=V, n_positions=T, n_embd=D, n_layer=3, n_head=H, n_inner=F,
                           layer_norm_epsilon=1e-3, tie_word_embeddings=tied, bos_token_id=None,
                           eos_token_id=None, attn_implementation="eager")
    return randomise(tf.GPT2LMHeadModel(config), seed, std=0.3)


def _llama(tied: bool, kv_heads: int, seed: int = 0, **extra):
    config = tf.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=2,
                            num_attention_heads=H, num_key_value_heads=kv_heads,
                            max_position_embeddings=T, rms_norm_eps=3e-4, tie_word_embeddings=tied,
                            **rope_kwargs(tf.LlamaConfig, {"rope_type": "default",
                                                           "rope_theta": 500.0}),
                            bos_token_id=None, eos_token_id=None, pad_token_id=None,
                            attn_implementation="eager", **extra)
    return randomise(tf.LlamaForCausalLM(config), seed, std=0.3)


HF_MODELS = {
    "gpt2-tied": lambda: _gpt2(True),
    "gpt2-untied": lambda: _gpt2(False),
    "llama-kv2-tied": lambda: _llama(True, 2),
    "llama-kv3-untied": lambda: _llama(False, 3),
    "llama-kv6-biases": lambda: _llama(False, 6, attention_bias=True, mlp_bias=True),
}
FLOAT64_TOLERANCE = {"gpt2": 1e-10, "llama": 2e-6}


@pytest.fixture(scope="module")
def hf_models():
    return {name: build() for name, build in HF_MODELS.items()}


def _ids(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(5))


def _assert_state_dicts_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("name", HF_MODELS)
def test_from_hf_logits_equal_and_round_trip_is_exact(hf_models, name):
    hf_model = hf_models[name]
    ours = hfref.from_hf(hf_model)
    ids = _ids()  # T = max_seq_len: every position, every RoPE angle we can reach
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_model(ids).logits, rtol=0, atol=1e-5)
    assert ours.config.tie_embeddings == hf_model.config.tie_word_embeddings
    if ours.config.tie_embeddings:
        assert ours.lm_head.weight is ours.token_embeddings.weight
    _assert_state_dicts_equal(hfref.to_hf(ours).state_dict(), hf_model.state_dict())

    wide = copy.deepcopy(hf_model).double()
    ours_wide = hfref.from_hf(wide)
    assert ours_wide.token_embeddings.weight.dtype == torch.float64
    tolerance = FLOAT64_TOLERANCE[wide.config.model_type]
    with torch.no_grad():
        theirs = wide(ids).logits.double()  # 4.45 returns float32 logits of a float64 model
        torch.testing.assert_close(ours_wide(ids), theirs, rtol=0, atol=tolerance)
        # Our side of the float64 gap is exact: the slow float64 oracle agrees to 1e-12.
        oracle = da.oracle_logits(ours_wide.state_dict(), ours_wide.config, ids)
        torch.testing.assert_close(ours_wide(ids), oracle.to(torch.float64), rtol=0, atol=1e-12)


# Our tiny conversion shapes (the V, D, H, F, T above): GPT-2 tied without attention biases and
# untied with them, Llama with GQA 6/2 untied and 6/3 tied.
OURS = configs.entries("hf-gpt-relu-mlpbias-tied", "hf-gpt-gelu-biases-untied",
                       "hf-llama-kv2-untied", "hf-llama-kv3-tied", "hf-llama-wide-heads")


@pytest.mark.parametrize("cfg", configs.params(OURS))
def test_to_hf_logits_equal_and_round_trip_is_exact(cfg):
    ours = random_decoder(cfg, seed=1, std=0.3)
    hf_model = hfref.to_hf(ours)
    assert hf_model.config._attn_implementation == "eager"
    assert (hf_model.lm_head.weight is hf_model.get_input_embeddings().weight) == cfg.tie_embeddings
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, ours(ids), rtol=0, atol=1e-5)
    back = hfref.from_hf(hf_model)
    if cfg.attn_bias or hf_family(cfg) == "llama":
        assert back.config == cfg
        _assert_state_dicts_equal(back.state_dict(), ours.state_dict())
    else:
        # GPT-2 always has biases: ours had none in attention, so they came back as exact zeros.
        assert back.config == cfg.replace(attn_bias=True)
        for key, value in ours.state_dict().items():
            assert torch.equal(back.state_dict()[key], value), key
        assert all(torch.all(back.state_dict()[f"layers.{i}.attn.{p}.bias"] == 0)
                   for i in range(cfg.n_layers) for p in ("q_proj", "k_proj", "v_proj", "output_proj"))


def test_a_rotate_half_decoder_exports_without_permuting_and_comes_back_interleaved():
    """Our "rotate_half" rows already pair as Hugging Face Llama's: to_hf copies q and k as they
    are (logits equal); from_hf reads them back in our default interleaved layout (rows
    permuted), the same function."""
    cfg = configs.named("hf-llama-kv2-rotate-half")
    ours = random_decoder(cfg, seed=1, std=0.3)
    hf_model = hfref.to_hf(ours)
    layer = hf_model.model.layers[0].self_attn
    assert torch.equal(layer.q_proj.weight, ours.layers[0].attn.q_proj.weight)
    ids = _ids()
    back = hfref.from_hf(hf_model)
    assert back.config == cfg.replace(rope_layout="interleaved")
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, ours(ids), rtol=0, atol=1e-5)
        torch.testing.assert_close(back(ids), ours(ids), rtol=0, atol=1e-5)


def test_tiny_368_runs_as_a_gpt2_model():
    ours = random_decoder(da.preset("tiny-368"))
    hf_model = hfref.to_hf(ours)
    assert hf_model.config.activation_function == "relu"
    ids = torch.tensor([[0, 3, 7, 1], [5, 5, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, ours(ids), rtol=0, atol=1e-6)


def test_rope_row_permutation_turns_rotate_half_into_interleaved():
    """HF's own apply_rotary_pos_emb on a head vector equals our apply_rope on the same vector
    with its components reordered by the permutation the converter uses."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from decoder_audit.model.attention import apply_rope, rope_rotations

    dh, seq = 8, T
    assert hf_weights.rope_permutation(4).tolist() == [0, 2, 1, 3]  # written out by hand
    assert hf_weights.rope_permutation(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    perm = hf_weights.rope_permutation(dh)
    llama = tf.LlamaConfig(hidden_size=2 * dh, num_attention_heads=2, max_position_embeddings=seq,
                           **rope_kwargs(tf.LlamaConfig, {"rope_type": "default",
                                                          "rope_theta": 500.0}))
    x = torch.randn(1, 2, seq, dh, dtype=torch.float64)  # (B, H, T, Dh), HF layout
    cos, sin = LlamaRotaryEmbedding(config=llama)(x, torch.arange(seq)[None])
    theirs, _ = apply_rotary_pos_emb(x, x, cos, sin)
    cfg = configs.rope_only(head_dim=dh, max_seq_len=seq, rope_theta=500.0, n_heads=2)
    ours = apply_rope(x[..., perm], rope_rotations(cfg, seq, x.device, x.dtype))
    torch.testing.assert_close(ours, theirs[..., perm], rtol=0, atol=1e-5)  # HF angles: float32


@pytest.mark.parametrize("config,field", [
    (lambda: tf.GPT2Config(activation_function="silu"), "activation_function='silu'"),
    (lambda: tf.GPT2Config(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (lambda: tf.GPT2Config(reorder_and_upcast_attn=True), "reorder_and_upcast_attn"),
    (lambda: tf.GPT2Config(scale_attn_weights=False), "scale_attn_weights=False"),
    (lambda: tf.LlamaConfig(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: tf.LlamaConfig(hidden_size=8, num_attention_heads=2, **rope_kwargs(
        tf.LlamaConfig, {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0],
                         "long_factor": [1.0], "original_max_position_embeddings": 8})),
     "rope_type='longrope'"),
    (lambda: tf.LlamaConfig(**rope_kwargs(tf.LlamaConfig, {"rope_type": "default",
                                                           "rope_theta": 1e4,
                                                           "partial_rotary_factor": 0.5})),
     "partial_rotary_factor=0.5"),
    (lambda: tf.StableLmConfig(num_key_value_heads=32, qk_layernorm=True), "qk_layernorm=True"),
    (lambda: tf.GPTNeoXConfig(hidden_act="silu"), "hidden_act='silu'"),
    (lambda: tf.OlmoConfig(clip_qkv=8.0), "clip_qkv=8.0"),
    (lambda: tf.BertConfig(), "model_type='bert'"),
])
def test_unsupported_hf_configs_are_refused_naming_the_field(config, field):
    with pytest.raises(da.ConfigError, match=field.replace("(", r"\(").replace(".", r"\.")):
        config_from_hf(config())


def test_a_head_width_other_than_d_over_h_is_read():
    """Qwen3 0.6B's shape in small: head_dim * heads != hidden_size is a head width, not D / H."""
    cfg = config_from_hf(tf.LlamaConfig(hidden_size=24, num_attention_heads=6, head_dim=8,
                                        num_key_value_heads=2, intermediate_size=16))
    assert (cfg.head_width, cfg.head_dim, cfg.d_model) == (8, 8, 24)
    assert config_from_hf(tf.LlamaConfig(hidden_size=24, num_attention_heads=6)).head_width is None


def test_a_sliding_window_is_read_and_the_converter_refuses_to_write_it():
    config = tf.LlamaConfig(num_hidden_layers=4)
    config.sliding_window = 128  # as Mistral-style configs carry it
    cfg = config_from_hf(config)
    assert (cfg.sliding_window, cfg.window_layers) == (128, None)
    with pytest.raises(da.ConfigError, match="sliding_window=128"):
        hf_family(cfg)
    config.layer_types = ["sliding_attention", "full_attention"] * 2  # Gemma 2's pattern
    assert config_from_hf(config).window_layers == (0, 2)
    qwen = tf.Qwen2Config(num_hidden_layers=2, use_sliding_window=False, sliding_window=64)
    assert config_from_hf(qwen).sliding_window is None


def test_tie_flag_that_disagrees_with_the_weights_is_refused(hf_models):
    model = copy.deepcopy(hf_models["gpt2-tied"])
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied
    with pytest.raises(da.ConfigError, match="tie_word_embeddings=True but lm_head.weight is not"):
        hfref.from_hf(model)


@pytest.mark.parametrize("change,field", [
    (dict(norm="rmsnorm"), "norm='rmsnorm'"),
    (dict(pos="rope", norm="layernorm", mlp="swiglu"), "pos='rope'"),
    (dict(n_kv_heads=2), "n_kv_heads=2"),
])
def test_to_hf_refuses_what_no_family_expresses(change, field):
    cfg = configs.named("hf-gpt-gelu-biases-untied").replace(**change)
    with pytest.raises(da.ConfigError, match=field):
        hfref.to_hf(da.Decoder(cfg))


@pytest.mark.parametrize("change,field", [
    (dict(attn_sinks=True), "attn_sinks=True"),
    (dict(query_position_scale={"beta": 0.1, "length": 4}), "query_position_scale="),
])
def test_the_converter_refuses_the_fields_llama_lacks_by_name(change, field):
    """The converter's rename tables write Llama, whose attention has no sinks and scales no
    query by position: each is refused by name (the families of hf_families may hold them:
    to_hf tries those next)."""
    cfg = configs.named("hf-llama-kv2-untied").replace(**change)
    with pytest.raises(da.ConfigError, match=field.replace("(", r"\(")):
        hf_family(cfg)


def test_weights_that_do_not_fit_are_listed(hf_models):
    cfg = config_from_hf(hf_models["llama-kv3-untied"].config)
    state = dict(hf_models["llama-kv3-untied"].state_dict())
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(5, D)
    del state["model.norm.weight"]
    state["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(da.CheckpointError) as info:
        hf_tensors_to_ours(cfg, state)
    message = str(info.value)
    assert "missing ['model.norm.weight']" in message
    assert "unexpected ['model.extra.weight']" in message
    assert "model.layers.0.self_attn.k_proj.weight is (5, 24), the config needs (12, 24)" in message


@pytest.mark.parametrize("name", ["gpt2-tied", "llama-kv3-untied"])
def test_save_pretrained_folder_loads_and_ours_exports_to_one(tmp_path, hf_models, name):
    hf_model = hf_models[name]
    hf_model.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    ours = hfref.load_hf_folder(tmp_path / "hf")
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_model(ids).logits, rtol=0, atol=1e-5)

    written = hfref.save_hf_folder(ours, tmp_path / "exported")
    assert {"config.json", "model.safetensors"} <= {p.name for p in written.iterdir()}
    reloaded = tf.AutoModelForCausalLM.from_pretrained(written, attn_implementation="eager").eval()
    assert type(reloaded) is type(hf_model)
    _assert_state_dicts_equal(reloaded.state_dict(), hf_model.state_dict())


def test_core_package_imports_without_transformers():
    """`transformers` is an optional extra: the core imports without it, and the HF functions
    then raise an ImportError that says how to install it."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import decoder_audit as da\n"
        "try:\n"
        "    da.to_hf(da.Decoder(da.preset('tiny-368')))\n"
        "except ImportError as exc:\n"
        "    print('IMPORT-ERROR', exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "IMPORT-ERROR" in result.stdout and "[hf]" in result.stdout
    assert "-c constraints.txt" in result.stdout  # the tested versions, as the README installs


def test_to_hf_says_what_the_gpt2_format_changes():
    pytest.importorskip("transformers")
    with pytest.warns(UserWarning, match=r"attn_bias=false is written as zero biases.*368 -> "
                                         r"400 parameters"):
        da.to_hf(tiny_decoder())


ROPE_TYPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5},
    "yarn-no-truncate": {"rope_type": "yarn", "factor": 8.0, "truncate": False,
                         "original_max_position_embeddings": 2048, "attention_factor": 1.3},
}


@pytest.mark.parametrize("kind", sorted(ROPE_TYPES))
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rope_frequencies_equal_transformers_for_every_scaling(kind, partial):
    """transformers' ROPE_INIT_FUNCTIONS give the inverse frequencies and attention factor of
    each rope_type; the config read from the same rope_parameters gives the same through the
    model's `rope_frequencies` and the oracle's per-pair formula (both written from the papers,
    sharing no code). Dynamic NTK is compared past its original length (3x), where it bites."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from decoder_audit.model.attention import rope_frequencies
    from decoder_audit.references import oracle

    params = {**ROPE_TYPES[kind], "rope_theta": 500000.0, "partial_rotary_factor": partial}
    if kind.startswith("yarn") and yarn_bug(tf.StableLmConfig):
        pytest.skip(yarn_bug(tf.StableLmConfig))
    config = tf.StableLmConfig(hidden_size=512, num_attention_heads=4, num_key_value_heads=4,
                               num_hidden_layers=1, intermediate_size=8, vocab_size=8,
                               max_position_embeddings=16384,
                               **rope_kwargs(tf.StableLmConfig, params))
    seq_len = 3 * config.max_position_embeddings if kind == "dynamic" else None
    init = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
    if init is None:  # "default" has no entry: theta^(-2j/R) in float32
        dim = int(128 * partial)
        theirs, factor = 1.0 / 500000.0 ** (torch.arange(0, dim, 2).float() / dim), 1.0
    else:
        theirs, factor = init(config, "cpu", seq_len=seq_len)
    cfg = config_from_hf(config, "stablelm")
    assert cfg.rope_dim == 2 * theirs.numel()
    ours, ours_factor = rope_frequencies(cfg, seq_len or 1, torch.device("cpu"))
    slow = torch.tensor([oracle._pair_frequency(cfg, j, seq_len or 1)
                         for j in range(cfg.rope_dim // 2)], dtype=torch.float64)
    torch.testing.assert_close(ours, theirs.double(), rtol=2e-6, atol=0)  # theirs: float32
    torch.testing.assert_close(slow, ours, rtol=1e-12, atol=0)
    assert ours_factor == pytest.approx(factor, rel=1e-12)
    assert oracle._rope_attention_factor(cfg) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("kind", ["linear", "llama3", "yarn"])
def test_llama_rope_scaling_round_trips_through_the_converter(kind):
    """A scaled Llama converts to ours and back with its rope_parameters, and both compute the
    same logits (the pairs permuted into our interleaved layout turn by the same angles)."""
    params = {**ROPE_TYPES[kind], "rope_theta": 50.0}
    if "original_max_position_embeddings" in params:
        params["original_max_position_embeddings"] = 8
    if kind == "yarn" and yarn_bug(tf.LlamaConfig):
        pytest.skip(yarn_bug(tf.LlamaConfig))
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=H,
                            num_key_value_heads=2, intermediate_size=F, max_position_embeddings=T,
                            **rope_kwargs(tf.LlamaConfig, params), attn_implementation="eager",
                            bos_token_id=None, eos_token_id=None)
    hf_model = randomise(tf.LlamaForCausalLM(config), 0, std=0.3).double().eval()
    ours = hfref.from_hf(hf_model)
    assert ours.config.rope_scaling["type"] == kind
    ids = torch.randint(0, V, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_model(ids).logits.double(), rtol=0, atol=2e-6)
    back = hfref.to_hf(ours)
    written = written_rope(back.config)
    assert {k: written[k] for k in params} == params
    assert hfref.from_hf(back).config == ours.config
