"""The parameter ledger: every component counted from the config by formula (analytic) and from
the module's unique Parameters (measured), and the reconciliation of the two.

For tiny-368 the analytic rows are the seeds' table:
    token_embeddings 8x4 = 32, position_embeddings 4x4 = 16,
    per block: norms 2 x (4 + 4) = 16, attention 4 x 4x4 = 64, MLP 4x8+8 + 8x4+4 = 76,
    2 blocks = 312, ln_final 8, lm_head 0 additional (tied) -> 368.
A tied readout adds nothing; a readout that is a separate Parameter (even with equal values) is
measured as V x D more, and the reconciliation says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..config import DecoderConfig

BLOCK_PARTS = ("norms", "attn", "ffn")


@dataclass(frozen=True)
class LedgerRow:
    name: str  # e.g. "token_embeddings", "layers.0.attn", "lm_head"
    count: int
    formula: str = ""  # how the analytic count was derived, e.g. "V*D = 8*4"


@dataclass
class Ledger:
    rows: list[LedgerRow]
    source: str  # "analytic" or "measured"
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(row.count for row in self.rows)

    def as_dict(self) -> dict[str, int]:
        return {row.name: row.count for row in self.rows}

    def __getitem__(self, name: str) -> int:
        return self.as_dict()[name]

    def grouped(self) -> list[tuple[str, int, str]]:
        """Display rows: the embeddings, one block broken into its parts, L blocks, the rest.
        Blocks are shown once when all layers agree (the usual case), otherwise each run of
        equal layers once."""
        counts = self.as_dict()
        formulas = {row.name: row.formula for row in self.rows}
        n_layers = len({name.split(".")[1] for name in counts if name.startswith("layers.")})
        out: list[tuple[str, int, str]] = []
        for name in ("token_embeddings", "position_embeddings", "embedding_norm"):
            if name != "embedding_norm" or name in counts:  # a row only where there is one
                out.append((name, counts.get(name, 0), formulas.get(name, "")))
        per_layer = [tuple(counts.get(f"layers.{i}.{part}", 0) for part in BLOCK_PARTS)
                     for i in range(n_layers)]
        if n_layers and len(set(per_layer)) == 1:
            for part, count in zip(BLOCK_PARTS, per_layer[0]):
                out.append((f"  one block: {part}", count, formulas.get(f"layers.0.{part}", "")))
            block = sum(per_layer[0])
            out.append((f"{n_layers} blocks", n_layers * block, f"{n_layers} x {block}"))
        else:  # runs of equal layers once each (DeepSeek-V3: 3 dense, then 58 routed)
            start = 0
            for i in range(1, n_layers + 1):
                if i < n_layers and per_layer[i] == per_layer[start]:
                    continue
                parts, run = per_layer[start], i - start
                name = f"layers.{start}" if run == 1 else f"layers.{start}-{i - 1}"
                formula = " + ".join(map(str, parts))
                out.append((name, run * sum(parts), formula if run == 1 else
                            f"{run} x ({formula})"))
                start = i
        for name in ("ln_final", "lm_head"):
            out.append((name, counts.get(name, 0), formulas.get(name, "")))
        extra = [row for row in self.rows if row.name == "other"]
        out.extend((row.name, row.count, row.formula) for row in extra)
        return out


def _norm_count(cfg: DecoderConfig) -> tuple[int, str]:
    if not cfg.norm_affine:
        return 0, "0 (norm_affine=False: no gain, no shift)"
    if cfg.norm == "layernorm" and cfg.norm_bias:
        return 2 * cfg.d_model, f"2*D = 2*{cfg.d_model} (gain + bias)"
    return cfg.d_model, f"D = {cfg.d_model} (gain)"


def parameter_ledger(cfg: DecoderConfig | Mapping[str, Any]) -> Ledger:
    """Analytic ledger: every component's learned scalars, by formula from the config alone.
    `cfg` is a DecoderConfig, or its fields as a dict (validated like a config file)."""
    if isinstance(cfg, Mapping):
        cfg = DecoderConfig.from_dict(dict(cfg))
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(f"parameter_ledger needs a DecoderConfig (or a dict of its fields), got "
                        f"{type(cfg).__name__}; e.g. da.preset('tiny-368')")
    V, D, T = cfg.vocab_size, cfg.d_model, cfg.max_seq_len
    rows = [LedgerRow("token_embeddings", V * D, f"V*D = {V}*{D}")]
    if cfg.pos == "learned" and cfg.position_offset:  # rows before position 0's (OPT's 2)
        offset = cfg.position_offset
        rows.append(LedgerRow("position_embeddings", (offset + T) * D,
                              f"(position_offset+max_seq_len)*D = ({offset}+{T})*{D}"))
    elif cfg.pos == "learned":
        rows.append(LedgerRow("position_embeddings", T * D, f"max_seq_len*D = {T}*{D}"))
    else:
        rows.append(LedgerRow("position_embeddings", 0, f"pos={cfg.pos}: nothing learned"))

    norm, norm_formula = _norm_count(cfg)
    if cfg.embedding_norm:  # a row only where the config has one (BLOOM)
        rows.append(LedgerRow("embedding_norm", norm, norm_formula))
    attn, attn_formula = _latent_attention(cfg) if cfg.latent_attention else _attention(cfg)
    dense, dense_formula = _dense_mlp(cfg)
    routed, routed_formula = _routed_mlp(cfg) if cfg.routed else (0, "")
    # ln1, ln2 (ln1 alone where one norm feeds both sublayers; before the sublayers or after
    # the adds), ln1_post, ln2_post
    norms = (1 if cfg.shared_norm else 2) * (cfg.pre_norm or cfg.post_norm) + (
        2 if cfg.sandwich_norm else 0)
    for i in range(cfg.n_layers):
        rows += [
            LedgerRow(f"layers.{i}.norms", norms * norm, f"{norms} norms x {norm_formula}"),
            LedgerRow(f"layers.{i}.attn", attn, attn_formula),
            LedgerRow(f"layers.{i}.ffn", *((routed, routed_formula) if cfg.routes(i)
                                           else (dense, dense_formula))),
        ]
    rows.append(LedgerRow("ln_final", norm, norm_formula) if cfg.final_norm else
                LedgerRow("ln_final", 0, "final_norm=False: none"))
    bias, bias_formula = (V, f" + bias V = {V}") if cfg.readout_bias else (0, "")
    if cfg.tie_embeddings:
        rows.append(LedgerRow("lm_head", bias, "tied: the token_embeddings Parameter, 0 "
                              "additional" + bias_formula))
    else:
        rows.append(LedgerRow("lm_head", V * D + bias, f"untied: V*D = {V}*{D}" + bias_formula))
    return Ledger(rows, "analytic")


def _attention(cfg: DecoderConfig) -> tuple[int, str]:
    """One block's attention (count, formula): q, k, v, output, their biases, q/k norms."""
    D, d_q, d_kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    attn = D * d_q + 2 * D * d_kv + d_q * D
    formula = f"D*H*Dh + 2*D*Hkv*Dh + H*Dh*D = {D}*{d_q} + 2*{D}*{d_kv} + {d_q}*{D}"
    bias, bias_formula = _attention_biases(cfg)
    attn, formula = attn + bias, formula + bias_formula
    if cfg.qk_norm and cfg.qk_norm_scope == "projection":
        attn += d_q + d_kv
        formula += f" + q/k norm gains H*Dh + Hkv*Dh = {d_q}+{d_kv}"
    elif cfg.qk_norm:
        attn += 2 * cfg.head_dim
        formula += f" + q/k norm gains 2*Dh = 2*{cfg.head_dim}"
    if cfg.qk_norm and cfg.qk_norm_kind == "layernorm" and cfg.norm_bias:
        shifts = d_q + d_kv if cfg.qk_norm_scope == "projection" else 2 * cfg.head_dim
        attn += shifts  # a q/k LayerNorm's shifts, as many as its gains (Persimmon)
        formula += f" + their shifts {shifts}"
    if cfg.attn_sinks:
        attn += cfg.n_heads
        formula += f" + sinks H = {cfg.n_heads}"
    return attn, formula


