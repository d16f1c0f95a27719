"""Stand-ins for peer libraries that cannot be installed beside the project's pins, for the
readers of `decoder_audit.references.peer_configs` (tests/gate/test_peer_specs.py). Each is
marked STAND-IN: the real package is tested where it installs (litgpt: .ci/litgpt).

    NanoGPT     nanoGPT's model.py (karpathy/nanoGPT, not a package on the registry: users copy
                the file), with its GPTConfig dataclass, written here in our own words: the
                same names, fields and arithmetic. One line differs, and is said where it is:
                called without targets, nanoGPT returns only the last position's logits (an
                inference shortcut); this one returns every position's, as nanoGPT does when it
                is given targets, so the gate's full-sequence checks can run.
    LitConfig   litgpt 0.5.9's `Config` fields and defaults (read from its wheel), with the
                derived fields its __post_init__ fills in, for `tests/zoo_styles.LitGPT`, whose
                modules follow litgpt's GPT with a Llama config. litgpt 0.5.9 needs numpy<2
                and psutil 7.0 (the project pins numpy 2.4.6 and psutil 7.2.2); 0.5.10 to
                0.5.13 cap huggingface-hub below 1.4, which transformers 5.24 needs at 1.31 or
                more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


# ---- nanoGPT (STAND-IN) --------------------------------------------------------------------------

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: an optional bias (PyTorch's had none to switch off), eps 1e-5."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):  # noqa: A002 - nanoGPT's name
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(config.dropout), \
            nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for z in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout
                                           if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.attn = LayerNorm(config.n_embd, config.bias), CausalSelfAttention(config)
        self.ln_2, self.mlp = LayerNorm(config.n_embd, config.bias), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's GPT (its class name there is GPT)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, \
            f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # STAND-IN: nanoGPT keeps only x[:, [-1], :] without targets
        loss = None if targets is None else F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


# ---- litgpt's Config (STAND-IN) ----------------------------------------------------------------

@dataclass
class Config:
    """litgpt 0.5.9's Config: its fields and defaults, and what __post_init__ derives."""

    name: str = ""
    hf_config: dict = field(default_factory=dict)
    block_size: int = 4096
    n_layer: int = 16
    n_embd: int = 4096
    vocab_size: int = 50254
    padding_multiple: int = 512
    padded_vocab_size: int | None = None
    norm_class_name: str = "LayerNorm"
    norm_eps: float = 1e-5
    norm_qk: bool = False
    norm_qk_type: str = "default"
    post_attention_norm: bool = False
    post_mlp_norm: bool = False
    parallel_residual: bool = True
    shared_attention_norm: bool = False
    n_head: int = 32
    head_size: int | None = None
    n_query_groups: int | None = None
    attn_bias: bool = False
    attention_scores_scalar: int | None = None
    sliding_window_size: int | None = None
    sliding_window_indices: list | None = None
    attention_logit_softcapping: float | None = None
    rope_base: int = 10000
    rotary_percentage: float = 0.25
    rope_condense_ratio: int = 1
    rope_adjustments: dict | None = None
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    bias: bool = True
    mlp_class_name: str = "GptNeoxMLP"
    gelu_approximate: str = "none"
    n_expert: int = 0
    n_expert_per_token: int = 0
    scale_embeddings: bool = False
    lm_head_bias: bool = False
    final_logit_softcapping: float | None = None
    norm_1: bool = True
    norm_2: bool = True
    rope_local_base_freq: float | None = None
    rope_indices: list | None = None

    def __post_init__(self) -> None:
        if self.head_size is None:
            self.head_size = self.n_embd // self.n_head
        if self.padded_vocab_size is None:
            multiple = self.padding_multiple
            self.padded_vocab_size = -(-self.vocab_size // multiple) * multiple
        else:
            self.vocab_size = min(self.vocab_size, self.padded_vocab_size)
        if self.n_query_groups is None:
            self.n_query_groups = self.n_head
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.n_embd
        self.rope_n_elem = int(self.rotary_percentage * self.head_size)
        if self.sliding_window_size is not None and self.sliding_window_indices is None:
            self.sliding_window_indices = [1] * self.n_layer
