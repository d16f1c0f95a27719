"""Sampling: greedy and temperature continuation, stopping at <eos>, at the context limit or after
N tokens, and refusing (never cropping) a prompt longer than max_seq_len. The models here are
lookup tables whose next token is written in the test, so every expectation is independent of
the code under test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from decoder_audit import ContextLengthError
from decoder_audit.generation.generate import generate
from decoder_audit.text.tokenizer import Tokenizer


def one_row(model, prompt, *, max_seq_len, max_new_tokens=None, **options):
    """`generate` on one prompt, by default to the context limit: max_seq_len + 1 ids in all
    (what `decoder-audit sample` asks for without --max-new-tokens); its row's ids, new ids and
    stop reason."""
    budget = max_new_tokens if max_new_tokens is not None else max(1, max_seq_len + 1 - len(prompt))
    out = generate(model, prompt, max_new_tokens=budget, max_seq_len=max_seq_len, **options)
    return SimpleNamespace(ids=out.ids[0], new_ids=out.new_ids[0], stop=out.stop[0])

V = 8
EOS = 2


class NextTable(nn.Module):
    """Logits that put all the mass (+10) on table[last id]: a deterministic 'model'."""

    def __init__(self, table: dict[int, int], max_seq_len: int) -> None:
        super().__init__()
        self.table, self.max_seq_len = table, max_seq_len
        self.dummy = nn.Parameter(torch.zeros(()))  # so the sampler can find a device
        self.seen_lengths: list[int] = []

    def forward(self, ids):
        assert ids.shape[1] <= self.max_seq_len, "fed more than max_seq_len ids"
        self.seen_lengths.append(ids.shape[1])
        logits = torch.zeros(*ids.shape, V)
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1]):
                logits[b, t, self.table[int(ids[b, t])]] = 10.0
        return logits


def test_greedy_stops_at_eos():
    # 1 -> 3 -> 4 -> 2 (<eos>)
    model = NextTable({1: 3, 3: 4, 4: EOS}, max_seq_len=8)
    out = one_row(model, [1], max_seq_len=8, eos_id=EOS)
    assert out.ids == [1, 3, 4, EOS] and out.new_ids == [3, 4, EOS] and out.stop == "eos"


def test_stops_at_context_limit_without_feeding_too_much():
    # A cycle that never emits <eos>: the sequence ends at max_seq_len + 1 ids, the longest
    # input fed is max_seq_len.
    model = NextTable({3: 4, 4: 5, 5: 3}, max_seq_len=4)
    out = one_row(model, [3, 4], max_seq_len=4, eos_id=EOS)
    assert out.ids == [3, 4, 5, 3, 4] and out.stop == "context"
    assert max(model.seen_lengths) == 4


def test_prompt_at_the_limit_gets_one_token_and_longer_is_refused():
    model = NextTable({3: 4, 4: 3}, max_seq_len=4)
    out = one_row(model, [3, 4, 3, 4], max_seq_len=4, eos_id=EOS)
    assert out.ids == [3, 4, 3, 4, 3] and out.stop == "context"
    with pytest.raises(ContextLengthError, match=r"5 tokens.*max_seq_len=4.*never cropped"):
        one_row(model, [3, 4, 3, 4, 3], max_seq_len=4, eos_id=EOS)


def test_max_new_tokens():
    model = NextTable({3: 4, 4: 3}, max_seq_len=16)
    out = one_row(model, [3], max_seq_len=16, eos_id=EOS, max_new_tokens=3)
    assert out.ids == [3, 4, 3, 4] and out.stop == "max_new_tokens"


class FixedDistribution(nn.Module):
    """Next-token logits = log p for a fixed p, whatever the input."""

    def __init__(self, probs: torch.Tensor) -> None:
        super().__init__()
        self.log_p = nn.Parameter(probs.log(), requires_grad=False)

    def forward(self, ids):
        return self.log_p.expand(*ids.shape, -1)


def test_temperature_sampling_is_seeded_and_follows_the_distribution():
    probs = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.2, 0.1, 0.0, 0.0])
    model = FixedDistribution(probs)

    def draws(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [one_row(model, [1], max_seq_len=4, temperature=1.0, max_new_tokens=1,
                         generator=gen).new_ids[0] for _ in range(2000)]

    first = draws(7)
    assert first == draws(7)  # the seed fixes the samples
    freq = torch.bincount(torch.tensor(first), minlength=V).float() / len(first)
    # 2000 draws: the standard error of a frequency is <= sqrt(0.25/2000) = 0.011; allow 4 sigma.
    assert torch.allclose(freq, probs, atol=0.045)
    # A very low temperature concentrates on the mode (p^(1/T) renormalised).
    gen = torch.Generator().manual_seed(0)
    cold = {one_row(model, [1], max_seq_len=4, temperature=0.01, max_new_tokens=1,
                     generator=gen).new_ids[0] for _ in range(50)}
    assert cold == {3}


def test_tokenizers():
    tiny = Tokenizer.for_vocab_size(8)
    assert tiny.encode("<bos> A B") == [1, 3, 4] and tiny.eos_id == 2
    assert tiny.decode([1, 3, 4, 2]) == "<bos> A B <eos>"
    text = Tokenizer.for_vocab_size(256)
    assert text.encode("hé") == [104, 0xC3, 0xA9] and text.eos_id is None
    assert text.decode([104, 0xC3, 0xA9]) == "hé"


# ---- the command line -------------------------------------------------------------------------

@pytest.fixture
def tiny_checkpoint(tmp_path):
    from helpers import random_decoder

    import decoder_audit as da

    model = random_decoder(da.preset("tiny-368"), seed=4, std=0.8)
    da.save_checkpoint(model, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_sample_command_draws_several_seeded_samples_with_top_k(tiny_checkpoint, capsys):
    import json

    from decoder_audit.cli import main

    args = ["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A",
            "--temperature", "1.0", "--top-k", "3", "--top-p", "0.9", "--num-samples", "4",
            "--max-new-tokens", "2", "--seed", "3", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == first  # the seed fixes every sample
    samples = first["samples"]
    assert len(samples) == 4
    assert all(s["ids"][:2] == [1, 3] and 1 <= len(s["new_ids"]) <= 2 for s in samples)
    assert all(s["stop"] in ("eos", "max_new_tokens") for s in samples)


def test_sample_command_prints_each_sample_and_refuses_top_k_when_greedy(tiny_checkpoint, capsys):
    from decoder_audit.cli import main

    assert main(["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A",
                 "--num-samples", "2", "--max-new-tokens", "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("[1/2] <bos> A ") and lines[1].startswith("[2/2] <bos> A ")
    assert lines[2].startswith("(greedy; 2 samples; new tokens 1, 1")
    assert captured.err == ""  # no progress bar off a terminal
    assert main(["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A",
                 "--top-k", "2"]) == 2
    assert "top_k=2" in capsys.readouterr().err
