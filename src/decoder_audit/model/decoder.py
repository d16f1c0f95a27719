"""`Decoder`: a configurable pre-norm causal decoder, readable top to bottom.

    ids (B, T) -> E[ids] (+ P[:T]) -> L x Block -> final norm -> h @ E^T (or an untied head)
    Block:  resid_mid  = resid_pre + Attn(N1(resid_pre))
            resid_post = resid_mid + MLP(N2(resid_mid))

The config's variants change the block where it says: a routed layer's MLP is a mixture of
experts (mlp.py), latent attention compresses keys and values (attention.py); a parallel block's
MLP reads N2(resid_pre);
sandwich norms normalise each sublayer's output before it is added (Gemma 2, OLMo 2); without
pre-norms N1 and N2 are the identity (OLMo 2); post-norm blocks normalise the stream after each
add instead, resid_mid = N1(resid_pre + Attn(resid_pre)) (GPT-1); a windowed layer's attention
reads the last W tokens only, on its own RoPE table where the config gives the windowed layers a
base. Positions enter as a learned table, a fixed sinusoidal one (positions.py), RoPE's turn of
q and k, or ALiBi's bias on the scores; an embedding norm may follow the embeddings (BLOOM) and
the final norm may be absent (GPT-1).

Shape letters: B batch, T sequence, D d_model, H query heads, Hkv KV heads, Dh head width,
F FFN width, V vocabulary. Every component is built from `nn.Parameter` and tensor ops, here
and in layers.py (Linear, Embedding, the norms); the weight names are those of DESIGN.md (the
CS336 names, extended). The fast path uses `F.scaled_dot_product_attention`; `run_with_trace`
takes the eager path (scores, mask, softmax, pattern) and records every intermediate. Both
compute the same function.

Generation (`forward(ids, attention_mask, cache=)`, cache.py) takes a third path through the same
weights: an optional attention mask for padded batches, positions taken from it, and a static
KV cache, so a prompt is prefilled once and each new token (or chunk) attends to the cached keys
at its absolute position. The gate's kv_cache and padding checks prove it equals the full forward.

Initialisation (GPT-2's scheme): every matrix and embedding ~ N(0, 0.02); the two projections
that write into the residual stream (attn.output_proj, ffn.w2) ~ N(0, 0.02 / sqrt(2L)) so the
residual variance does not grow with depth; biases 0; norm gains 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import DecoderConfig
from ..errors import ContextLengthError, InputShapeError, TokenIdError
from .attention import CausalSelfAttention, LatentAttention, query_scales, rope_rotations
from .cache import KVCache, attention_allowed, check_mask, windowed_allowed
from .layers import INIT_STD, Embedding, Linear, make_norm
from .mlp import FeedForward, RoutedExperts
from .positions import alibi_bias, sinusoids
from .trace import Trace

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_ids(ids: torch.Tensor, cfg: DecoderConfig) -> None:
    """Enforce the input contract before any lookup: integer (B, T), 1 <= T <= max_seq_len,
    ids in [0, V). Raises a DecoderInputError subclass naming the value and the limit."""
    if not isinstance(ids, torch.Tensor):
        raise InputShapeError(f"token ids must be a torch.Tensor (B, T), got {type(ids).__name__}")
    if ids.dtype not in _INTEGER_DTYPES:
        raise InputShapeError(f"token ids must have an integer dtype, got dtype={ids.dtype}")
    if ids.dim() != 2:
        raise InputShapeError(
            f"token ids must have rank 2 (B, T), got rank {ids.dim()} with shape {tuple(ids.shape)}"
        )
    batch, seq_len = ids.shape
    if batch < 1:
        raise InputShapeError(f"batch size B={batch} must be at least 1")
    if seq_len < 1:
        raise ContextLengthError(f"sequence length T={seq_len} must be at least 1")
    if seq_len > cfg.max_seq_len:
        raise ContextLengthError(
            f"sequence length T={seq_len} exceeds max_seq_len={cfg.max_seq_len}; "
            "the input is rejected, never cropped"
        )
    if ids.device.type == "meta":  # meta tensors carry shapes only (used for FLOP counting)
        return
    lowest, highest = torch.aminmax(ids)
    if lowest < 0 or highest >= cfg.vocab_size:
        bad = ((ids < 0) | (ids >= cfg.vocab_size)).nonzero()[0].tolist()
        raise TokenIdError(
            f"token id {ids[bad[0], bad[1]].item()} at batch {bad[0]}, position {bad[1]} "
            f"is outside [0, vocab_size={cfg.vocab_size})"
        )


def packed_documents(document_ids: torch.Tensor, ids: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions (B, T), allowed (B, 1, T, T)) of rows holding several documents, a run of
    equal `document_ids` each: positions count from 0 at each document's first token, and
    token t may read token s <= t of its own document only. E.g. ids [7, 7, 3, 3, 3] ->
    positions [0, 1, 0, 1, 2]; token 2 reads token 2 alone. Raises InputShapeError for ids
    that are not an integer (B, T) tensor matching the token ids."""
    if not isinstance(document_ids, torch.Tensor) or tuple(document_ids.shape) != tuple(ids.shape) \
            or document_ids.is_floating_point() or document_ids.dtype == torch.bool:
        got = (f"{tuple(document_ids.shape)} {document_ids.dtype}"
               if isinstance(document_ids, torch.Tensor) else type(document_ids).__name__)
        raise InputShapeError(f"document_ids must be integer (B, T) = {tuple(ids.shape)} like the "
                              f"ids, got {got}")
    seq_len = ids.shape[1]
    starts = torch.ones_like(document_ids, dtype=torch.bool)  # (B, T): a document begins here
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    index = torch.arange(seq_len, device=ids.device).expand_as(document_ids)  # (B, T)
    first = torch.where(starts, index, 0).cummax(1).values  # (B, T): its document's first slot
    segment = starts.long().cumsum(1)  # (B, T): which document of the row
    same = segment[:, :, None] == segment[:, None, :]  # (B, T, T)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=ids.device).tril()
    return index - first, (same & causal)[:, None]  # (B, T), (B, 1, T, T)