def _latent_attention(cfg: DecoderConfig) -> tuple[int, str]:
    """One block's latent attention (count, formula): the query's latent (or q_proj), the
    key/value latent with the rotary key, its expansion per head, the output projection."""
    D, H, Dh, Dv = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.value_dim
    C, R, Dn, Cq = cfg.kv_latent_rank, cfg.rope_head_width, cfg.nope_head_width, cfg.q_latent_rank
    if Cq is None:
        query, q_formula = D * H * Dh, f"q D*H*Dh = {D}*{H}*{Dh}"
    else:
        query = D * Cq + Cq + Cq * H * Dh
        q_formula = f"q D*Cq + Cq + Cq*H*Dh = {D}*{Cq} + {Cq} + {Cq}*{H}*{Dh}"
    kv = D * (C + R) + C + C * H * (Dn + Dv)
    kv_formula = f"kv D*(C+R) + C + C*H*(Dn+Dv) = {D}*{C + R} + {C} + {C}*{H}*{Dn + Dv}"
    return (query + kv + H * Dv * D,
            f"{q_formula}; {kv_formula}; out H*Dv*D = {H}*{Dv}*{D}")


def _dense_mlp(cfg: DecoderConfig, width: int | None = None, expert: bool = False
               ) -> tuple[int, str]:
    """One MLP of `width` (default d_ff) with the config's matrices and biases (count,
    formula); `expert`: a routed expert's, biased on every matrix where expert_bias says."""
    D, F = cfg.d_model, cfg.d_ff if width is None else width
    n_in = 2 if cfg.gated else 1  # matrices D -> F (w1, and w3 for SwiGLU / GeGLU)
    ffn = n_in * D * F + F * D
    formula = f"{n_in + 1}*D*F = {n_in + 1}*{D}*{F}"
    names = ("w1", "w3", "w2") if cfg.gated else ("w1", "w2")
    biased = [name for name in names if (cfg.expert_bias if expert else cfg.has_bias(name))]
    ffn += sum(D if name == "w2" else F for name in biased)  # F for w1, w3 (D -> F); D for w2
    if len(biased) == n_in + 1:  # every matrix
        formula += f" + biases {n_in}*{F}+{D}"
    elif biased:
        formula += f" + biases {'+'.join(str(D if n == 'w2' else F) for n in biased)} " \
                   f"({'/'.join(biased)})"
    if cfg.mlp == "xielu":  # its activation's two learned numbers (a dense layer's only)
        ffn += 2
        formula += " + xIELU's alpha_p, alpha_n 2"
    return ffn, formula


