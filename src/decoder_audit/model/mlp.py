"""The block's MLP: one dense `FeedForward`, or `RoutedExperts` (a mixture of experts) where the
config routes the layer.

    dense:   w2(act(w1 x)), or gated w2(act(w1 x) * w3 x)
    routed:  router logits r = W_r x (E,); scores s = softmax(r) or sigmoid(r); the k experts
             of the largest s (+ a selection-only bias) chosen, from the best groups where the
             experts are grouped; their weights g = s[chosen],
             divided by their sum where normalize_topk, times routed_scaling; then
             out = sum_j g_j * expert_{chosen_j}(x)  +  shared(x)  (x sigmoid(w_g . x), gated)

Each expert is a FeedForward of width Fe (named `experts.{e}.w1` ...); the shared experts run as
one FeedForward of width n_shared x their width (`shared.w1` ...), which is exactly the sum of
separate ones (their hidden units side by side). The plain forward loops over the experts, each
taking the tokens routed to it (clarity first: the loop is the definition), every token's rows
multiplied on their own, so its result does not depend on how many tokens share its expert
(`_rowwise`: the gate compares rows of different batches exactly). On the meta device
the routing has no values, so no token can be sent anywhere: the experts' matrices are gathered
per token instead (`_gathered`), the same products with the same shapes, which is what the FLOP
count measures. Both compute the same function (tests/model/test_experts.py).

Shape letters: B batch, T sequence, D d_model, F FFN width, E experts, k experts per token,
N = B*T tokens, Fe an expert's width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig
from .layers import INIT_STD, Linear
from .trace import Trace

_ACTIVATIONS = {
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),  # squared ReLU (Primer; Nemotron, Persimmon)
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swiglu": F.silu,  # the gate's activation of a gated MLP
    "geglu": lambda x: F.gelu(x, approximate="tanh"),
}


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float
                   ) -> torch.Tensor:
    """GPT-OSS's gated unit: the gate clamped above at `limit`, the up projection to [-limit,
    limit], then (up + 1) * g * sigmoid(alpha * g)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


