"""`packing`: several documents packed into one row each get the logits they have alone, in every
form a trainer sends packed rows in and the model takes (`ModelFacts.packing_forms`):

  document_ids   our Decoder's: forward(ids, document_ids=) (a run of equal ids is a document);
  4d_mask        position_ids restarting at each document and a 4-D additive block-diagonal mask
                 (0 where a token may attend, the dtype's lowest value elsewhere: transformers'
                 eager attention adds a 4-D mask to its scores), use_cache=False: how
                 decoder-audit's train packs a Hugging Face model;
  position_ids   restarting position_ids and nothing else: what `DataCollatorWithFlattening`
                 sends (padding-free training). transformers reads the documents from the
                 restarts only where no attention mask and no cache is in play (masking_utils),
                 so this form is tried with the model's own default use_cache and with
                 use_cache=False: a leak under the default is what a trainer that does not turn
                 the cache off trains;
  flash_kwargs   restarting position_ids with flash attention's cu_seq_lens_q/k and
                 max_length_q/k (`DataCollatorWithFlattening(return_flash_attn_kwargs=True)`),
                 where the model takes them (its forward names them, or a Hugging Face model runs
                 a flash attention implementation), under both cache settings.
A module of its own that takes position_ids (and no document_ids) is checked in that form.

In each form and setting: every document equals itself alone, changing one document leaves the
others unchanged, and the loss at a document's last token has exactly zero gradient at every
earlier document's inputs. A leak in any of them fails the check, naming the form and the
setting. A training path may name the one form its trainer sends (`TrainingPath.pack_form`);
then only that form is checked.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...generation.convention import Convention, call
from ...objective import logits_of
from ..measure import value_scale
from ..result import CheckResult
from ..subject import Subject

# Positions of the packing probe (capped by max_seq_len): three documents of unequal lengths.
PACK_LEN = 16

FORMS = ("document_ids", "4d_mask", "position_ids", "flash_kwargs")
"""Every form of a packed row (the module docstring says what each sends)."""


def _document_lengths(seq_len: int) -> list[list[int]]:
    """Per row, the lengths of its documents (they fill the row): two rows, three documents
    each, in another order in the second row so no boundary is at the same place twice."""
    first, second = max(1, seq_len // 4), max(1, seq_len // 2)
    third = seq_len - first - second
    return [[first, second, third], [third, first, second]]


def packed_call(model: nn.Module, form: str, document_ids: torch.Tensor, *,
                dtype: torch.dtype = torch.float32, use_cache: bool | None = False,
                convention: Convention | None = None) -> Callable[[torch.Tensor], object]:
    """A call of the ids (B, T) through `model` packed as `form` (FORMS), with `document_ids`
    (B, T). `use_cache` is passed as given (None: not passed, the model's own default), except
    to document_ids, which takes no cache. The ids go in as input_ids=, or as `convention`
    passes them. The trainer packs through it too."""
    from ...model.decoder import packed_documents

    if form == "document_ids":
        return lambda ids: model(ids, document_ids=document_ids.to(ids.device))
    positions, allowed = packed_documents(document_ids, document_ids)  # (B, T), (B, 1, T, T)
    extra: dict[str, object] = {"position_ids": positions}
    if form == "4d_mask":
        extra["attention_mask"] = torch.zeros(allowed.shape, dtype=dtype).masked_fill(
            ~allowed, torch.finfo(dtype).min)  # (B, 1, T, T)
    elif form == "flash_kwargs":
        # the documents of every row, one after another, as the varlen kernels read a batch
        starts = positions.flatten() == 0  # (B*T,)
        bounds = torch.cat([starts.nonzero().flatten(), torch.tensor([positions.numel()])])
        cu = bounds.to(torch.int32)
        longest = int((bounds[1:] - bounds[:-1]).max())
        extra.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest,
                     max_length_k=longest)
    if use_cache is not None:
        extra["use_cache"] = use_cache

    def packed(ids: torch.Tensor):
        moved = {k: v.to(ids.device) if isinstance(v, torch.Tensor) else v
                 for k, v in extra.items()}
        if convention is None:
            return model(input_ids=ids, **moved)
        return call(model, convention, ids, **moved)
    return packed


def _variants(s: Subject) -> list[tuple[str, str, bool | None]]:
    """(label, form, use_cache) of every form and setting the check tries."""
    out = []
    for form in s.facts.checked_packing_forms:
        if form == "document_ids":
            out.append((form, form, None))
        elif form == "4d_mask":
            out.append((form, form, False if s.facts.takes_use_cache else None))
        elif s.facts.takes_use_cache and not _cache_off_by_default(s.work):
            out += [(f"{form} (use_cache as the model defaults)", form, None),
                    (f"{form}, use_cache=False", form, False)]
        elif s.facts.takes_use_cache:  # its default is off: the two settings are one
            out.append((f"{form}, use_cache=False (the model's default)", form, False))
        else:
            out.append((form, form, None))
    return out


def _cache_off_by_default(model: nn.Module) -> bool:
    """The model's config turns its cache off (Hugging Face's use_cache=False, which the
    Trainer sets from TrainingArguments.use_cache): a call without use_cache is one with
    use_cache=False."""
    return getattr(getattr(model, "config", None), "use_cache", None) is False


def check_packing(s: Subject) -> CheckResult:
    seq_len = s.short_len(PACK_LEN)
    if seq_len < 3:
        return CheckResult("packing", True, f"T={seq_len}: no room for three documents", {})
    rows = _document_lengths(seq_len)
    ids = s.random_ids(len(rows), seq_len, s.generator(43)).to(s.device)  # (2, T)
    document_ids = torch.tensor([[d for d, n in enumerate(lengths) for _ in range(n)]
                                 for lengths in rows], device=s.device)  # (2, T)
    tol = s.shape_tolerance()
    alone = [[s.logits(ids[b:b + 1, start:start + length])[0]  # (length, V)
              for start, length in _spans(lengths)] for b, lengths in enumerate(rows)]
    found: dict[str, dict] = {}
    for label, form, use_cache in _variants(s):
        packed = packed_call(s.work, form, document_ids, dtype=s.dtype, use_cache=use_cache,
                             convention=s.convention)
        found[label] = _one_form(s, ids, rows, alone, packed, tol)
        found[label]["training_batch"] = _at_training_batch(s, form, use_cache, ids,
                                                            document_ids, rows, alone, tol)
    evidence = {"seq_len": seq_len, "documents": rows, "forms": found}
    for label, result in found.items():
        problem = _problem(result) or _training_batch_problem(result)
        if problem:
            return CheckResult("packing", False, f"packed as {label}: {problem}", evidence, tol)
    crossed = all(r["gradient"] is not None for r in found.values())
    return CheckResult("packing", True, f"{sum(len(r) for r in rows)} packed documents equal each "
                       f"document alone, and changing one leaves the others unchanged"
                       + ("; no gradient crosses a document" if crossed else "")
                       + f", packed as {'; as '.join(found)}", evidence, tol)


def _spans(lengths: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each document of a row."""
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return list(zip(starts, lengths))


