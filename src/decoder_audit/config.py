"""`DecoderConfig`: the one object that owns every dimension and policy of a decoder.

Shape letters used throughout the package:
    B batch, T sequence length, D d_model, H query heads, Hkv key/value heads,
    Dh head width (D / H unless head_width says), F FFN width, V vocabulary, L layers.

The config validates itself on construction, before a single weight exists, and raises
`ConfigError` listing every offending field with its value. Modules receive final integers
from it (`head_dim`, `kv_heads`, `kv_group_size`) and never rescale them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

NORMS = ("layernorm", "rmsnorm")
MLPS = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu")
POSITIONS = ("learned", "rope", "none")
# Which features of a head RoPE rotates together: "interleaved" pairs (x[2j], x[2j+1]) (the
# original RoFormer / Llama / CS336 layout, torchtune) or "rotate_half" pairs (x[j], x[j + Dh/2])
# (Hugging Face Llama and its descendants, GPT-NeoX, litgpt). Pair j turns by the same angle in
# both; they differ in which weight rows make up a pair, so neither is the other renamed.
ROPE_LAYOUTS = ("interleaved", "rotate_half")
QK_NORM_SCOPES = ("head", "projection")
# Each RoPE scaling type's parameters: required, then optional with the default used.
ROPE_SCALING = {
    "linear": (("factor",), {}),
    "dynamic": (("factor", "original_max_seq_len"), {}),
    "llama3": (("factor", "original_max_seq_len", "low_freq_factor", "high_freq_factor"), {}),
    "yarn": (("factor", "original_max_seq_len"),
             {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "truncate": True}),
}
# "reject" raises ContextLengthError on T > max_seq_len. No other policy is implemented, so no
# other policy is accepted: a config cannot promise cropping or sliding that the model won't do.
CONTEXT_POLICIES = ("reject",)


@dataclass(frozen=True)
class DecoderConfig:
    """Architecture of a pre-norm causal decoder. Frozen: a model's config never changes."""

    vocab_size: int
    """V: number of token ids; ids lie in [0, V)."""
    d_model: int
    """D: width of the residual stream."""
    n_layers: int
    """L: number of pre-norm blocks."""
    n_heads: int
    """H: query heads per attention layer."""
    d_ff: int
    """F: hidden width of the MLP (final number; SwiGLU does not rescale it)."""
    max_seq_len: int
    """Longest sequence the model accepts; longer input is rejected, never cropped."""
    n_kv_heads: int | None = None
    """Hkv: key/value heads (grouped-query attention). None means Hkv = H (plain MHA)."""
    head_width: int | None = None
    """Dh when it is not D / H (Gemma, Qwen3: q_proj is D -> H*Dh, output_proj H*Dh -> D).
    None means Dh = D / H, which must then divide."""
    norm: str = "layernorm"
    """"layernorm" (with bias) or "rmsnorm" (gain only)."""
    norm_eps: float = 1e-5
    """Epsilon added to the variance (LayerNorm) or mean square (RMSNorm)."""
    norm_offset: float = 0.0
    """Added to every RMSNorm gain: the gain is offset + w (Gemma stores w around 0 and scales by
    1 + w). A fresh model's w starts at 1 - offset, so its gain starts at 1."""
    embedding_scale: float | None = None
    """The token embedding's output multiplied by this, rounded to the model's dtype first (Gemma:
    sqrt(D)); None multiplies by nothing. The tied readout reads the unscaled weight."""
    norm_bias: bool = True
    """A LayerNorm's shift (False: gain only, nanoGPT's bias=False); RMSNorm has none."""
    norm_affine: bool = True
    """False: the block and final norms learn nothing, no gain and no shift (OLMo's LayerNorm)."""
    pre_norm: bool = True
    """False: each sublayer reads the stream itself, not a normalised copy (OLMo 2, whose
    sandwich norms normalise only the sublayers' outputs)."""
    mlp: str = "gelu"
    """"relu", "gelu" (exact erf), "gelu_tanh" (GPT-2's approximation), or a gated MLP w2(act(w1
    x) * w3 x): "swiglu" (SiLU) or "geglu" (tanh GELU, Gemma's)."""
    pos: str = "learned"
    """"learned" absolute positions, "rope" (rotary, see rope_layout) or "none"."""
    rope_theta: float = 10000.0
    """RoPE base: pair j of a head rotates by pos * theta^(-2j/Dh)."""
    rope_layout: str = "interleaved"
    """Which features form RoPE's pair j: "interleaved" (x[2j], x[2j+1]) or "rotate_half"
    (x[j], x[j + R/2]), R the rotated width (rotary_dim)."""
    rotary_dim: int | None = None
    """R: RoPE rotates the first R features of each head and passes the other Dh - R through
    (partial rotary: GPT-NeoX's rotary_pct, Phi's and StableLM's partial_rotary_factor); pair j
    turns by pos * theta^(-2j/R). None rotates all Dh."""
    window_rope_theta: float | None = None
    """The RoPE base of the windowed layers (Gemma 3: 1e4 where the full layers use 1e6); their
    RoPE is then never scaled (rope_scaling is the full layers'). None: rope_theta and
    rope_scaling in every layer."""
    rope_scaling: dict | None = None
    """How RoPE's frequencies are stretched for a longer context (None: not at all), as a dict
    with "type" and that type's parameters (ROPE_SCALING lists them):
        linear   {"factor"}: positions divided by factor
        dynamic  {"factor", "original_max_seq_len"}: NTK-aware, the base grows with the
                 sequence once it passes original_max_seq_len
        llama3   {"factor", "original_max_seq_len", "low_freq_factor", "high_freq_factor"}:
                 low frequencies divided by factor, high ones kept, a smooth ramp between
        yarn     {"factor", "original_max_seq_len", "beta_fast", "beta_slow",
                 "attention_factor", "truncate"}: frequencies blended between kept and
                 divided over a ramp of pair indices, and q, k scaled by attention_factor."""
    sliding_window: int | None = None
    """W: in a windowed layer token t reads tokens t-W+1..t only (Mistral, Gemma 2's local
    layers); None: every layer reads every earlier token."""
    window_layers: tuple[int, ...] | None = None
    """The layers the window applies to (Gemma 2: 0, 2, 4, ...); None: every layer."""
    attn_scale: float | None = None
    """What the scores q.k are multiplied by; None: 1/sqrt(Dh). Gemma 2 scales by
    query_pre_attn_scalar^-0.5, which need not be the head width."""
    attn_softcap: float | None = None
    """c: scores become c * tanh(scores / c) before the mask and softmax (Gemma 2: 50)."""
    logit_softcap: float | None = None
    """c: the logits become c * tanh(logits / c) (Gemma 2: 30)."""
    sandwich_norm: bool = False
    """Each sublayer's output is normalised too before it joins the stream (Gemma 2):
    x + N1'(Attn(N1(x))), then + N2'(MLP(N2(.))), with weights ln1_post and ln2_post."""
    parallel_residual: bool = False
    """The block adds attention and MLP to the same input: x + Attn(N1(x)) + MLP(N2(x))
    (GPT-NeoX, Pythia), instead of the MLP reading the stream after attention."""
    attn_bias: bool = False
    """Biases on the q/k/v projections, and on the output projection unless attn_output_bias
    says otherwise."""
    attn_output_bias: bool | None = None
    """The output projection's bias: None follows attn_bias; False with attn_bias=True is
    Qwen2's attention (q/k/v biases, none on the output)."""
    qk_norm: bool = False
    """RMSNorm (eps norm_eps) on the queries and keys, before RoPE: weights attn.q_norm and
    attn.k_norm, over each head (qk_norm_scope "head": a gain of Dh shared by the heads, Qwen3,
    Gemma 3) or over the whole projection ("projection": gains of H*Dh and Hkv*Dh, OLMo 2)."""
    qk_norm_scope: str = "head"
    """What one q/k RMSNorm normalises: "head" or "projection" (see qk_norm)."""
    mlp_bias: bool = False
    """Biases on the MLP matrices."""
    readout_bias: bool = False
    """A bias on the logits (TransformerLens' unembed.b_U): weight lm_head.bias, its own
    Parameter also when the readout matrix is tied."""
    tie_embeddings: bool = True
    """Readout uses the token-embedding Parameter itself (one object, one gradient)."""
    context_policy: str = "reject"
    """What happens to T > max_seq_len; only "reject" exists."""

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # the config's own copy: the caller's may change
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        if isinstance(self.window_layers, list):  # as JSON gives it back
            object.__setattr__(self, "window_layers", tuple(self.window_layers))
        problems = _validate(self)
        if problems:
            raise ConfigError("invalid DecoderConfig: " + "; ".join(problems))

    # Derived values: computed here once so no module ever recomputes or rescales them.
    @property
    def kv_heads(self) -> int:
        """Hkv, with None resolved to H."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def gated(self) -> bool:
        """A gated MLP (w1, w3 in, w2 out): SwiGLU or GeGLU."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def output_bias(self) -> bool:
        """Whether the attention output projection has a bias (attn_output_bias resolved)."""
        return self.attn_bias if self.attn_output_bias is None else self.attn_output_bias

    @property
    def head_dim(self) -> int:
        """Dh: head_width, or D / H."""
        return self.d_model // self.n_heads if self.head_width is None else self.head_width

    @property
    def rope_dim(self) -> int:
        """R: the features of a head RoPE rotates (rotary_dim, or all Dh)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def window(self, layer: int) -> int | None:
        """W for this layer, or None where it reads every earlier token."""
        if self.sliding_window is None or (self.window_layers is not None
                                           and layer not in self.window_layers):
            return None
        return self.sliding_window

    def rope_parameter(self, name: str):
        """A rope_scaling parameter, or its type's default (ROPE_SCALING)."""
        scaling = self.rope_scaling or {}
        return scaling.get(name, ROPE_SCALING.get(scaling.get("type"), ((), {}))[1].get(name))

    @property
    def kv_group_size(self) -> int:
        """Query heads that share one KV head: query head h reads KV head h // group."""
        return self.n_heads // self.kv_heads

    # JSON round trip.
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecoderConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown config field(s) {unknown}; known fields are {sorted(known)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in data
        )
        if missing:
            raise ConfigError(f"missing required config field(s) {missing}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "DecoderConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the config as JSON, atomically: a failed write leaves any old file intact."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DecoderConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist"
                              + (" (it is a folder)" if path.is_dir() else ""))
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte "
                              f"0x{raw[exc.start]:02x} at offset {exc.start}); a config is a "
                              "JSON file") from None
        return cls.from_json(text)

    def replace(self, **changes: Any) -> "DecoderConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(cfg: DecoderConfig) -> list[str]:
    """Every problem with the config, each naming the field and its value."""
    problems: list[str] = []
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        value = getattr(cfg, name)
        if not _is_int(value) or value <= 0:
            problems.append(f"{name}={value!r} must be a positive integer")
    for name in ("n_kv_heads", "head_width", "rotary_dim", "sliding_window"):
        value = getattr(cfg, name)
        if value is not None and (not _is_int(value) or value <= 0):
            problems.append(f"{name}={value!r} must be a positive integer or None")
    for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("pos", POSITIONS),
                          ("rope_layout", ROPE_LAYOUTS), ("qk_norm_scope", QK_NORM_SCOPES),
                          ("context_policy", CONTEXT_POLICIES)):
        value = getattr(cfg, name)
        if value not in allowed:
            problems.append(f"{name}={value!r} is not one of {list(allowed)}")
    if cfg.embedding_scale is not None and (not _is_real(cfg.embedding_scale)
                                            or not cfg.embedding_scale > 0
                                            or cfg.embedding_scale == float("inf")):
        problems.append(f"embedding_scale={cfg.embedding_scale!r} must be a finite number > 0 "
                        "or null")
    if not _is_real(cfg.norm_offset) or cfg.norm_offset != cfg.norm_offset or \
            abs(cfg.norm_offset) == float("inf"):
        problems.append(f"norm_offset={cfg.norm_offset!r} must be a finite number")
    for name in ("norm_eps", "rope_theta"):
        value = getattr(cfg, name)
        if not _is_real(value) or not value >= 0 or value == float("inf"):
            problems.append(f"{name}={value!r} must be a finite number >= 0")
    if _is_real(cfg.rope_theta) and cfg.pos == "rope" and not cfg.rope_theta > 0:
        problems.append(f"rope_theta={cfg.rope_theta!r} must be > 0 with pos='rope'")
    if cfg.attn_output_bias is not None and not isinstance(cfg.attn_output_bias, bool):
        problems.append(f"attn_output_bias={cfg.attn_output_bias!r} must be true, false or null")
    for name in ("attn_scale", "attn_softcap", "logit_softcap", "window_rope_theta"):
        value = getattr(cfg, name)
        if value is not None and (not _is_real(value) or not 0 < value < float("inf")):
            problems.append(f"{name}={value!r} must be a finite number > 0 or null")
    for name in ("attn_bias", "mlp_bias", "tie_embeddings", "qk_norm", "norm_bias",
                 "parallel_residual", "sandwich_norm", "norm_affine", "pre_norm",
                 "readout_bias"):
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            problems.append(f"{name}={value!r} must be true or false")
    problems += _rope_scaling_problems(cfg.rope_scaling)
    if problems:  # the divisibility checks below need valid integers
        return problems
    if cfg.head_width is None and cfg.d_model % cfg.n_heads:
        problems.append(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads} "
                        "(set head_width for heads narrower or wider than D / H)")
    if cfg.n_heads % cfg.kv_heads:
        problems.append(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={cfg.kv_heads}")
    if cfg.pos == "rope" and (cfg.head_width is not None or cfg.d_model % cfg.n_heads == 0) \
            and cfg.head_dim % 2:
        problems.append(f"head width Dh={cfg.head_dim} is odd; RoPE rotates pairs and needs it "
                        "even")
    return problems + _attention_problems(cfg)


def _attention_problems(cfg: DecoderConfig) -> list[str]:
    """The window's layers and the rotated width against the sizes (which are valid here)."""
    problems = []
    layers = cfg.window_layers
    if layers is not None and (not isinstance(layers, tuple) or not all(
            _is_int(i) and 0 <= i < cfg.n_layers for i in layers) or len(set(layers)) != len(layers)):
        problems.append(f"window_layers={layers!r} must list distinct layers in [0, n_layers="
                        f"{cfg.n_layers})")
    elif layers is not None and cfg.sliding_window is None:
        problems.append(f"window_layers={list(layers)} needs a sliding_window")
    if cfg.window_rope_theta is not None and (cfg.sliding_window is None or cfg.pos != "rope"):
        problems.append(f"window_rope_theta={cfg.window_rope_theta} needs pos='rope' and a "
                        "sliding_window")
    if not cfg.norm_affine and cfg.norm == "layernorm" and cfg.norm_bias:
        problems.append("norm_affine=False with norm_bias=True: a norm without a gain has no "
                        "shift either (set norm_bias=false)")
    if cfg.rotary_dim is not None and (cfg.rotary_dim % 2 or cfg.rotary_dim > cfg.head_dim):
        problems.append(f"rotary_dim={cfg.rotary_dim} must be even and at most the head width "
                        f"Dh={cfg.head_dim}")
    if cfg.pos != "rope" and (cfg.rotary_dim is not None or cfg.rope_scaling is not None):
        problems.append(f"rotary_dim={cfg.rotary_dim}, rope_scaling={cfg.rope_scaling} need "
                        f"pos='rope', not {cfg.pos!r}")
    if cfg.rope_scaling is not None and cfg.rope_dim < 4 and cfg.rope_scaling["type"] == "dynamic":
        problems.append(f"rope_scaling type 'dynamic' needs a rotated width of at least 4, got "
                        f"{cfg.rope_dim} (its base grows as a power dim / (dim - 2))")
    return problems


def _rope_scaling_problems(scaling: Any) -> list[str]:
    """What is wrong with a rope_scaling dict (ROPE_SCALING), each naming the key and value."""
    if scaling is None:
        return []
    if not isinstance(scaling, dict) or scaling.get("type") not in ROPE_SCALING:
        kind = scaling.get("type") if isinstance(scaling, dict) else scaling
        return [f"rope_scaling={kind!r}: a dict whose 'type' is one of {list(ROPE_SCALING)}, or "
                "null"]
    required, optional = ROPE_SCALING[scaling["type"]]
    where = f"rope_scaling type {scaling['type']!r}"
    problems = [f"{where} needs {name!r}" for name in required if name not in scaling]
    unknown = sorted(set(scaling) - {"type", *required, *optional})
    if unknown:
        problems.append(f"{where} has unknown key(s) {unknown}; it takes "
                        f"{sorted({*required, *optional})}")
    for name, value in scaling.items():
        if name == "type" or name in unknown or (value is None and name in optional):
            continue
        if name == "truncate":
            if not isinstance(value, bool):
                problems.append(f"{where}: truncate={value!r} must be true or false")
        elif not _is_real(value) or not 0 < value < float("inf"):
            problems.append(f"{where}: {name}={value!r} must be a finite number > 0")
    if not problems and scaling["type"] == "llama3" and \
            not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        problems.append(f"{where}: high_freq_factor={scaling['high_freq_factor']} must exceed "
                        f"low_freq_factor={scaling['low_freq_factor']}")
    return problems