def expert_parameters(cfg: DecoderConfig) -> int:
    """One routed expert's parameters: an MLP of width Fe (0 for a config without experts)."""
    return _dense_mlp(cfg, cfg.expert_dim, expert=True)[0] if cfg.routed else 0


def _routed_mlp(cfg: DecoderConfig) -> tuple[int, str]:
    """One routed layer's MLP (count, formula): the router (and its selection bias), E experts
    of width Fe, the shared experts as one MLP of their total width."""
    D, E, m = cfg.d_model, cfg.n_experts, 3 if cfg.gated else 2
    router = E * D + E * (cfg.router_selection_bias + cfg.router_bias)
    formula = f"router E*D = {E}*{D}" + (f" + selection bias {E}" if cfg.router_selection_bias
                                          else "") + (f" + bias {E}" if cfg.router_bias else "")
    formula += f"; {E} experts x {m}*D*Fe = {E} x {m}*{D}*{cfg.expert_dim}"
    if cfg.expert_bias:
        formula += f" + biases {m - 1}*{cfg.expert_dim}+{D}"
    count = router + E * expert_parameters(cfg)
    if cfg.n_shared_experts:
        count += _dense_mlp(cfg, cfg.shared_dim)[0]
        formula += f"; shared {m}*D*Fs = {m}*{D}*{cfg.shared_dim}"
    if cfg.shared_expert_gate:
        count += D
        formula += f" + its gate D = {D}"
    return count, formula


