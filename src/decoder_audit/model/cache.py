"""`KVCache`: the Decoder's static key/value cache for incremental decoding, and the masks of
the generation path (`check_mask`, `attention_allowed`).

    cache = model.new_cache(batch)          # preallocated once: L x (B, Hkv, S, Dh)
    logits = model(prompt, attention_mask, cache=cache)  # prefill (B, T0): slots 0..T0-1
    logits = model(next_ids, cache=cache)   # (B, 1) or a chunk (B, Tc): the next slots

Every row of a batch fills the same slots (a left-padded prompt keeps its pads in the cache), so
one integer `length` says which slots are full. Nothing is re-allocated per step: keys and values
are written into the preallocated buffers and attention reads a view of the filled slots.

Slots and positions are different things. A slot is where a token sits in the cache; its
position is how many real tokens its row had before it (the cumulative sum of the attention mask
minus one, as Hugging Face `generate` computes position_ids), so a row left-padded by k tokens
sees exactly the positions it would see alone. The cache remembers which slots hold real tokens
(`valid`) and how many real tokens each row holds (`seen`); both stay None while every slot is
real, which keeps the unpadded path free of per-row bookkeeping. Positions are bounded by
max_seq_len (a longer row is rejected with ContextLengthError, never cropped or wrapped); slots
by the capacity the cache was built with (default max_seq_len; `generate` asks for more when pads
take slots).

The cache holds Hkv heads (not H): query head h reads KV head h // (H / Hkv) when attention
expands them, exactly as in the full forward.
"""

from __future__ import annotations

import torch

from ..config import DecoderConfig
from ..errors import ContextLengthError, InputShapeError