def _record(trace: Trace | None, name: str, value: torch.Tensor) -> None:
    if trace is not None:
        trace.record(name, value)


class Block(nn.Module):
    """One pre-norm block: two residual updates, each reading a normalised copy of the stream
    (in a parallel block both read the block's input: x + Attn(N1(x)) + MLP(N2(x))); or a
    post-norm block, each update normalised after the add: N1(x + Attn(x)), N2(. + MLP(.))."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, layer: int = 0,
                 **factory) -> None:
        super().__init__()
        self.parallel, self.shared_norm = cfg.parallel_residual, cfg.shared_norm
        self.post_norm = cfg.post_norm  # ln1 and ln2 after the adds, not before the sublayers
        self.residual_multiplier = cfg.residual_multiplier  # Granite's m: x + m * sublayer
        # no pre-norms (OLMo 2): the sublayers read the stream itself
        norms = cfg.pre_norm or cfg.post_norm
        self.ln1 = make_norm(cfg, **factory) if norms else None
        attention = LatentAttention if cfg.latent_attention else CausalSelfAttention
        self.attn = attention(cfg, residual_std=residual_std, layer=layer, **factory)
        # a parallel block with one norm (GPT-J, Phi): the MLP reads ln1's output too
        self.ln2 = make_norm(cfg, **factory) if norms and not cfg.shared_norm else None
        # routed experts where the config routes this layer, else one dense MLP of width F
        mlp = RoutedExperts if cfg.routes(layer) else FeedForward
        self.ffn = mlp(cfg, residual_std=residual_std, **factory)
        # sandwich norms: each sublayer's output normalised before it joins the stream
        self.ln1_post = make_norm(cfg, **factory) if cfg.sandwich_norm else None
        self.ln2_post = make_norm(cfg, **factory) if cfg.sandwich_norm else None

    def forward(self, resid_pre: torch.Tensor, rope, trace: Trace | None = None,
                prefix: str = "", *, allowed: torch.Tensor | None = None,
                cache: KVCache | None = None, layer: int = 0,
                bias: torch.Tensor | None = None,
                query_scale: torch.Tensor | None = None) -> torch.Tensor:
        """`bias`: ALiBi's score bias (1|B, H, T, S), or None; `query_scale`: each query's
        multiplier by its position (query_position_scale), or None."""
        pre = not self.post_norm  # a post-norm block's sublayers read the stream itself
        normed = self.ln1(resid_pre) if self.ln1 is not None and pre else resid_pre
        _record(trace, f"{prefix}.ln1", normed)
        # ALiBi's bias and Ministral 3's query scale only where there is one (an attention
        # written without them still runs)
        extra = {name: value for name, value in (("bias", bias), ("query_scale", query_scale))
                 if value is not None}
        if allowed is None and cache is None:  # the full causal square
            attn_out = self.attn(normed, rope, trace, f"{prefix}.attn", **extra)
        else:  # padded or cached: the generation path (same weights)
            attn_out = self.attn.attend(normed, rope, allowed, cache, layer, **extra)
        if self.ln1_post is not None:
            attn_out = self.ln1_post(attn_out)
        if self.residual_multiplier != 1.0:
            attn_out = attn_out * self.residual_multiplier
        _record(trace, f"{prefix}.attn.out", attn_out)
        resid_mid = resid_pre + attn_out
        if not pre:  # post-LN: the sum normalised
            resid_mid = self.ln1(resid_mid)
        _record(trace, f"{prefix}.resid_mid", resid_mid)
        if not self.shared_norm:  # a parallel block's MLP reads the block's input
            normed = resid_pre if self.parallel else resid_mid
            normed = self.ln2(normed) if self.ln2 is not None and pre else normed
        _record(trace, f"{prefix}.ln2", normed)
        ffn_out = self.ffn(normed, trace, f"{prefix}.ffn")
        if self.ln2_post is not None:
            ffn_out = self.ln2_post(ffn_out)
        if self.residual_multiplier != 1.0:
            ffn_out = ffn_out * self.residual_multiplier
        _record(trace, f"{prefix}.ffn.out", ffn_out)
        resid_post = resid_mid + ffn_out
        if not pre:
            resid_post = self.ln2(resid_post)
        _record(trace, f"{prefix}.resid_post", resid_post)
        return resid_post


class Decoder(nn.Module):
    """The assembled decoder: ids (B, T) -> raw logits (B, T, V). Never applies softmax."""

    def __init__(self, config: DecoderConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"Decoder needs a DecoderConfig, got {type(config).__name__}")
        self.config = cfg = config
        factory = {"device": device, "dtype": dtype}
        # (V, D)
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, init_std=INIT_STD,
                                          **factory)
        self.position_embeddings = (  # (position_offset + max_seq_len, D)
            Embedding(cfg.position_offset + cfg.max_seq_len, cfg.d_model, init_std=INIT_STD,
                      **factory)
            if cfg.pos == "learned" else None)
        # the table's row of position 0 (OPT's learned table and XGLM's sinusoidal one: 2)
        self.position_offset = cfg.position_offset
        # BLOOM: the embedding stream normalised before layer 0
        self.embedding_norm = make_norm(cfg, **factory) if cfg.embedding_norm else None
        residual_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        self.layers = nn.ModuleList(Block(cfg, residual_std=residual_std, layer=i, **factory)
                                    for i in range(cfg.n_layers))
        # GPT-1's post-norm blocks end normalised: no final norm
        self.ln_final = make_norm(cfg, **factory) if cfg.final_norm else None
        # Tying: the readout *is* the embedding Parameter, so both paths add into one .grad
        # (and the embedding, its owner, initialises it).
        shared = self.token_embeddings.weight if cfg.tie_embeddings else None
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, cfg.readout_bias, weight=shared,
                              init_std=None if shared is not None else INIT_STD, **factory)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation (see the module docstring): each module draws its own weights
        with the std it was built with. A no-op on the meta device (shapes only: drawing there
        runs torch's Python reference of normal_, 20 s for DeepSeek-V3's 45 000 matrices)."""
        if self.token_embeddings.weight.device.type == "meta":
            return
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def _apply(self, fn, recurse: bool = True):
        # Module.to_empty() and some dtype/device moves give every parameter slot a fresh
        # Parameter, which would silently untie the readout (DEFECTS.md A1). Tie it again.
        super()._apply(fn, recurse)
        if self.config.tie_embeddings and self.lm_head.weight is not self.token_embeddings.weight:
            self.lm_head.weight = self.token_embeddings.weight
        return self

    cache_class = KVCache

    def new_cache(self, batch: int, capacity: int | None = None) -> KVCache:
        """An empty static KV cache for `batch` rows and `capacity` slots (default max_seq_len),
        in the weights' dtype and on their device."""
        like = self.token_embeddings.weight
        return self.cache_class(self.config, batch, self.config.max_seq_len
                                if capacity is None else capacity,
                                device=like.device, dtype=like.dtype)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                cache: KVCache | None = None, last_only: bool = False,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, T) integer -> logits (B, T, V), or (B, 1, V) for the last position only.

        `attention_mask` (B, T): 1 for real tokens, 0 for pads (a left-padded batch of
        prompts); each row's positions count its real tokens only, so a padded row gives the
        logits of its unpadded run on its real tokens. `cache` (from `new_cache`): the ids
        continue the tokens the cache holds (a prefill, then one token or a chunk at a time),
        at their absolute positions; a row past max_seq_len is rejected, never cropped.
        `document_ids` (B, T): several documents packed into one row (a run of equal ids is one
        document); positions restart at each document and a token reads only the tokens of its
        own document before it, so each document gets the logits it has alone."""
        check_ids(ids, self.config)
        self._check_device(ids)
        if document_ids is not None:
            if attention_mask is not None or cache is not None:
                raise InputShapeError("document_ids pack documents into the full causal square; "
                                      "they take no attention_mask and no cache")
            positions, allowed = packed_documents(document_ids, ids)
            return self._run(ids, None, positions=positions, allowed=allowed,
                             last_only=last_only)
        if attention_mask is None and cache is None:  # the plain path: no extra work
            return self._run(ids, None, last_only=last_only)
        mask = None if attention_mask is None else check_mask(attention_mask, ids)
        if cache is not None and cache.batch != ids.shape[0]:
            raise InputShapeError(f"the ids have batch size B={ids.shape[0]} but the cache was "
                                  f"built for B={cache.batch}")
        positions, allowed = self._positions(ids, mask, cache)
        return self._run(ids, None, positions=positions, allowed=allowed, cache=cache,
                         last_only=last_only, key_positions=None if cache is None
                         else cache.slot_positions())

    def _check_device(self, ids: torch.Tensor) -> None:
        """Ids on the meta device hold no values: fed to weights that do, the lookup would read
        garbage; only a model on meta (accounting's FLOP count) takes them."""
        weights = self.token_embeddings.weight.device
        if ids.device.type == "meta" and weights.type != "meta":
            raise InputShapeError(f"token ids are on the meta device (shapes only, no values) but "
                                  f"the model's weights are on {weights}: move the ids there")

    def _positions(self, ids: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Positions of the new tokens (B|1, T) and the keys they may read (cache.py): after
        the tokens the cache holds, counting real tokens only (the mask's cumulative sum)."""
        if cache is not None:
            positions = cache.append(ids.shape[1], mask)  # raises past max_seq_len
            return positions, cache.allowed()
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T); pads before a row: 0
        return positions, attention_allowed(0, ids.shape[1], mask, ids.device)

    def _rotations(self, positions: torch.Tensor | None, seq_len: int,
                   like: torch.Tensor, windowed: bool = False) -> torch.Tensor:
        """The RoPE table: (T, R/2) for positions 0..T-1, or (B|1, 1, T, R/2) for given
        positions (B|1, T), broadcast over heads; `windowed`: the windowed layers' table."""
        if positions is None:
            return rope_rotations(self.config, seq_len, like.device, like.dtype,
                                  windowed=windowed)
        return rope_rotations(self.config, seq_len, like.device, like.dtype, positions,
                              windowed=windowed)[:, None]

    def _position_rows(self, positions: torch.Tensor | None, seq_len: int,
                       like: torch.Tensor) -> torch.Tensor:
        """The learned table's rows, or the sinusoidal table's, of positions 0..T-1 (T, D) or
        of the given positions (B|1, T) -> (B|1, T, D); position t's row is position_offset + t
        (OPT's and XGLM's tables keep 2 before it), every position < max_seq_len."""
        if positions is None:
            positions = torch.arange(seq_len, device=like.device)  # (T,)
        rows = positions + self.position_offset
        if self.position_embeddings is not None:
            return self.position_embeddings.weight[rows]  # (offset + max_seq_len, D) table
        return sinusoids(self.config, rows, like.dtype)

    def _alibi(self, positions: torch.Tensor | None, key_positions: torch.Tensor | None,
               seq_len: int, like: torch.Tensor) -> torch.Tensor:
        """ALiBi's score bias (B|1, H, T, S) for queries at `positions` (None: 0..T-1) and keys
        at `key_positions` (None: the queries' own)."""
        if positions is None:
            positions = torch.arange(seq_len, device=like.device)[None]  # (1, T)
        keys = positions if key_positions is None else key_positions
        return alibi_bias(self.config, positions, keys, like.dtype)

    def run_with_trace(self, ids: torch.Tensor) -> tuple[torch.Tensor, Trace]:
        """Like forward, through the eager attention path, recording every named site."""
        check_ids(ids, self.config)
        trace = Trace(self.config, *ids.shape)
        return self._run(ids, trace), trace

    def _run(self, ids: torch.Tensor, trace: Trace | None, *,
             positions: torch.Tensor | None = None, allowed: torch.Tensor | None = None,
             cache: KVCache | None = None, last_only: bool = False,
             key_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass proper, on ids that passed `check_ids`. `positions` None: 0..T-1
        over the full causal square; else the generation path (see `forward`), where the keys
        sit at `key_positions` (B|1, S) (None: at the queries' own positions)."""
        cfg = self.config
        ids = ids.long()
        seq_len = ids.shape[1]
        x = self.token_embeddings(ids)  # (B, T, D)
        if cfg.embedding_scale is not None:  # rounded to the model's dtype, as Gemma does
            x = x * torch.tensor(cfg.embedding_scale, dtype=x.dtype, device=x.device)
        _record(trace, "tokens", x)
        if cfg.pos in ("learned", "sinusoidal"):
            rows = self._position_rows(positions, seq_len, x)  # (T, D) or (B|1, T, D)
            _record(trace, "positions", rows)
            x = x + rows
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        _record(trace, "embed", x)
        rope = self._rotations(positions, seq_len, x) if cfg.pos == "rope" else None
        bias = self._alibi(positions, key_positions, seq_len, x) if cfg.pos == "alibi" else None
        # Gemma 3's windowed layers turn by their own base
        rope_windowed = (self._rotations(positions, seq_len, x, windowed=True)
                         if cfg.window_rope_theta is not None else rope)
        # Ministral 3: each query's multiplier by its position, for the layers that scale
        scales = (None if cfg.query_position_scale is None else
                  query_scales(cfg, seq_len, x.device, x.dtype, positions))
        recompute = (self.gradient_checkpointing and self.training and torch.is_grad_enabled()
                     and trace is None and cache is None)
        windowed = None  # what a windowed layer's queries may read on the generation path
        if positions is not None and cfg.sliding_window is not None:
            windowed = windowed_allowed(allowed, positions, positions if key_positions is None
                                        else key_positions, cfg.sliding_window)
        for i, block in enumerate(self.layers):
            reads = windowed if block.attn.window is not None and windowed is not None else allowed
            turns = rope_windowed if block.attn.window is not None else rope
            if recompute:  # keep only each block's input; its activations are recomputed in backward
                x = checkpoint(block, x, turns, None, f"layers.{i}", allowed=reads, layer=i,
                               bias=bias, query_scale=scales, use_reentrant=False)
            else:
                x = block(x, turns, trace, f"layers.{i}", allowed=reads, cache=cache, layer=i,
                          bias=bias, query_scale=scales)
        if last_only:
            x = x[:, -1:]  # (B, 1, D): generation reads the next-token row only
        if self.ln_final is not None:
            x = self.ln_final(x)
        _record(trace, "ln_final", x)  # the readout's input
        logits = self.lm_head(x)  # (B, T, V): h @ E^T when tied
        if cfg.logit_scale != 1.0:
            logits = logits * cfg.logit_scale
        if cfg.logit_softcap is not None:
            logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
        _record(trace, "logits", logits)
        return logits

    # Activation (gradient) checkpointing, with Hugging Face's method names: in train mode, with
    # gradients on, each block keeps only its input and recomputes its activations in backward
    # (non-reentrant, so frozen input embeddings still let every block's weights get gradients).
    gradient_checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.gradient_checkpointing = False

    def num_parameters(self) -> int:
        """Unique learned scalars (a tied weight counts once)."""
        return sum(p.numel() for p in self.parameters())