def active_parameters(cfg: DecoderConfig) -> int:
    """The parameters one token's forward reads: every weight but the routed experts it is not
    sent to ((E - k) experts in each routed layer); the total for a model without experts.
    Embeddings, attention, norms, the router and the shared experts all count."""
    total = parameter_ledger(cfg).total
    if not cfg.routed:
        return total
    idle = (cfg.n_experts - cfg.experts_per_token) * expert_parameters(cfg)
    return total - idle * sum(cfg.routes(i) for i in range(cfg.n_layers))


def _attention_biases(cfg: DecoderConfig) -> tuple[int, str]:
    """The attention projections' biases (count, formula): Hq*Dh for q, Hkv*Dh for k and v,
    D for the output projection, each where the config gives it one."""
    d_q, d_kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    widths = {"q_proj": d_q, "k_proj": d_kv, "v_proj": d_kv, "output_proj": cfg.d_model}
    biased = [name for name in widths if cfg.has_bias(name)]
    if not biased:
        return 0, ""
    if biased[:3] == ["q_proj", "k_proj", "v_proj"]:
        formula = f" + q/k/v biases {d_q}+2*{d_kv}"
        rest = biased[3:]
    else:
        formula, rest = "", biased
    formula += "".join(f" + {name.removesuffix('_proj')} bias {widths[name]}"
                       for name in rest)
    return sum(widths[name] for name in biased), formula


def _component(name: str) -> str:
    """Ledger row of a parameter of our Decoder, from its DESIGN.md weight name."""
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) >= 3:
        part = "norms" if parts[2] in ("ln1", "ln2", "ln1_post", "ln2_post") else parts[2]
        if part in BLOCK_PARTS:
            return f"layers.{parts[1]}.{part}"
    if parts[0] in ("token_embeddings", "position_embeddings", "embedding_norm", "ln_final",
                    "lm_head"):
        return parts[0]
    return "other"


def measured_ledger(module: nn.Module, names: Mapping[str, str] | None = None) -> Ledger:
    """Walk the module's unique Parameters (a tied weight is one object, counted once, under the
    first name it was registered with) and sum them into ledger rows by weight name: our names,
    or, for a module of another layout, the canonical names `names` gives its parameters (a
    parameter it does not name is "other"). A buffer `names` names holds a canonical weight
    (DeepSeek-V3's selection bias, which our Decoder keeps as a Parameter that requires no grad)
    and is counted as that Parameter."""
    counts: dict[str, int] = {}
    others: list[str] = []
    tensors = list(module.named_parameters())  # deduplicated by object identity
    if names is not None:
        tensors += [(name, buffer) for name, buffer in module.named_buffers() if name in names]
    for name, param in tensors:
        row = _component(name if names is None else names.get(name, "?"))
        counts[row] = counts.get(row, 0) + param.numel()
        if row == "other":
            others.append(name)
    notes = [f"parameters outside the known layout: {others}"] if others else []
    return Ledger([LedgerRow(name, count) for name, count in counts.items()], "measured", notes)


def reconcile(analytic: Ledger, measured: Ledger) -> list[str]:
    """Every row where the two ledgers differ, with both counts; empty when they agree."""
    want, got = analytic.as_dict(), measured.as_dict()
    problems = []
    for name in list(want) + [n for n in got if n not in want]:
        a, m = want.get(name, 0), got.get(name, 0)
        if a != m:
            hint = ""
            if name == "lm_head" and a == 0:
                hint = " (declared tied, but the readout is a separate Parameter)"
            problems.append(f"{name}: analytic {a:,} vs measured {m:,} ({m - a:+,}){hint}")
    if analytic.total != measured.total:
        problems.append(f"total: analytic {analytic.total:,} vs measured {measured.total:,}")
    return problems
