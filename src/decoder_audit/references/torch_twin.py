"""The torch.nn twin: seed 000's table made literal, an independent reference for `Decoder`.

Every operation is a registered PyTorch module, so the twin shares no code with `model/`:

    nn.Embedding(V, D)                                token lookup E[ids]
    nn.Parameter(max_seq_len, D)                      learned positions P[:T]   (pos="learned")
    per block: nn.LayerNorm(D)                        N1
               nn.MultiheadAttention(D, H, bias=attn_bias, batch_first=True)
               nn.LayerNorm(D)                        N2
               nn.Sequential(Linear(D, F), ReLU | GELU | GELU(tanh), Linear(F, D))
    nn.LayerNorm(D)                                   final norm
    nn.Linear(D, V, bias=False)                       readout; its weight IS the embedding's
                                                      Parameter when tied (one object)

It expresses the configs of this family (LayerNorm, learned or no positions, full multi-head
attention, optional biases, relu/gelu/gelu_tanh) and refuses the rest with a ConfigError naming
the field: RMSNorm, SwiGLU, RoPE and grouped-query attention have no stock nn module.

nn.MultiheadAttention conventions to mind (DEFECTS.md B7):
  * a boolean `attn_mask` marks with True the keys a query may NOT see (SDPA uses the opposite),
    so the causal mask is True strictly above the diagonal;
  * `need_weights=True` averages the heads unless `average_attn_weights=False`;
  * q, k, v projections live stacked in one `in_proj_weight` (3D, D): rows [q; k; v], each block
    with head h owning rows h*Dh..(h+1)*Dh-1, exactly as our q_proj/k_proj/v_proj.

Weight transfer is a name table plus one concatenation (q, k, v <-> in_proj):
`twin_from_decoder(decoder)`, `decoder_from_twin(twin)`; both copy, neither shares storage.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..model.decoder import Decoder, check_ids
from ..storage.checkpoint import copy_into_parameters, decoder_from_tensors

_ACTIVATIONS = {
    "relu": lambda: nn.ReLU(),
    "gelu": lambda: nn.GELU(),  # exact erf GELU
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's approximation
}


def twin_unsupported(cfg: DecoderConfig) -> list[str]:
    """Why the twin cannot express `cfg`, one entry per field (empty when it can)."""
    problems = []
    if cfg.norm != "layernorm":
        problems.append(f"norm={cfg.norm!r}: the twin has nn.LayerNorm only (no stock RMSNorm "
                        "matching ours)")
    if cfg.mlp not in _ACTIVATIONS:
        problems.append(f"mlp={cfg.mlp!r}: the twin's MLP is Linear, {'/'.join(_ACTIVATIONS)}, Linear")
    if cfg.pos not in ("learned", "none"):
        problems.append(f"pos={cfg.pos!r}: the twin adds a learned table or nothing; "
                        "nn.MultiheadAttention cannot rotate q and k (RoPE) and the twin has no "
                        "ALiBi bias and no sinusoidal table")
    if cfg.kv_heads != cfg.n_heads:
        problems.append(f"n_kv_heads={cfg.n_kv_heads} != n_heads={cfg.n_heads}: "
                        "nn.MultiheadAttention has no grouped-query attention")
    if cfg.embedding_scale is not None:
        problems.append(f"embedding_scale={cfg.embedding_scale}: the twin's embedding is unscaled")
    if not cfg.norm_bias:
        problems.append("norm_bias=False: the twin's nn.LayerNorm keeps its bias")
    if cfg.head_width is not None:
        problems.append(f"head_width={cfg.head_width}: nn.MultiheadAttention's heads are D / H "
                        "wide")
    if cfg.qk_norm:
        problems.append("qk_norm=True: nn.MultiheadAttention cannot normalise q and k")
    if cfg.parallel_residual or cfg.sandwich_norm:
        problems.append(f"parallel_residual={cfg.parallel_residual}, sandwich_norm="
                        f"{cfg.sandwich_norm}: the twin's block is sequential, two norms")
    if cfg.sliding_window is not None or cfg.attn_scale is not None or cfg.attn_softcap:
        problems.append(f"sliding_window={cfg.sliding_window}, attn_scale={cfg.attn_scale}, "
                        f"attn_softcap={cfg.attn_softcap}: nn.MultiheadAttention reads every "
                        "earlier token with scores q.k / sqrt(Dh)")
    if not cfg.norm_affine or not cfg.pre_norm:
        problems.append(f"norm_affine={cfg.norm_affine}, pre_norm={cfg.pre_norm}: the twin's "
                        "sublayers read learned nn.LayerNorms")
    if cfg.readout_bias:
        problems.append("readout_bias=True: the twin's readout has no bias")
    if cfg.logit_softcap is not None:
        problems.append(f"logit_softcap={cfg.logit_softcap}: the twin's logits are uncapped")
    if isinstance(cfg.attn_bias, tuple) or cfg.output_bias != cfg.attn_bias:
        problems.append(f"attn_bias={cfg.attn_bias}, attn_output_bias={cfg.attn_output_bias}: "
                        "nn.MultiheadAttention biases all of q, k, v and the output or none")
    if isinstance(cfg.mlp_bias, tuple):
        problems.append(f"mlp_bias={list(cfg.mlp_bias)}: the twin's MLP biases both of its "
                        "Linears or neither")
    beyond = cfg.changed(("shared_norm", "residual_multiplier", "logit_scale", "nope_layers",
                          "position_offset", "latent_norm_eps", "embedding_norm", "post_norm",
                          "final_norm", "qk_norm_kind", "attn_sinks", "qk_norm_position",
                          "query_position_scale"))
    if beyond:
        problems.append(f"{', '.join(beyond)}: the twin's block is seed 000's, with none of these")
    if cfg.norm_offset:
        problems.append(f"norm_offset={cfg.norm_offset}: nn.LayerNorm's gain is its weight, "
                        "with no offset")
    if cfg.routed:
        problems.append(f"n_experts={cfg.n_experts}: the twin's MLP is one nn.Sequential, never "
                        "routed experts")
    if cfg.latent_attention:
        problems.append(f"kv_latent_rank={cfg.kv_latent_rank}: nn.MultiheadAttention projects "
                        "q, k and v directly, never through latents")
    return problems


def _require_supported(cfg: DecoderConfig) -> None:
    problems = twin_unsupported(cfg)
    if problems:
        raise ConfigError("the torch.nn twin cannot express this config: " + "; ".join(problems))


class TwinBlock(nn.Module):
    """resid_mid = resid_pre + MHA(N1(resid_pre)); resid_post = resid_mid + MLP(N2(resid_mid))."""

    def __init__(self, cfg: DecoderConfig, **factory) -> None:
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d, eps=cfg.norm_eps, **factory)
        self.attn = nn.MultiheadAttention(d, cfg.n_heads, bias=cfg.attn_bias, batch_first=True,
                                          **factory)
        self.ln2 = nn.LayerNorm(d, eps=cfg.norm_eps, **factory)
        self.mlp = nn.Sequential(
            nn.Linear(d, cfg.d_ff, bias=cfg.mlp_bias, **factory),
            _ACTIVATIONS[cfg.mlp](),
            nn.Linear(cfg.d_ff, d, bias=cfg.mlp_bias, **factory),
        )

    def forward(self, resid_pre: torch.Tensor, future: torch.Tensor, need_weights: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        normed = self.ln1(resid_pre)  # (B, T, D)
        # q, k and v all read the same normalised stream. `future` is True where masked.
        attn_out, pattern = self.attn(normed, normed, normed, attn_mask=future,
                                      need_weights=need_weights, average_attn_weights=False)
        resid_mid = resid_pre + attn_out  # (B, T, D)
        resid_post = resid_mid + self.mlp(self.ln2(resid_mid))  # (B, T, D)
        return resid_post, pattern  # pattern (B, H, T, T) per head, or None


class TorchTwin(nn.Module):
    """ids (B, T) -> logits (B, T, V), built from stock torch.nn modules only."""

    def __init__(self, config: DecoderConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _require_supported(config)
        self.config = cfg = config
        factory = {"device": device, "dtype": dtype}
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model, **factory)  # (V, D)
        self.position = (
            nn.Parameter(torch.zeros(cfg.max_seq_len, cfg.d_model, **factory))
            if cfg.pos == "learned" else None
        )  # (max_seq_len, D)
        self.blocks = nn.ModuleList(TwinBlock(cfg, **factory) for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)
        self.readout = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, **factory)  # (V, D)
        if cfg.tie_embeddings:
            self.readout.weight = self.token_embedding.weight  # the same Parameter object

    def _apply(self, fn, recurse: bool = True):
        # to_empty() and some conversions give each slot a new Parameter; tie again (DEFECTS A1).
        super()._apply(fn, recurse)
        if self.config.tie_embeddings and self.readout.weight is not self.token_embedding.weight:
            self.readout.weight = self.token_embedding.weight
        return self

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, V)."""
        return self._run(ids, need_weights=False)[0]

    def forward_with_patterns(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and, per layer, nn.MultiheadAttention's per-head weights (B, H, T, T)."""
        return self._run(ids, need_weights=True)

    def _run(self, ids: torch.Tensor, need_weights: bool):
        check_ids(ids, self.config)  # the same input contract: typed errors, nothing cropped
        seq_len = ids.shape[1]
        x = self.token_embedding(ids.long())  # (B, T, D)
        if self.position is not None:
            x = x + self.position[:seq_len]  # (T, D) broadcast over B
        # nn.MultiheadAttention: boolean True = "may not attend". Strictly above the diagonal.
        future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=ids.device).triu(1)
        patterns = []
        for block in self.blocks:
            x, pattern = block(x, future, need_weights)
            patterns.append(pattern)
        return self.readout(self.ln_final(x)), patterns  # (B, T, V)