class KVCache:
    """Keys and values of every layer for `batch` rows and `capacity` slots, and which slots
    hold real tokens. Used by `Decoder.forward(..., cache=)`; a cache whose forward raised is
    not to be reused."""

    def __init__(self, cfg: DecoderConfig, batch: int, capacity: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None
                 ) -> None:
        if not isinstance(batch, int) or batch < 1:
            raise InputShapeError(f"cache batch size B={batch!r} must be a positive integer")
        if not isinstance(capacity, int) or capacity < 1:
            raise ContextLengthError(f"cache capacity={capacity!r} must be a positive integer")
        self.max_seq_len = cfg.max_seq_len
        self.batch, self.capacity = batch, capacity
        shape = (cfg.n_layers, batch, cfg.kv_heads, capacity, cfg.head_dim)  # (L, B, Hkv, S, Dh)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        # (L, B, Hkv, S, Dv): values as wide as keys but in latent attention
        self.values = torch.zeros(shape[:-1] + (cfg.value_dim,), device=device, dtype=dtype)
        # per-layer views (B, Hkv, S, Dh), made once: a step indexes no 5-d tensor
        self._layers = [(self.keys[i], self.values[i]) for i in range(cfg.n_layers)]
        self.length = 0  # slots filled, the same for every row
        self.start = 0  # first slot of the tokens the current forward adds
        self.valid: torch.Tensor | None = None  # (B, S) bool: slot holds a real token
        self.seen: torch.Tensor | None = None  # (B,) long: real tokens per row so far
        self.longest = 0  # real tokens of the longest row (a host int: no sync per step)

    def append(self, new: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Reserve the next `new` slots for tokens whose real/pad flags are `mask` (B, new)
        (None: all real) and return their positions, (1, new) or (B, new) when rows differ.
        Raises ContextLengthError, before touching the cache, if a row would hold more than
        max_seq_len real tokens or the slots would exceed the capacity."""
        start, end = self.length, self.length + new
        if mask is None and self.valid is None:  # every slot real: positions are the slots
            positions = torch.arange(start, end, device=self.keys.device)[None]  # (1, new)
            seen, real, longest = None, None, end
        else:
            seen = self.seen if self.seen is not None else torch.full(
                (self.batch,), start, dtype=torch.long, device=self.keys.device)  # (B,)
            real = (torch.ones(self.batch, new, dtype=torch.bool, device=self.keys.device)
                    if mask is None else mask)  # (B, new)
            counts = real.long().cumsum(1)  # (B, new): real tokens up to and including each
            positions = (seen[:, None] + counts - 1).clamp(min=0)  # (B, new)
            seen = seen + counts[:, -1]
            # a mask costs one sync for the exact longest row; an all-real step adds `new`
            longest = int(seen.max()) if mask is not None else self.longest + new
        if longest > self.max_seq_len:
            raise ContextLengthError(
                f"a row would hold {longest} tokens (the cache holds {start} slots, {new} more "
                f"given), exceeding max_seq_len={self.max_seq_len}; the input is rejected, "
                "never cropped or wrapped")
        if end > self.capacity:
            raise ContextLengthError(
                f"the cache holds {start} tokens and {new} more would need {end} slots; its "
                f"capacity is {self.capacity} (max_seq_len={self.max_seq_len}); nothing is "
                "cropped or wrapped")
        if real is not None:
            if self.valid is None:  # the first pads: every earlier slot was real
                self.valid = torch.ones(self.batch, self.capacity, dtype=torch.bool,
                                        device=self.keys.device)  # (B, S)
            self.valid[:, start:end] = real
            self.seen = seen
        self.start, self.length, self.longest = start, end, longest
        return positions

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's k, v (B, Hkv, new, Dh) into their slots of `layer` and return
        views of every filled slot, (B, Hkv, length, Dh) each."""
        keys, values = self._layers[layer]
        keys[:, :, self.start:self.length] = k
        values[:, :, self.start:self.length] = v
        return keys[:, :, :self.length], values[:, :, :self.length]

    def slot_positions(self) -> torch.Tensor:
        """The position of every filled slot, (1, length), or (B, length) once pads are held
        (a pad slot gets its row's previous position; no query reads it)."""
        if self.valid is None:
            return torch.arange(self.length, device=self.keys.device)[None]
        return (self.valid[:, :self.length].long().cumsum(1) - 1).clamp(min=0)

    def allowed(self) -> torch.Tensor | None:
        """Which filled slots each new token may read, (B|1, 1, new, length) bool, True = may
        attend (SDPA's convention); None when SDPA needs no mask (see `attention_allowed`)."""
        return attention_allowed(self.start, self.length - self.start, self.valid,
                                 self.keys.device)


def check_mask(mask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """An attention mask (B, T) for ids (B, T): bool or integer, 1 (True) for real tokens, 0
    for pads. Returns it as bool; raises InputShapeError naming what is wrong."""
    if not isinstance(mask, torch.Tensor):
        raise InputShapeError(f"attention_mask must be a torch.Tensor (B, T), got "
                              f"{type(mask).__name__}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputShapeError(f"attention_mask has shape {tuple(mask.shape)}; it must match the "
                              f"ids (B, T) = {tuple(ids.shape)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.is_complex():
            raise InputShapeError(f"attention_mask must be bool or integer 0/1, got "
                                  f"dtype={mask.dtype}")
        if bool(((mask != 0) & (mask != 1)).any()):
            raise InputShapeError("attention_mask values must be 0 (pad) or 1 (real token)")
        mask = mask != 0
    return mask


def attention_allowed(start: int, new: int, valid: torch.Tensor | None,
                      device: torch.device) -> torch.Tensor | None:
    """The mask of `new` queries in slots start..start+new-1 over keys in slots 0..start+new-1:
    causal and bottom-right aligned (query i sits in slot start + i and reads slots <= its own;
    SDPA's is_causal aligns top-left, which is wrong whenever there are fewer queries than keys,
    DEFECTS.md B11), and, where `valid` (B, S) marks pads, never a pad key. A query always reads
    its own slot, so a pad query's row is never empty (no NaN); its output is never used.

    None when no mask is needed: a square prompt without pads (SDPA is_causal) or a single new
    token without pads (it reads every filled slot)."""
    end = start + new
    if valid is None and (start == 0 or new == 1):
        return None
    causal = bottom_right_causal(new, end, device)  # (new, S)
    if valid is None:
        return causal[None, None]  # (1, 1, new, S)
    keys = torch.arange(end, device=device)  # (S,) slots
    queries = torch.arange(start, end, device=device)[:, None]  # (new, 1) slots
    readable = valid[:, None, :end] | (keys == queries)  # (B, new, S)
    return (causal & readable)[:, None]  # (B, 1, new, S)


def bottom_right_causal(new: int, total: int, device: torch.device) -> torch.Tensor:
    """(new, total) True where query i, sitting in slot total - new + i, may read a key: the
    keys in its slot and before (SDPA's is_causal aligns top-left instead, B11)."""
    return (torch.arange(total, device=device)
            <= torch.arange(total - new, total, device=device)[:, None])


def windowed_allowed(allowed: torch.Tensor | None, positions: torch.Tensor,
                     key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """`allowed` (B|1, 1, T, S) narrowed to a sliding window: a query at position p reads a key
    at position p' only when p - p' < window. Positions, not slots (a row's pads hold slots but
    no positions), so a padded row reads the keys it reads alone. `allowed` None is the
    bottom-right causal mask of T queries over S keys."""
    new, total = positions.shape[-1], key_positions.shape[-1]
    if allowed is None:
        allowed = bottom_right_causal(new, total, positions.device)
    near = positions[:, :, None] - key_positions[:, None, :] < window  # (B|1, T, S)
    return allowed & near[:, None]
