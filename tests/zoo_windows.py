"""Decoders whose sliding window is declared and not attended as declared (the `window` check):

    dropped_window(cfg)      our Decoder with layer 0's window dropped: it reads every earlier token
    window_on_full_layer(cfg)  our Decoder with layer 1, declared full, windowed anyway
    window_one_too_wide(cfg)   our Decoder whose windowed layers read W + 1 positions
    WindowLlama(window)      a hand-written Llama with Hugging Face's names at its root (as
                             zoo_styles.RootLlama) whose attention is a module of its own, applying
                             `window` (None: full attention); audited against a spec that declares
                             a window of 16.
    learner_gpt(window)      examples/learner's tied GPT (nanoGPT's names, its attention a method
                             of the block: no attention module the window check could read),
                             applying `window` (None: the example as written); LEARNER_SPEC is
                             its spec.json declaring a window of 16.

Each window is wider than the oracle's usual probes (T <= 12), so the window check sees it where
it can read the layers (the first three, WindowLlama); where it cannot (learner_gpt), the oracle
runs past the window (gate/checks/spec.py, WINDOW_ORACLE_MAX).
"""

from __future__ import annotations

import importlib.util
import math
import types
from pathlib import Path

import torch
import torch.nn.functional as F
import zoo_styles
from torch import nn

import decoder_audit as da

# a window the oracle's T <= 12 probes never reach; max_seq_len leaves room past it
WINDOWED = da.preset("llama-debug").replace(sliding_window=16, window_layers=(0, 2),
                                            max_seq_len=48)


def dropped_window(cfg: da.DecoderConfig = WINDOWED) -> da.Decoder:
    torch.manual_seed(0)
    model = da.Decoder(cfg)
    model.layers[0].attn.window = None
    return model


def window_on_full_layer(cfg: da.DecoderConfig = WINDOWED) -> da.Decoder:
    torch.manual_seed(0)
    model = da.Decoder(cfg)
    model.layers[1].attn.window = cfg.sliding_window
    return model


def window_one_too_wide(cfg: da.DecoderConfig = WINDOWED) -> da.Decoder:
    torch.manual_seed(0)
    model = da.Decoder(cfg)
    for layer in model.layers:
        if layer.attn.window is not None:
            layer.attn.window += 1
    return model


SPEC = zoo_styles.SPECS["hf_root"].replace(sliding_window=16, max_seq_len=48)


class WindowAttention(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, window: int | None) -> None:
        super().__init__()
        d, dh = cfg.d_model, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.n_heads * dh, bias=False)
        self.k_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.v_proj = nn.Linear(d, cfg.kv_heads * dh, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * dh, d, bias=False)
        self.cfg, self.window = cfg, window

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        cfg, dh = self.cfg, self.cfg.head_dim
        q = self.q_proj(hidden_states).view(b, t, cfg.n_heads, dh).transpose(1, 2)
        k, v = (p(hidden_states).view(b, t, cfg.kv_heads, dh).transpose(1, 2)
                for p in (self.k_proj, self.v_proj))  # (B, Hkv, T, Dh)
        q, k = (zoo_styles._rope(z, cfg.rope_theta, interleaved=False) for z in (q, k))
        group = cfg.n_heads // cfg.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B, H, T, Dh)
        back = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # (T, T): query - key
        allowed = (back >= 0) & (back < (self.window or t + 1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        z = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
        return self.o_proj(z.transpose(1, 2).reshape(b, t, -1))


class _Layer(nn.Module):
    def __init__(self, cfg: da.DecoderConfig, window: int | None) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = WindowAttention(cfg, window)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.up_proj = nn.Linear(d, cfg.d_ff, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.d_ff, d, bias=False)
        self.input_layernorm = zoo_styles.StyleRMSNorm(d, cfg.norm_eps)
        self.post_attention_layernorm = zoo_styles.StyleRMSNorm(d, cfg.norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class WindowLlama(nn.Module):
    def __init__(self, window: int | None = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = SPEC
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(_Layer(cfg, window) for _ in range(cfg.n_layers))
        self.norm = zoo_styles.StyleRMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


LEARNER = Path(__file__).resolve().parents[1] / "examples" / "learner"
LEARNER_SPEC = da.DecoderConfig.load(LEARNER / "spec.json").replace(sliding_window=16)


def learner_gpt(window: int | None) -> nn.Module:
    """examples/learner's GPT, its blocks' attention reading at most `window` positions back."""
    loaded = importlib.util.spec_from_file_location("learner_model", LEARNER / "model.py")
    learner = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(learner)
    model = learner.build()
    for block in model.transformer.h:
        block.attention = types.MethodType(_windowed_attention(window), block)
    return model


def _windowed_attention(window: int | None):
    def attention(self, x):  # the learner's Block.attention with the window applied
        b, t, d = x.shape
        heads = 4
        q, k, v = self.attn.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads)
        back = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # (T, T): query - key
        hidden = (back < 0) | (back >= (window or t + 1))
        y = scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v  # (B, H, T, Dh)
        return self.attn.c_proj(y.transpose(1, 2).reshape(b, t, d))
    return attention
