"""`decoder-audit sample`: seeded samples, top-k and top-p, and what it refuses (NaN weights, a
vocabulary no tokenizer reads)."""

from __future__ import annotations

import pytest
from cli_support import assert_kept, error_line, snapshot
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import decoder_audit as da
from decoder_audit.cli import main


def test_sample_refuses_a_checkpoint_holding_nan(tmp_path, capsys):
    folder = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if ".sha256." not in k}
    tensors = load_file(str(weights))
    tensors["ln_final.weight"][0] = float("nan")
    save_file(tensors, str(weights), metadata=metadata)  # digests dropped, as an old file
    before = snapshot(folder)
    assert main(["sample", "--checkpoint", str(folder), "--prompt", "<bos> A"]) == 2
    line = error_line(capsys, "sample")
    assert "tensors ['ln_final.weight'] hold NaN or inf" in line
    assert_kept(before)


def test_sample_refuses_a_vocabulary_without_a_tokenizer(converted, capsys):
    before = snapshot(converted)
    assert main(["sample", "--checkpoint", str(converted), "--prompt", "hello"]) == 2
    line = error_line(capsys, "sample")
    assert "no tokenizer for vocab_size=300" in line and "pass --tokenizer" in line
    assert_kept(before)


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
    # stdout: the samples and nothing else (issue 44: a script piping it got the summary line)
    assert len(lines) == 2, lines
    assert lines[0].startswith("[1/2] <bos> A ") and lines[1].startswith("[2/2] <bos> A ")
    # stderr: how they were drawn, 2 samples of 1 new token each; no progress bar off a terminal
    summary = captured.err.splitlines()
    assert len(summary) == 1 and "greedy" in summary[0] and "2 samples" in summary[0], summary
    assert main(["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A",
                 "--max-new-tokens", "2"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 and captured.out.startswith("<bos> A ")
    assert len(captured.err.splitlines()) == 1 and "new token" in captured.err
    assert main(["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A",
                 "--top-k", "2"]) == 2
    assert "--top-k=2" in capsys.readouterr().err  # the flag typed (the library says top_k=2)


# ---- issue 26: a temperature whose scores overflow; logits that overflow -------------------------

@pytest.mark.parametrize("temperature", ["1e-45", "5e-324"])
def test_sample_at_a_temperature_whose_scores_overflow_draws_greedys_tokens(tiny_checkpoint,
                                                                          capsys, temperature):
    import json

    base = ["sample", "--checkpoint", str(tiny_checkpoint), "--prompt", "<bos> A", "--json"]
    assert main(base) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert main([*base, "--temperature", temperature, "--seed", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == greedy["ids"]


def test_sample_refuses_logits_that_overflow_naming_the_row_and_the_step(tmp_path, capsys):
    # finite weights (load_checkpoint takes them) whose logits are inf - inf = NaN: a final norm
    # gain of 3e38 overflows the hidden state, the tied readout mixes +inf and -inf
    model = da.Decoder(da.preset("tiny-368"))
    import torch

    with torch.no_grad():
        model.ln_final.weight.fill_(3e38)
    folder = da.save_checkpoint(model, tmp_path / "ckpt")
    assert main(["sample", "--checkpoint", str(folder), "--prompt", "<bos> A",
                 "--num-samples", "2"]) == 2
    line = error_line(capsys, "sample")
    assert "row 0" in line and "step 0" in line and "NaN" in line, line