# ----------------------------------------------------------------------------------------------
# Weight transfer. The tables below map our unique parameter names to the twin's; the only
# non-rename is q_proj, k_proj, v_proj (each (D, D)) <-> in_proj_weight (3D, D), rows stacked.
# ----------------------------------------------------------------------------------------------

def _name_table(cfg: DecoderConfig) -> list[tuple[tuple[str, ...], str]]:
    """(our names, twin name): one our-name renames; three are stacked along rows."""
    table: list[tuple[tuple[str, ...], str]] = [(("token_embeddings.weight",), "token_embedding.weight")]
    if cfg.pos == "learned":
        table.append((("position_embeddings.weight",), "position"))
    for i in range(cfg.n_layers):
        ours, twin = f"layers.{i}", f"blocks.{i}"
        table += [((f"{ours}.ln1.weight",), f"{twin}.ln1.weight"),
                  ((f"{ours}.ln1.bias",), f"{twin}.ln1.bias"),
                  (tuple(f"{ours}.attn.{p}_proj.weight" for p in "qkv"), f"{twin}.attn.in_proj_weight"),
                  ((f"{ours}.attn.output_proj.weight",), f"{twin}.attn.out_proj.weight"),
                  ((f"{ours}.ln2.weight",), f"{twin}.ln2.weight"),
                  ((f"{ours}.ln2.bias",), f"{twin}.ln2.bias"),
                  ((f"{ours}.ffn.w1.weight",), f"{twin}.mlp.0.weight"),
                  ((f"{ours}.ffn.w2.weight",), f"{twin}.mlp.2.weight")]
        if cfg.attn_bias:
            table += [(tuple(f"{ours}.attn.{p}_proj.bias" for p in "qkv"), f"{twin}.attn.in_proj_bias"),
                      ((f"{ours}.attn.output_proj.bias",), f"{twin}.attn.out_proj.bias")]
        if cfg.mlp_bias:
            table += [((f"{ours}.ffn.w1.bias",), f"{twin}.mlp.0.bias"),
                      ((f"{ours}.ffn.w2.bias",), f"{twin}.mlp.2.bias")]
    table += [(("ln_final.weight",), "ln_final.weight"), (("ln_final.bias",), "ln_final.bias")]
    if not cfg.tie_embeddings:
        table.append((("lm_head.weight",), "readout.weight"))
    return table