class XIELU(nn.Module):
    """Apertus' xIELU (Huang et al. 2024), learned per layer: a_p = softplus(alpha_p) and
    a_n = 1/2 + softplus(alpha_n); x > 0 gives a_p x^2 + x/2, otherwise
    a_n (expm1(min(x, -1e-6)) - x) + x/2 (alpha_p, alpha_n: one number each, (1,))."""

    BETA, EPS = 0.5, -1e-6

    def __init__(self, **factory) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.empty(1, **factory))
        self.alpha_n = nn.Parameter(torch.empty(1, **factory))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A fresh layer's a_p and a_n are 0.8 (softplus inverted: log(expm1(a)))."""
        self.alpha_p.fill_(math.log(math.expm1(0.8)))
        self.alpha_n.fill_(math.log(math.expm1(0.8 - self.BETA)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a_p = F.softplus(self.alpha_p)
        a_n = self.BETA + F.softplus(self.alpha_n)
        negative = (torch.expm1(torch.clamp(x, max=self.EPS)) - x) * a_n
        return torch.where(x > 0, a_p * x * x, negative) + self.BETA * x


def _record(trace: Trace | None, name: str, value: torch.Tensor) -> None:
    if trace is not None:
        trace.record(name, value)


class FeedForward(nn.Module):
    """w2(act(w1 x)), or gated w2(act(w1 x) * w3 x): SwiGLU (SiLU), GeGLU (tanh GELU). The
    width is final (d_ff, or an expert's): nothing rescales it. `rowwise` (a routed expert's):
    each row of x multiplied on its own (`_rowwise`), so a row's result does not depend on how
    many rows come with it."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, width: int | None = None,
                 rowwise: bool = False, biased: bool | None = None, **factory) -> None:
        super().__init__()
        self.rowwise = rowwise
        self.clamped = (cfg.swiglu_alpha, cfg.swiglu_limit) if cfg.mlp == "swiglu_clamped" \
            else None  # GPT-OSS's (alpha, limit)
        # a learned activation is a module of its own (its weights ffn.act.*)
        self.act = XIELU(**factory) if cfg.mlp == "xielu" else None
        self.activation = (self._clamped_unit if self.clamped is not None
                           else _ACTIVATIONS.get(cfg.mlp))
        D, F_ = cfg.d_model, cfg.d_ff if width is None else width
        # per matrix biases (mlp_bias); `biased`: every matrix or none (a routed expert's)
        bias = cfg.has_bias if biased is None else (lambda name: biased)
        self.w1 = Linear(D, F_, bias("w1"), init_std=INIT_STD, **factory)
        # writes into the residual stream
        self.w2 = Linear(F_, D, bias("w2"), init_std=residual_std, **factory)
        self.w3 = Linear(D, F_, bias("w3"), init_std=INIT_STD, **factory) if cfg.gated else None

    def _clamped_unit(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(gate, up, *self.clamped)

    def forward(self, x: torch.Tensor, trace: Trace | None = None,
                prefix: str = "") -> torch.Tensor:
        linear = _rowwise if self.rowwise else (lambda layer, rows: layer(rows))
        gate = linear(self.w1, x)  # (B, T, F), an expert's (n, Fe)
        # a routed expert's activation in float64, rounded once (see the note above _rowwise)
        wide = (lambda t: t.double()) if self.rowwise else (lambda t: t)
        if self.clamped is not None:  # the up projection goes inside the clamped unit
            hidden = self.activation(wide(gate), wide(linear(self.w3, x))).to(gate.dtype)
        else:  # a learned activation is a dense layer's only: never rowwise
            hidden = self.act(gate) if self.act is not None else \
                self.activation(wide(gate)).to(gate.dtype)
            if self.w3 is not None:
                hidden = hidden * linear(self.w3, x)
        _record(trace, f"{prefix}.hidden", hidden)
        return linear(self.w2, hidden)


# A routed expert's activation runs in float64 and is rounded once to the model's dtype: the
# vectorised kernel of SiLU or GELU finishes a tensor's tail with scalar code that rounds
# differently, and an expert's tensor grows with the tokens sent to it, so in float32 a token's
# activation would move by an ulp with the other tokens of the batch; in float64 both codes
# agree far below float32's rounding. (A dense MLP's tensor has the batch's shape: no need.)


def _rowwise(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """x W^T (+ b) for x (n, in), each row its own (1 x in)(in x out) product (`_RowProducts`).
    One matrix product of n rows picks its kernel by n (a row alone goes through gemv, and
    gemm's blocking changes with the row count), so an expert's token would round differently
    with the number of tokens sharing its expert, and a correct routed model would fail the
    gate's exact batch_independence and causal comparisons by an ulp; row by row it rounds the
    same in any batch."""
    out = _RowProducts.apply(x, layer.weight)  # (n, out)
    return out if layer.bias is None else out + layer.bias


class _RowProducts(torch.autograd.Function):
    """Forward: bmm of each row (1 x in) with the weight expanded n times (a view, no copy).
    Backward: two ordinary products, grad_x = grad W and grad_W = grad^T x (autograd through
    the expanded view would build an (n, in, out) gradient and sum it: 90x slower). The
    gradients need no row-by-row rounding: the gate compares them within tolerance, and a
    zero row of grad gives an exactly zero row of grad_x either way (grad_causal)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        n = x.shape[0]
        return torch.bmm(x[:, None, :], weight.t().expand(n, -1, -1)).squeeze(1)  # (n, out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x  # (n, in), (out, in)


class Router(nn.Module):
    """The router's logits W_r x, (E, D), and DeepSeek-V3's selection-only bias (E,): added to
    the scores to choose the experts, never to weigh them; it gets no gradient (none flows
    through a choice), so it is a Parameter that requires none."""

    def __init__(self, cfg: DecoderConfig, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, cfg.d_model, **factory))  # (E, D)
        # GPT-OSS's bias on the logits (E,): it chooses and weighs, unlike the selection bias
        self.bias = nn.Parameter(torch.empty(cfg.n_experts, **factory)) if cfg.router_bias \
            else None
        self.selection_bias = nn.Parameter(torch.empty(cfg.n_experts, **factory),
                                           requires_grad=False) \
            if cfg.router_selection_bias else None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.weight.normal_(0.0, INIT_STD)
        for bias in (self.bias, self.selection_bias):
            if bias is not None:
                bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., E)


class RoutedExperts(nn.Module):
    """A routed MLP: each token's k experts, weighted by the router, plus the shared experts."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, **factory) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = Router(cfg, **factory)
        self.experts = nn.ModuleList(
            FeedForward(cfg, residual_std=residual_std, width=cfg.expert_dim, rowwise=True,
                        biased=cfg.expert_bias, **factory) for _ in range(cfg.n_experts))
        self.shared = (FeedForward(cfg, residual_std=residual_std, width=cfg.shared_dim,
                                   **factory) if cfg.n_shared_experts else None)
        # Qwen2-MoE: the shared experts' output scaled by sigmoid(w_g . x), (1, D)
        self.shared_gate = (Linear(cfg.d_model, 1, False, init_std=INIT_STD, **factory)
                            if cfg.shared_expert_gate else None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits (N, E), the chosen experts (N, k), their weights (N, k)) for tokens x (N, D),
        the scores in at least float32; a token over an expert's capacity gets weight 0 there."""
        cfg = self.cfg
        logits = self.router(x)  # (N, E)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        score = (lambda r: r.softmax(-1)) if cfg.router_scoring == "softmax" else torch.sigmoid
        bias = self.router.selection_bias
        # the k largest logits, scored among themselves; or every expert scored, then the top k
        scores = wide if cfg.router_order == "topk_score" else score(wide)  # (N, E)
        chosen = self._within_groups(scores if bias is None else scores + bias).topk(
            cfg.experts_per_token).indices  # (N, k)
        weights = scores.gather(-1, chosen)  # (N, k)
        if cfg.router_order == "topk_score":
            weights = score(weights)
        if cfg.normalize_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights * cfg.routed_scaling
        capacity = cfg.expert_capacity(x.shape[0])
        if capacity is not None and x.device.type != "meta":  # meta: no routing to count
            weights = weights * _within_capacity(chosen, cfg.n_experts, capacity)
        return logits, chosen, weights

    def _within_groups(self, selection: torch.Tensor) -> torch.Tensor:
        """selection (N, E) with every expert outside a token's best groups_per_token groups set
        to -inf (group-limited routing), each group ranked by its two best scores summed or its
        best; unchanged without expert_groups."""
        cfg = self.cfg
        if cfg.expert_groups is None:
            return selection
        grouped = selection.unflatten(-1, (cfg.expert_groups, -1))  # (N, G, E/G)
        ranked = (grouped.topk(2, dim=-1).values.sum(-1) if cfg.group_score == "top2_sum"
                  else grouped.amax(-1))  # (N, G)
        best = ranked.topk(cfg.groups_per_token, dim=-1).indices  # (N, groups_per_token)
        keep = torch.zeros_like(ranked, dtype=torch.bool).scatter(-1, best, True)  # (N, G)
        return grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)  # (N, E)

    def forward(self, x: torch.Tensor, trace: Trace | None = None,
                prefix: str = "") -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        batch, seq_len, d_model = x.shape
        tokens = x.reshape(-1, d_model)  # (N, D)
        logits, chosen, weights = self.route(tokens)
        if trace is not None:
            gates = torch.zeros_like(logits, dtype=weights.dtype).scatter(-1, chosen, weights)
            _record(trace, f"{prefix}.router", logits.view(batch, seq_len, -1))
            _record(trace, f"{prefix}.gates", gates.view(batch, seq_len, -1))  # (B, T, E)
        weights = weights.to(x.dtype)
        if x.device.type == "meta":
            out = self._gathered(tokens, chosen, weights)
        else:
            out = torch.zeros_like(tokens)  # (N, D)
            for e, expert in enumerate(self.experts):
                # the tokens routed to e; an expert with none still runs, on (0, D): its weights
                # get a zero gradient, not none (DistributedDataParallel reduces every one)
                token, slot = (chosen == e).nonzero(as_tuple=True)
                out = out.index_add(0, token, expert(tokens[token]) * weights[token, slot, None])
        if self.shared is not None:
            out = out + self.shared_output(tokens)
        return out.view(batch, seq_len, d_model)

    def shared_output(self, tokens: torch.Tensor) -> torch.Tensor:
        """The shared experts on tokens (N, D), scaled by their gate where they have one."""
        shared = self.shared(tokens)  # (N, D)
        if self.shared_gate is not None:
            shared = shared * torch.sigmoid(self.shared_gate(tokens))  # (N, 1) gate
        if self.cfg.shared_expert_scale != 1.0:  # Cohere 2 MoE's average: (routed + shared) / 2
            shared = shared * self.cfg.shared_expert_scale
        return shared

    def _gathered(self, tokens: torch.Tensor, chosen: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
        """The same sum with every token's k experts' matrices gathered, (N, k, Fe, D): shapes
        that do not depend on the routing (the meta device's path)."""
        def stacked(name: str, part: str = "weight") -> torch.Tensor:  # (E, out, in), (E, out)
            one = getattr(getattr(self.experts[0], name), part)
            if one is None:  # no bias
                return None
            if tokens.device.type == "meta":  # no values to stack: one expert's shape, E times
                return one.expand(len(self.experts), *one.shape)
            return torch.stack([getattr(getattr(expert, name), part) for expert in self.experts])

        def product(name: str, rows: torch.Tensor) -> torch.Tensor:  # rows (N, k, in)
            out = (rows[..., None, :] @ stacked(name)[chosen].transpose(-1, -2)).squeeze(-2)
            bias = stacked(name, "bias")
            return out if bias is None else out + bias[chosen]  # (N, k, out)

        first = self.experts[0]
        x = tokens[:, None, :].expand(-1, chosen.shape[1], -1)  # (N, k, D)
        gate = product("w1", x)  # (N, k, Fe)
        if first.clamped is not None:
            hidden = first.activation(gate, product("w3", x))
        else:
            hidden = first.activation(gate)
            if first.w3 is not None:
                hidden = hidden * product("w3", x)
        return (product("w2", hidden) * weights[..., None]).sum(1)  # (N, k, D) -> (N, D)


def _within_capacity(chosen: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """(N, k) 1 where token n's slot j is among the first `capacity` assignments of its expert,
    counted in token order (batch-major) then slot; 0 where it is dropped."""
    assigned = F.one_hot(chosen.reshape(-1), n_experts)  # (N*k, E)
    rank = (assigned.cumsum(0) * assigned).sum(-1) - 1  # (N*k,): earlier assignments to its expert
    return (rank < capacity).reshape(chosen.shape).to(torch.float32)
