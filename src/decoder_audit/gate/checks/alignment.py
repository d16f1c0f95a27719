"""`loss_alignment`: the next-token shift and flattening of `decoder_audit.objective` pair every
logit row (b, t) with target id t + 1 of sequence b, on the model's real logits, against an
explicit per-(b, t) loop; the shift's direction is proven with peaked logits; one decoded
input/target pair is kept as evidence (the seeds' `<bos> A B C` / `A B C <eos>` on tiny-368).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...objective import flatten_for_loss, next_token_batch
from ...text.tokenizer import TINY_VOCAB, decode, encode
from .. import tolerances
from ..measure import batch_not_equal
from ..result import CheckResult
from ..subject import Subject


def _describe(ids: list[int], tiny: bool) -> str:
    return decode(ids) if tiny else " ".join(str(i) for i in ids)


def check_loss_alignment(s: Subject) -> CheckResult:
    tiny = s.vocab_size == len(TINY_VOCAB)
    seq_len = s.short_len(4)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(12)
    sequences = torch.randint(0, s.vocab_size, (batch, seq_len + 1), generator=gen)
    if tiny:  # the seeds' example, <bos> A B C <eos> at T = 4, stretched or cut to T + 1 ids
        letters = ["A", "B", "C", "D", "E"]
        example = ["<bos>"] + [letters[i % 5] for i in range(seq_len - 1)] + ["<eos>"]
        sequences[0] = torch.tensor(encode(" ".join(example)))
    inputs, targets = next_token_batch(sequences)
    logits = s.run(inputs).double().cpu()
    problems = []
    if tuple(logits.shape) != (batch, seq_len, s.vocab_size):
        return CheckResult("loss_alignment", False, f"logits {tuple(logits.shape)} cannot be "
                           f"aligned with targets {tuple(targets.shape)}", {})
    flat_logits, flat_targets = flatten_for_loss(logits, targets)
    problems += _row_problems(sequences, inputs, logits, flat_logits, flat_targets)
    loss = F.cross_entropy(flat_logits, flat_targets)
    loop = sum(-torch.log_softmax(logits[b, t], -1)[sequences[b, t + 1]]
               for b in range(batch) for t in range(seq_len)) / (batch * seq_len)
    if not abs(float(loss) - float(loop)) <= tolerances.LOSS_ALIGNMENT * max(1.0, abs(float(loop))):
        problems.append(f"flattened loss {float(loss):.6g} != per-position loop {float(loop):.6g}")
    if not math.isfinite(float(loss)):
        problems.append(f"the loss on the model's logits is {float(loss)}")
    loss_next, loss_copy = _peaked_losses(inputs, flat_targets, s.vocab_size)
    if not loss_next < 1e-6 or not loss_copy > 10.0:
        problems.append(f"shift direction: next-id logits give loss {loss_next:.3g}, copy-input "
                        f"logits give {loss_copy:.3g}")
    pairs = [{"position": t, "input": _describe([int(inputs[0, t])], tiny),
              "target": _describe([int(targets[0, t])], tiny)} for t in range(seq_len)]
    evidence = {
        "vocabulary": TINY_VOCAB if tiny else None,
        "sequence": _describe(sequences[0].tolist(), tiny),
        "input": _describe(inputs[0].tolist(), tiny),
        "target": _describe(targets[0].tolist(), tiny),
        "pairs": pairs, "batch": batch, "seq_len": seq_len,
        "flat_logits_shape": list(flat_logits.shape), "flat_targets_shape": list(flat_targets.shape),
        "loss": float(loss), "loss_loop": float(loop), "ln_vocab": math.log(s.vocab_size),
        "loss_next_peaked": loss_next, "loss_copy_peaked": loss_copy,
        "problems": problems,
    }
    if problems:
        return CheckResult("loss_alignment", False, problems[0], evidence, tolerances.LOSS_ALIGNMENT)
    return CheckResult("loss_alignment", True, f"input: {evidence['input']} / target: "
                       f"{evidence['target']}; (B, T, V) -> ({batch * seq_len}, V) rows aligned; "
                       f"loss {float(loss):.4f} (ln V = {math.log(s.vocab_size):.4f})",
                       evidence, tolerances.LOSS_ALIGNMENT)


def _row_problems(sequences: torch.Tensor, inputs: torch.Tensor, logits: torch.Tensor,
                  flat_logits: torch.Tensor, flat_targets: torch.Tensor) -> list[str]:
    """Each flat row r against its (b, t) = divmod(r, T), computed independently of the
    flattening: logits[b, t], id t + 1 of sequence b, and the next input."""
    problems = []
    batch, seq_len = logits.shape[:2]
    for r in range(batch * seq_len):
        b, t = divmod(r, seq_len)
        if not torch.equal(flat_logits[r], logits[b, t]):
            problems.append(f"flat logits row {r} is not logits[{b}, {t}]")
        if int(flat_targets[r]) != int(sequences[b, t + 1]):
            problems.append(f"flat target {r} is {int(flat_targets[r])}, not id {t + 1} of "
                            f"sequence {b} ({int(sequences[b, t + 1])})")
        if t + 1 < seq_len and int(flat_targets[r]) != int(inputs[b, t + 1]):
            problems.append(f"target ({b}, {t}) is not the next input ({b}, {t + 1})")
    return problems


def _peaked_losses(inputs: torch.Tensor, flat_targets: torch.Tensor, vocab_size: int
                   ) -> tuple[float, float]:
    """The shift's direction: logits that put all mass on the next id give loss ~0; logits that
    copy the current input (the unshifted mistake) give a large loss. Returns both losses."""
    peaked_next = F.one_hot(flat_targets, vocab_size).double() * 50.0
    peaked_copy = F.one_hot(inputs.reshape(-1), vocab_size).double() * 50.0
    loss_next = float(F.cross_entropy(peaked_next, flat_targets))
    differ = inputs.reshape(-1) != flat_targets  # where copying the input is wrong
    loss_copy = (float(F.cross_entropy(peaked_copy[differ], flat_targets[differ]))
                 if differ.any() else float("inf"))
    return loss_next, loss_copy