def decoder_to_twin_tensors(cfg: DecoderConfig, tensors: Mapping[str, torch.Tensor]
                            ) -> dict[str, torch.Tensor]:
    """Our unique-parameter names -> the twin's (works for weights and for gradients alike)."""
    return {twin: torch.cat([tensors[n] for n in ours]) if len(ours) > 1 else tensors[ours[0]]
            for ours, twin in _name_table(cfg)}


def twin_to_decoder_tensors(cfg: DecoderConfig, tensors: Mapping[str, torch.Tensor]
                            ) -> dict[str, torch.Tensor]:
    """The twin's unique-parameter names -> ours (the inverse of decoder_to_twin_tensors)."""
    out: dict[str, torch.Tensor] = {}
    for ours, twin in _name_table(cfg):
        for name, part in zip(ours, tensors[twin].chunk(len(ours))):  # rows [q; k; v]
            out[name] = part
    return out


def twin_from_decoder(decoder: Decoder) -> TorchTwin:
    """A TorchTwin with the decoder's config, dtype and device, holding copies of its weights."""
    cfg = decoder.config
    weight = decoder.token_embeddings.weight
    twin = TorchTwin(cfg, device=weight.device, dtype=weight.dtype)  # refuses what it can't express
    copy_into_parameters(twin, decoder_to_twin_tensors(cfg, dict(decoder.named_parameters())))
    return twin.train(decoder.training)


def decoder_from_twin(twin: TorchTwin) -> Decoder:
    """A Decoder with the twin's config, dtype and device, holding copies of its weights."""
    tensors = twin_to_decoder_tensors(twin.config, dict(twin.named_parameters()))
    return decoder_from_tensors(twin.config, tensors).train(twin.training)