def _one_form(s: Subject, ids, rows, alone, packed, tol: float) -> dict:
    """The documents through one packed call against each alone; one document changed; the
    gradient at earlier documents. A call the model raises on is recorded, not raised."""
    try:
        with torch.no_grad():
            s.count(ids)
            out = logits_of(packed(ids))  # (2, T, V)
    except Exception as exc:  # noqa: BLE001 - the model's refusal of this form is evidence
        return {"raised": f"{type(exc).__name__}: {exc}"[:300], "gradient": None}
    records = []
    for b, lengths in enumerate(rows):
        for d, (start, length) in enumerate(_spans(lengths)):
            worst = float((out[b, start:start + length] - alone[b][d]).abs().max())
            records.append({"row": b, "document": d, "start": start, "length": length,
                            "max_abs_diff": worst, "allowed": tol * value_scale(alone[b][d])})
    return {"alone": records, "other_document_changed": _other_document(s, ids, rows, packed,
                                                                        out, tol),
            "gradient": _packed_gradient(s, ids, rows, packed)}


def _problem(result: dict) -> str:
    """What a form's result shows wrong, "" when nothing."""
    if "raised" in result:
        return f"the model raised {result['raised']}"
    bad = [r for r in result["alone"] if not r["max_abs_diff"] <= r["allowed"]]
    if bad:
        r = bad[0]
        return (f"row {r['row']}: document {r['document']} (tokens {r['start']}.."
                f"{r['start'] + r['length'] - 1}) differs from itself alone by up to "
                f"{r['max_abs_diff']:.3g} (allowed {r['allowed']:.1e}): packed documents read "
                "across their boundary or are not causal inside")
    other = result["other_document_changed"]
    if not other["max_abs_diff"] <= other["allowed"]:
        return (f"changing one packed document moves the others by up to "
                f"{other['max_abs_diff']:.3g} (allowed {other['allowed']:.1e})")
    grad = result["gradient"]
    if grad is not None and grad["max_grad_on_earlier_documents"] != 0.0:
        return (f"the loss of a packed document has a gradient of "
                f"{grad['max_grad_on_earlier_documents']:.3g} at earlier documents' inputs "
                "(must be exactly 0): the backward crosses documents")
    return ""


