"""The gate's contracts beyond the zoo: evidence content, robustness (never crashes, never mutates
the model), the tiny vocabulary and loss helpers, the report files, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import configs
import pytest
import torch
import zoo
from torch import nn

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.gate import tolerances
from decoder_audit.objective import flatten_for_loss, next_token_batch
from decoder_audit.text.tokenizer import TINY_VOCAB, decode, encode


@pytest.fixture(scope="module")
def tiny_report():
    return da.audit(zoo.decoder())


# ---- the tiny vocabulary and the loss helpers -------------------------------------------------

def test_tiny_vocabulary_has_8_tokens_and_encodes_the_seeds_example():
    assert len(TINY_VOCAB) == 8 and {"<bos>", "<eos>", "A", "B", "C", "D"} <= set(TINY_VOCAB)
    ids = encode("<bos> A B C <eos>")
    assert [TINY_VOCAB[i] for i in ids] == ["<bos>", "A", "B", "C", "<eos>"]
    assert decode(ids) == "<bos> A B C <eos>"
    with pytest.raises(ValueError, match="'Z'"):
        encode("<bos> Z")
    with pytest.raises(ValueError, match="8"):
        decode([8])


def test_next_token_batch_and_flatten_keep_rows_aligned():
    seq = torch.tensor([[1, 3, 4, 5, 2], [1, 6, 7, 3, 2]])
    inputs, targets = next_token_batch(seq)
    assert inputs.tolist() == [[1, 3, 4, 5], [1, 6, 7, 3]]
    assert targets.tolist() == [[3, 4, 5, 2], [6, 7, 3, 2]]
    logits = torch.arange(2 * 4 * 8, dtype=torch.float64).reshape(2, 4, 8)
    flat_logits, flat_targets = flatten_for_loss(logits, targets)
    assert flat_logits.shape == (8, 8) and flat_targets.shape == (8,)
    for b in range(2):
        for t in range(4):
            assert torch.equal(flat_logits[b * 4 + t], logits[b, t])
            assert flat_targets[b * 4 + t] == seq[b, t + 1]
    with pytest.raises(ValueError):
        flatten_for_loss(logits, targets[:, :3])


# ---- evidence ---------------------------------------------------------------------------------

def test_tiny_368_evidence_matches_the_seeds(tiny_report):
    assert tiny_report.passed and tiny_report.first_failure is None
    assert [c.name for c in tiny_report.checks] == list(da.gate.CHECK_ORDER)
    params = tiny_report["params"].evidence
    assert params["analytic_total"] == params["measured_total"] == 32 + 16 + 2 * (16 + 64 + 76) + 8
    inputs = tiny_report["inputs"].evidence
    assert inputs["lengths"] == [1, 2, 3, 4] and len(inputs["batch_sizes"]) >= 2
    alignment = tiny_report["loss_alignment"].evidence
    assert alignment["input"] == "<bos> A B C" and alignment["target"] == "A B C <eos>"
    causal = tiny_report["causal"].evidence
    assert [c["cut"] for c in causal["cuts"]] == [0, 1, 2, 3]
    # lower-triangular dependency matrix: row t never moves for a cut c > t
    matrix = causal["dependency"]["max_change"]
    for t, row in enumerate(matrix):
        for j, cut in enumerate(causal["dependency"]["cols"]):
            if t < cut:
                assert row[j] <= causal["allowed"]
            if t == cut:
                assert row[j] > causal["allowed"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_leak_just_above_the_allowed_change_fails_causal_and_one_below_passes(dtype):
    """Every earlier row moves by exactly `leak` when the last token changes (zoo.LeaksLastToken).
    The model is audited in its own dtype; the causal allowance is NOISE_MARGIN times the noise
    floor measured beside it, so it is within a few eps of the dtype (exactly 0 when identical
    rows come out bitwise equal). A leak of twice the allowance (at least 64 eps, so it survives
    the logits' rounding) must fail; half of a nonzero allowance must pass."""
    clean = da.audit(zoo.LeaksLastToken(0.0, dtype), checks=["causal"], **zoo.TORCH_BLACKBOX)
    assert clean.passed and clean.dtype == str(dtype).removeprefix("torch.")
    evidence = clean["causal"].evidence
    allowed = evidence["allowed"]
    assert allowed <= 16 * tolerances.eps(dtype)
    assert (allowed == 0) == (evidence["index_noise"] == 0)  # exact when the floor is 0
    caught = da.audit(zoo.LeaksLastToken(max(2 * allowed, 64 * tolerances.eps(dtype)), dtype),
                      checks=["causal"], **zoo.TORCH_BLACKBOX)
    assert not caught["causal"].passed, caught["causal"].detail
    if allowed > 0:
        below = da.audit(zoo.LeaksLastToken(allowed / 2, dtype), checks=["causal"],
                         **zoo.TORCH_BLACKBOX)
        assert below["causal"].passed, below["causal"].detail


def test_causal_evidence_names_the_rows_that_moved_and_the_cut():
    report = da.audit(zoo.with_attention(zoo.LeakOne, zoo.SMALL), checks=["causal"])
    check = report["causal"]
    assert not check.passed
    by_cut = {rec["cut"]: rec for rec in check.evidence["cuts"]}
    # one future token visible per layer: changing tokens from c on moves row c - 1 at least
    for cut in range(1, zoo.SMALL.max_seq_len):
        assert cut - 1 in by_cut[cut]["moved_rows"]
        assert by_cut[cut]["max_change_earlier"] > check.evidence["allowed"]
    assert "cut c=1" in check.detail and "rows [0]" in check.detail


def test_finite_mask_is_beaten_only_under_stress():
    check = da.audit(zoo.with_attention(zoo.FiniteMask), checks=["attention_rows"])["attention_rows"]
    assert not check.passed
    natural = max(h["max_future_probability"] for h in check.evidence["heads"])
    assert natural == 0.0  # exp(-1e4) underflows: the natural run cannot see the defect
    assert check.evidence["stressed"]["max_future_probability"] > 0.0
    assert "scaled-up Q/K" in check.detail


def test_long_context_samples_cuts_and_lengths():
    cfg = configs.named("long-context-200")
    report = da.audit(zoo.decoder(cfg), checks=["inputs", "causal", "prefix", "overlength"])
    assert report.passed
    cuts = [c["cut"] for c in report["causal"].evidence["cuts"]]
    assert report["causal"].evidence["seq_len"] == 64
    assert 0 in cuts and 1 in cuts and 63 in cuts and len(cuts) <= 16
    assert 1 in report["inputs"].evidence["lengths"] and 200 in report["inputs"].evidence["lengths"]
    assert report["overlength"].evidence["seq_len"] == 201
    assert [c.name for c in report.skipped] == [n for n in da.gate.CHECK_ORDER
                                                 if n not in ("inputs", "causal", "prefix", "overlength")]


# ---- the words of the verdicts ----------------------------------------------------------------

def test_raw_logits_names_softmax_or_log_softmax_inside_the_model():
    """The detail tells the user what to remove, not only that the rows look normalised."""
    probs = da.audit(zoo.decoder(cls=zoo.SoftmaxOutput), checks=["raw_logits"])["raw_logits"]
    assert not probs.passed
    assert probs.detail.startswith("the forward returns probabilities (every row is in [0, 1] "
                                   "and sums to 1): softmax inside the model")
    logs = da.audit(zoo.decoder(cls=zoo.LogSoftmaxOutput), checks=["raw_logits"])["raw_logits"]
    assert not logs.passed
    assert logs.detail.startswith("the forward returns log-probabilities (every row has "
                                  "logsumexp 0): log_softmax inside the model; return raw logits")


class OneNaNLogit(zoo.TorchDecoder):
    """A NaN at one known (batch, position): the last row of the batch, position 1."""

    def finish(self, logits, ids):
        logits = logits.clone()
        logits[-1, 1, 0] = float("nan")
        return logits


def test_raw_logits_names_the_non_finite_batch_and_position():
    torch.manual_seed(0)
    check = da.audit(OneNaNLogit(), checks=["raw_logits"], **zoo.TORCH_BLACKBOX)["raw_logits"]
    assert not check.passed
    last = check.evidence["batch"] - 1
    assert check.evidence["non_finite_rows"] == [[last, 1]]
    assert check.detail == f"non-finite logits at (batch, position) [[{last}, 1]]"


def test_progress_calls_name_each_check_as_it_starts_then_done():
    """fn(check, "") when a check starts (its own steps follow with a non-empty text), and
    fn("done", "") at the end; shapes and raw_logits report no steps of their own."""
    seen = []
    da.audit(zoo.decoder(), checks=["shapes", "raw_logits"],
             progress=lambda check, step: seen.append((check, step)))
    assert seen == [("shapes", ""), ("raw_logits", ""), ("done", "")]


def test_tying_evidence_counts_the_shared_parameter_once(tiny_report):
    """tiny-368 lists 29 parameter tensors: token and position embeddings, 12 per layer (ln1 and
    ln2 weight and bias, q, k, v, output projections, w1 and w2 weight and bias) x 2 layers,
    ln_final weight and bias, lm_head; tied, lm_head is token_embeddings, so 28 are unique."""
    tying = tiny_report["tying"]
    assert tying.passed and "one Parameter object" in tying.detail
    assert tying.evidence == {"declared_tied": True, "readout": "lm_head",
                              "structure": "one Parameter", "parameters_listed": 29,
                              "parameters_unique": 28}
    copied = da.audit(zoo.copied_readout(), checks=["tying"])["tying"]
    assert not copied.passed
    assert copied.evidence["parameters_listed"] == copied.evidence["parameters_unique"] == 29


# ---- the attention row-sum tolerance ----------------------------------------------------------

def test_row_sum_tolerance_is_4x_the_larger_of_dtype_eps_and_t_float32_eps():
    """4 * max(eps(dtype), max(T, 16) * eps32), eps32 = 2^-23: powers of two, so exact."""
    assert tolerances.row_sum(torch.float32, 16) == 4 * 16 * 2.0**-23 == 2.0**-17  # 7.6e-6
    assert tolerances.row_sum(torch.float32, 4) == 2.0**-17  # never below 16 terms' worth
    assert tolerances.row_sum(torch.float32, 1024) == 4 * 1024 * 2.0**-23 == 2.0**-11
    assert tolerances.row_sum(torch.bfloat16, 16) == 4 * 2.0**-7 == 0.03125  # eps(bf16) wins
    assert tolerances.row_sum(torch.float16, 4) == 4 * 2.0**-10


class RowsSumAbove1(zoo.HandAttention):
    """Every attention row sums to 1 + 1e-3: 130x the float32 allowance, 2^-17."""

    def probabilities(self, masked):
        return masked.softmax(-1) * (1 + 1e-3)


def test_attention_rows_summing_to_1_plus_1e_3_fail_in_float32():
    check = da.audit(zoo.with_attention(RowsSumAbove1), checks=["attention_rows"])
    check = check["attention_rows"]
    assert not check.passed
    assert "a row sums to 1 +- 0.001" in check.detail, check.detail
    assert {h["row_sum_tolerance"] for h in check.evidence["heads"]} == {2.0**-17}


# ---- robustness -------------------------------------------------------------------------------

def test_the_gate_does_not_mutate_the_model_or_the_global_rng():
    model = zoo.decoder()
    model.train()
    model.layers[0].eval()  # a mixed mode, restored exactly
    modes = [m.training for m in model.modules()]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    rng = torch.get_rng_state()
    da.audit(model)
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert model.lm_head.weight is model.token_embeddings.weight
    assert next(model.parameters()).dtype == torch.float32
    assert torch.equal(torch.get_rng_state(), rng)


class RaisesPastTwo(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 5)

    def forward(self, ids):
        if ids.shape[-1] > 2:
            raise RuntimeError("boom at T > 2")
        return self.embed(ids)


class ReturnsAString(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        return "not logits"


def test_a_model_that_raises_fails_checks_and_the_gate_carries_on():
    report = da.audit(RaisesPastTwo(), vocab_size=5, max_seq_len=4)
    assert not report.passed
    assert "boom at T > 2" in report["inputs"].detail
    assert report["causal"].evidence["exception"] == "RuntimeError"
    report = da.audit(ReturnsAString(), vocab_size=5, max_seq_len=4)
    assert all(not c.passed for c in report.checks if not c.skipped)


class Float32Only(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = zoo.TorchDecoder()

    def forward(self, ids):
        if self.inner.head.weight.dtype == torch.float64:
            raise TypeError("this model only runs in float32")
        return self.inner(ids)


def test_a_model_that_refuses_float64_is_audited_in_its_own_float32():
    """The gate runs a model in its own dtype: a float32-only model is never cast to float64."""
    torch.manual_seed(0)
    report = da.audit(Float32Only(), **zoo.TORCH_BLACKBOX)
    assert report.passed and report.dtype == "float32"


def test_audit_argument_errors():
    with pytest.raises(da.ConfigError, match="vocab_size"):
        da.audit(zoo.TorchDecoder())
    with pytest.raises(da.ConfigError, match="disagrees"):
        da.audit(zoo.decoder(), vocab_size=9)
    with pytest.raises(ValueError, match="unknown check"):
        da.audit(zoo.decoder(), checks=["causality"])


# ---- report files -----------------------------------------------------------------------------

def test_report_dict_has_stable_keys_and_write_produces_the_evidence(tiny_report, tmp_path):
    data = tiny_report.to_dict()
    assert set(data) == {"passed", "first_failure", "model", "mode", "dtype", "device",
                         "vocab_size", "input_vocab_size", "max_seq_len", "seed", "config",
                         "checks", "skipped", "cost", "notes", "facts"}
    # the facts the gate used, and where each came from (a DecoderConfig here)
    assert data["facts"]["vocab_size"] == 8 and data["facts"]["origin"]["vocab_size"] == "config"
    assert data["facts"]["mode"] == "white-box" and data["facts"]["reference"] == "decoder"
    assert set(data["checks"][0]) == {"name", "status", "passed", "skipped", "detail",
                                      "tolerance", "evidence", "seconds", "paths"}
    paths = {c["name"]: c["paths"] for c in data["checks"]}
    # the cache and the padded batches are generation's path; the full forward is both paths'
    assert paths["kv_cache"] == paths["padding"] == ["generation"]
    assert paths["causal"] == paths["oracle"] == ["training", "generation"]
    written = tiny_report.write(tmp_path / "out", command="decoder-audit verify")
    names = sorted(p.name for p in written)
    assert names == ["attention_patterns.png", "dependency_matrix.png", "report.json", "report.md"]
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["passed"] is True and on_disk["command"] == "decoder-audit verify"
    markdown = (tmp_path / "out" / "report.md").read_text()
    for needle in ("## Shape ledger", "## Parameter ledger", "## Causal interventions",
                   "## Attention row sums", "input:  <bos> A B C", "decoder-audit verify"):
        assert needle in markdown
    for png in ("attention_patterns.png", "dependency_matrix.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failing_report_names_the_first_failure_in_markdown():
    report = da.audit(zoo.copied_readout())
    assert report.first_failure.name == "params"
    text = report.to_markdown()
    assert "first broken contract is `params`" in text and "### `tying`" in text


# ---- command line -----------------------------------------------------------------------------

def test_cli_verify_default_is_tiny_368_and_passes(capsys):
    assert main(["verify", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for needle in ("shape ledger", "parameter ledger", "368", "causal interventions",
                   "attention row sums", "input:  <bos> A B C", "target: A     B C <eos>",
                   "PASSED", "rerun: decoder-audit verify --preset tiny-368"):
        assert needle in out, needle


def test_cli_verify_json(capsys):
    assert main(["verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["first_failure"] is None
    assert data["command"] == "decoder-audit verify --preset tiny-368"


USER_FILE = '''
import sys
sys.path.insert(0, {tests!r})
import zoo

def good():
    return zoo.TorchDecoder()

def leaky():
    return zoo.with_attention(zoo.NoMask)
'''


def test_cli_verify_a_users_model_file(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text(USER_FILE.format(tests=str(Path(__file__).parent)))
    report_dir = tmp_path / "report"
    assert main(["verify", "--model", f"{path}:good", "--vocab-size", "13", "--max-seq-len", "9",
                 "--report", str(report_dir)]) == 0
    assert (report_dir / "dependency_matrix.png").exists()
    assert not (report_dir / "attention_patterns.png").exists()  # black-box: no patterns
    assert main(["verify", "--model", f"{path}:leaky"]) == 1  # white-box via its DecoderConfig
    out = capsys.readouterr().out
    assert "first broken contract is 'causal'" in out
    assert main(["verify", "--model", f"{path}:good"]) == 2  # no --vocab-size: usage error
    assert "--vocab-size" in capsys.readouterr().err  # the flag, on the command line


def test_cli_usage_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--preset", "tiny-368", "--config", "x.json"])
    assert exc.value.code == 2
    assert main(["verify", "--preset", "no-such-preset"]) == 2
    with pytest.raises(SystemExit) as exc:  # out of the option's range (cli/values.py)
        main(["verify", "--intervention-len", "0"])
    assert exc.value.code == 2


def _flatten_column_major(logits, targets):
    """(B, T, V) -> (T*B, V) rows in (t, b) order: every row paired with another row's target."""
    return logits.transpose(0, 1).reshape(-1, logits.shape[-1]), targets.reshape(-1)


def _unshifted(sequences):
    """Targets equal to the inputs: the model is scored on copying its input."""
    return sequences[:, :-1], sequences[:, :-1]


@pytest.mark.parametrize("helper, broken", [("flatten_for_loss", _flatten_column_major),
                                            ("next_token_batch", _unshifted)])
def test_loss_alignment_catches_a_broken_shift_or_flattening(monkeypatch, helper, broken):
    """loss_alignment proves the objective's helpers on the model's logits; its defects are in
    those helpers, not in a model, so they are planted here rather than in the zoo."""
    from decoder_audit.gate.checks import alignment

    monkeypatch.setattr(alignment, helper, broken)
    check = da.audit(zoo.decoder(), checks=["loss_alignment"])["loss_alignment"]
    assert not check.passed and check.evidence["problems"], check.detail


class RefusesCopy(zoo.TorchDecoder):
    def __deepcopy__(self, memo):
        raise TypeError("no copies of me")


def test_a_model_that_cannot_be_copied_is_audited_in_place_and_restored():
    torch.manual_seed(0)
    model = RefusesCopy()
    model.train()
    report = da.audit(model, **zoo.TORCH_BLACKBOX)
    assert report.passed and report.dtype == "float32"
    assert all(m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_a_config_carrying_module_with_other_weight_names_is_audited_as_a_black_box():
    """The torch.nn twin has a DecoderConfig but nn.MultiheadAttention's names: the white-box
    checks cannot read it, so it must be audited (and pass) as a black box, not fail them."""
    twin = da.twin_from_decoder(da.Decoder(da.preset("tiny-368")))
    report = da.audit(twin)
    assert report.passed, report.first_failure
    skipped = {c.name for c in report.checks if c.skipped}
    assert {"params", "oracle"} <= skipped
    # tying needs no layout: the twin's readout is its nn.Embedding's Parameter, found as such
    assert not report["tying"].skipped and not report["tying_grad"].skipped
    assert report["tying"].evidence["structure"] == "one Parameter"
    assert any("audited as a black box" in note for note in report.notes)
