"""Evaluation on the held-out split (val_loss, val_perplexity every --eval-every steps), training
on a text file with a real tokenizer (--text FILE --tokenizer T), and the final report's tokens/s
and MFU.

Independent expectations: the text is written with a word-level tokenizer whose word "w{i}" has
id i, and its last 10% of words come from w50..w99 while the rest come from w0..w49, so every
id says which split it was read from. The validation loss is recomputed here from the saved
checkpoint by the float64 oracle on the evaluation windows (checked to be held-out ids only);
perplexity is math.exp of it; the FLOPs per token are written out below from the config
(6N + 12 L T D for a dense GELU decoder); tokens/s and MFU are the formulas of the docstring in
training/throughput.py applied to the numbers the run reports."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.references.oracle import oracle_logits
from decoder_audit.storage.checkpoint import load_checkpoint
from decoder_audit.text.datasets import TokenDataset, prepare_dataset
from decoder_audit.text.tasks import TokenText
from decoder_audit.text.tokenizer import Tokenizer
from decoder_audit.training import train

tokenizers = pytest.importorskip("tokenizers")

WORDS = 100  # w0 .. w99, then "</s>" = 100: vocab_size 101
TRAIN_WORDS, VAL_WORDS = 1800, 200  # val_fraction 0.1 of 2000 words
CFG = da.DecoderConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                       max_seq_len=16, mlp="gelu")
RUN = {"steps": 12, "batch_size": 8, "warmup": 2, "seed": 1}
EVAL_EVERY = 5


def word_tokenizer(folder):
    """tokenizer.json of a word-level tokenizer: "w{i}" -> i, "</s>" -> 100 (the end)."""
    vocab = {f"w{i}": i for i in range(WORDS)} | {"</s>": WORDS}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    folder.mkdir(exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    text = folder / "words.txt"
    words = [f"w{(3 * i) % 50}" for i in range(TRAIN_WORDS)]  # ids 0..49: training
    words += [f"w{50 + (7 * i) % 50}" for i in range(VAL_WORDS)]  # ids 50..99: held out
    text.write_text(" ".join(words))
    return text, word_tokenizer(folder / "tok")


@pytest.fixture(scope="module", params=["text", "data"])
def evaluated_run(request, corpus, tmp_path_factory):
    """A run on --text FILE --tokenizer T, or on the dataset `prepare` writes from the same."""
    text, tok = corpus
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "text":
        source = {"text": str(text), "tokenizer": str(tok)}
        task = TokenText(text, CFG.max_seq_len, Tokenizer.from_spec(tok), seed=RUN["seed"])
    else:
        prepare_dataset([text], tok, folder / "data", val_fraction=0.1)
        source = {"data": str(folder / "data")}
        task = TokenDataset(folder / "data", CFG.max_seq_len)
    out = folder / "run"
    result = train(CFG, **RUN, **source, out=out, eval_every=EVAL_EVERY, progress=False,
                   verbose=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return result, rows, out, task


def test_validation_loss_every_eval_every_steps_with_its_perplexity(evaluated_run):
    _, rows, _, _ = evaluated_run
    evaluated = [row["step"] for row in rows if "val_loss" in row]
    assert evaluated == [0, 5, 10, 12]  # the fresh model, every 5 steps, and the last step
    for row in rows:
        if "val_loss" in row:
            assert row["val_perplexity"] == pytest.approx(math.exp(row["val_loss"]), rel=1e-12)
            assert row["val_loss"] == row["eval_loss"]
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]  # it learned something that generalises


def test_validation_loss_is_the_checkpoints_loss_on_held_out_windows(evaluated_run):
    result, rows, out, task = evaluated_run
    inputs, targets, weights = task.eval_batch()  # (W, T) each
    assert inputs.min() >= 50 and targets.min() >= 50  # held-out ids only (and </s> = 100)
    model = load_checkpoint(out / "checkpoint")
    logits = oracle_logits(model.state_dict(), model.config, inputs)  # (W, T, V) float64
    per_token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                  reduction="none")
    expected = float(per_token.mean())  # every window holds T tokens: a plain mean
    assert rows[-1]["val_loss"] == pytest.approx(expected, abs=1e-5)
    assert result.final_loss == pytest.approx(expected, abs=1e-5)


def test_the_checkpoint_carries_the_tokenizer(evaluated_run, corpus, capsys):
    _, _, out, _ = evaluated_run
    stored = Tokenizer.from_folder(out / "checkpoint")
    assert stored is not None and stored.sha256 == Tokenizer.from_spec(corpus[1]).sha256
    assert main(["sample", "--checkpoint", str(out), "--prompt", "w3 w6", "--max-new-tokens",
                 "3", "--json"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert sampled["text"].startswith("w3 w6")  # read back through the word tokenizer


def test_a_tokenizer_larger_than_the_model_is_refused_naming_both(corpus, tmp_path):
    text, tok = corpus
    small = da.DecoderConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                             max_seq_len=16, mlp="gelu")
    with pytest.raises(da.ConfigError, match=r"vocab_size=101.*vocab_size=64"):
        train(small, text=str(text), tokenizer=str(tok), steps=1, out=tmp_path / "run",
              progress=False, verbose=False)
    assert not (tmp_path / "run" / "checkpoint").exists()
    with pytest.raises(da.ConfigError, match="tokenizer="):
        train(small, tokenizer=str(tok), steps=1, progress=False, verbose=False)  # no text


# ----------------------------------------------------------------------------------------------
# tokens/s and MFU
# ----------------------------------------------------------------------------------------------

def _training_flops_per_token(cfg: da.DecoderConfig, T: int) -> int:
    """6N + 12 L T D: N the matmul weights (attention 4D^2 and GELU MLP 2DF per layer, the
    readout DV), 2 FLOPs per multiply-add, x3 for forward + backward; attention's scores and
    weighted sum cost 2 T D each per token and layer in the forward, the full T x T square."""
    D, F, L, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    n_matmul = L * (4 * D * D + 2 * D * F) + D * V
    return 6 * n_matmul + 12 * L * T * D


def test_tokens_per_second_and_mfu(evaluated_run):
    result, _, _, _ = evaluated_run
    speed = result.throughput
    assert speed.tokens == RUN["steps"] * RUN["batch_size"] * CFG.max_seq_len
    assert speed.tokens_per_s == pytest.approx(speed.tokens / speed.seconds)
    assert result.tokens_per_s == speed.tokens_per_s
    assert speed.flops_per_token == _training_flops_per_token(CFG, CFG.max_seq_len)
    assert speed.peak_source.startswith("measured matmul ceiling")  # no peak given
    # the FLOPs of the definition written out by hand, not the ones the code counted
    assert speed.mfu == pytest.approx(speed.tokens_per_s
                                      * _training_flops_per_token(CFG, CFG.max_seq_len)
                                      / speed.peak_flops)


def test_the_cli_reports_mfu_against_a_given_peak(corpus, tmp_path, capsys):
    text, tok = corpus
    code = main(["train", "--config", str(_config_file(tmp_path)), "--text", str(text),
                 "--tokenizer", str(tok), "--steps", "4", "--batch-size", "8", "--grad-accum",
                 "2", "--peak-flops", "1e12", "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "MFU" in printed and "of 1e+12 FLOP/s (given: --peak-flops)" in printed
    assert f"{4 * 8 * CFG.max_seq_len:,} tokens in" in printed
    # MFU as printed = the printed tokens/s x the hand-counted FLOPs per token / the given peak
    per_s = float(re.search(r"([\d,.]+) tokens/s", printed).group(1).replace(",", ""))
    mfu = float(re.search(r"MFU ([\d.]+)%", printed).group(1)) / 100
    expected = per_s * _training_flops_per_token(CFG, CFG.max_seq_len) / 1e12
    assert mfu == pytest.approx(expected, rel=0.02, abs=1e-4)
    with pytest.raises(SystemExit) as refused:  # out of the option's range (cli/values.py)
        main(["train", "--config", str(_config_file(tmp_path)), "--peak-flops", "0",
              "--out", str(tmp_path / "other"), "--no-progress"])
    assert refused.value.code == 2
    assert "argument --peak-flops: 0 is not a finite number in (0, inf)" in \
        capsys.readouterr().err


def _config_file(folder):
    path = folder / "config.json"
    CFG.save(path)
    return path