def _other_document(s: Subject, ids, rows, packed, out, tol) -> dict:
    """Document 1 of row 0 changed: documents 0 and 2 must keep their logits."""
    first, second, _ = rows[0]
    changed = ids.clone()
    changed[0, first:first + second] = s.other_ids(ids[:1, first:first + second].cpu(),
                                                   s.generator(44))[0].to(ids.device)
    with torch.no_grad():
        s.count(changed)
        moved = (logits_of(packed(changed))[0] - out[0]).abs().amax(-1)  # (T,)
    kept = torch.cat([moved[:first], moved[first + second:]])
    return {"max_abs_diff": float(kept.max()), "allowed": tol * value_scale(out[0])}


def _packed_gradient(s: Subject, ids, rows, packed) -> dict | None:
    """The loss at the last token of row 0's last document: its gradient at the input
    embedding of every earlier document's tokens must be exactly 0."""
    if not (s.facts.has_input_embedding and s.facts.has_input_gradient):
        return None
    first, second, third = rows[0]
    last = first + second + third - 1
    targets = torch.zeros(2, dtype=torch.long, device=s.device)
    from .generation import _input_gradient

    grad = _input_gradient(s, ids, [last, last], targets, run=packed)  # (2, T, D)
    return {"position": last, "max_grad_on_earlier_documents":
            float(grad[0, :first + second].abs().max()),
            "grad_at_own_document": float(grad[0, first + second:].abs().max())}


def _at_training_batch(s: Subject, form: str, use_cache: bool | None, ids: torch.Tensor,
                       document_ids: torch.Tensor, rows: list[list[int]], alone: list,
                       tol: float) -> dict | None:
    """The probe's two packed rows repeated to the training batch size (B, T) and packed as
    `form`: every row's documents must still equal each document alone, so a model that packs
    only small batches (document_ids dropped at B >= 16) fails. None when training uses no more
    rows than the probe, or the form raised at two rows already (that is its verdict)."""
    training = s.facts.training
    if training is None or training.batch_size <= len(ids):
        return None
    batch, repeat = training.batch_size, -(-training.batch_size // len(ids))
    many_ids = ids.repeat(repeat, 1)[:batch]  # (B, T)
    packed = packed_call(s.work, form, document_ids.repeat(repeat, 1)[:batch], dtype=s.dtype,
                         use_cache=use_cache, convention=s.convention)
    try:
        with torch.no_grad():
            s.count(many_ids)
            out = logits_of(packed(many_ids))  # (B, T, V)
    except Exception as exc:  # noqa: BLE001 - the model's refusal at this batch size is evidence
        return {"batch": batch, "raised": f"{type(exc).__name__}: {exc}"[:300]}
    worst, allowed, differing = 0.0, 0.0, []
    for b in range(batch):
        lengths = rows[b % len(rows)]
        for d, (start, length) in enumerate(_spans(lengths)):
            expected = alone[b % len(rows)][d]
            moved = float((out[b, start:start + length] - expected).abs().max())
            limit = tol * value_scale(expected)
            worst, allowed = max(worst, moved), max(allowed, limit)
            if not moved <= limit and b not in differing:
                differing.append(b)
    return {"batch": batch, "max_abs_diff": worst, "allowed": allowed,
            "rows_differing": differing}


def _training_batch_problem(result: dict) -> str:
    """What packing at the training batch size shows wrong, "" when nothing."""
    found = result.get("training_batch")
    if not found:
        return ""
    if "raised" in found:
        return f"at the training batch size B={found['batch']} the model raised {found['raised']}"
    if not found["rows_differing"]:
        return ""
    return (f"at the training batch size B={found['batch']}, packed rows "
            f"{found['rows_differing'][:8]} differ from their documents alone by up to "
            f"{found['max_abs_diff']:.3g} (allowed {found['allowed']:.1e}), though two packed "
            "rows did not: the packing holds only for small batches")
