"""A learner's own tied GPT, written the way nanoGPT writes one: the model `decoder-audit verify
--model examples/learner/model.py:build --spec examples/learner/spec.json` checks against the
architecture declared in spec.json (pre-norm LayerNorm blocks, exact GELU, learned positions,
biases, the readout tied to the token embedding)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 64, 32, 32, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.ModuleDict(dict(c_attn=nn.Linear(WIDTH, 3 * WIDTH),
                                       c_proj=nn.Linear(WIDTH, WIDTH)))
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(WIDTH, 4 * WIDTH),
                                      c_proj=nn.Linear(4 * WIDTH, WIDTH)))

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.attn.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // HEADS)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, WIDTH), wpe=nn.Embedding(CONTEXT, WIDTH),
            h=nn.ModuleList(Block() for _ in range(LAYERS)), ln_f=nn.LayerNorm(WIDTH)))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one Parameter

    def forward(self, idx):
        if idx.shape[1] > CONTEXT:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the context {CONTEXT}")
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build():
    torch.manual_seed(0)
    return GPT()
