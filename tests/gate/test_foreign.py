"""The gate on decoders that are not ours (issue 11): no false alarms on correct models of every
kind the conformance sweep met, and the genuine failures still fail, naming the check and the
path that leaked.

Each false-alarm class has a model of that kind: hand-written ones below (`ToyLM`, an explicit
attention decoder that hands back `attentions` the way Hugging Face models do, with knobs for
sinks, memory keys, a state tensor, a late leak, a wider input vocabulary and a squeezed time
axis), and Hugging Face models built tiny from their configs (`tests/conformance.py`).
"""

from __future__ import annotations

import pytest
import torch
from helpers import random_decoder
from zoo_foreign import BridgeLike, KVGPTLike, ToyLM, V, WrapperLike

import decoder_audit as da
from decoder_audit.testing import assert_decoder, failure_message


def _audit(model, **options):
    options.setdefault("vocab_size", V)
    options.setdefault("max_seq_len", None)
    return da.audit(model, **options)


# ---- attention_rows: no false alarms ---------------------------------------------------------

def test_a_plain_exposed_pattern_passes_and_names_the_path_it_read():
    report = _audit(ToyLM())
    assert report.passed, report.first_failure
    rows = report["attention_rows"]
    assert not rows.skipped and "output_attentions" in rows.detail
    assert "rows sum to 1" in rows.detail


def test_declared_sinks_may_take_row_mass_but_never_add_it():
    model = ToyLM(sinks=True)
    with torch.no_grad():
        model.sinks.fill_(2.0)  # a sink that takes a good part of every row
    report = _audit(model)
    assert report.passed, report.first_failure
    rows = report["attention_rows"]
    assert rows.evidence["sinks"] == ["sinks"]
    assert min(r["min_row_sum"] for r in rows.evidence["heads"]) < 0.9
    assert "at most 1" in rows.detail and "sinks" in rows.detail


def test_rows_below_one_without_declared_sinks_still_fail():
    report = _audit(ToyLM(scale_rows=0.5), checks=["attention_rows"])
    assert not report["attention_rows"].passed
    assert "a row sums to 1 +-" in report["attention_rows"].detail


def test_rows_above_one_fail_even_with_sinks():
    report = _audit(ToyLM(sinks=True, scale_rows=1.5), checks=["attention_rows"])
    assert not report["attention_rows"].passed
    assert "> 1" in report["attention_rows"].detail


def test_more_keys_than_queries_are_judged_by_their_key_axis():
    report = _audit(ToyLM(memory=3))
    assert report.passed, report.first_failure
    heads = report["attention_rows"].evidence["heads"]
    assert {r["keys"] for r in heads} == {3 + report["attention_rows"].evidence["seq_len"]}
    assert "3 extra keys (first)" in heads[0]["key_layout"]


def test_a_state_in_attentions_is_recognised_by_a_second_length_and_not_judged():
    # the state is (B, H, 16, 16) and the probe length is 16: only a second length tells
    report = _audit(ToyLM(state=True))
    assert report.passed, report.first_failure
    rows = report["attention_rows"]
    assert rows.evidence["seq_len"] == 16
    assert any("state, not a pattern" in why for why in rows.evidence["not_patterns"])
    assert "not judged" in rows.detail


# ---- lengths, input vocabulary, shapes --------------------------------------------------------

def test_without_max_seq_len_every_behavioural_check_covers_intervention_len():
    late = ToyLM(leak_from=20)  # causal up to position 20, leaks after
    report = _audit(late)  # max_seq_len=None, intervention_len default 64
    assert report["causal"].evidence["seq_len"] == 64
    assert not report["causal"].passed and not report["prefix"].passed
    assert 20 <= report["causal"].evidence["cuts"][0]["cut"] or any(
        c["moved_rows"] for c in report["causal"].evidence["cuts"])
    assert max(report["inputs"].evidence["lengths"]) == 64
    short = _audit(late, intervention_len=16, checks=["causal", "prefix"])
    assert short.passed  # what the old 16-token cap could see


def test_a_model_without_a_hard_limit_given_one_is_told_how_to_audit_it():
    report = _audit(ToyLM(), max_seq_len=8, checks=["overlength"])
    detail = report["overlength"].detail
    assert not report["overlength"].passed
    assert "max_seq_len=None" in detail and "--intervention-len" in detail


def test_input_vocabulary_larger_than_the_output_is_declared():
    model = ToyLM(input_vocab=V + 1)
    undeclared = _audit(model, checks=["inputs"])
    assert not undeclared["inputs"].passed
    assert f"id {V} = vocab_size" in undeclared["inputs"].detail
    declared = _audit(model, input_vocab_size=V + 1)
    assert declared.passed, declared.first_failure
    assert declared.input_vocab_size == V + 1
    probe = next(r for r in declared["inputs"].evidence["rejections"] if "input_vocab_size" in r["probe"])
    assert probe["rejected"]


def test_a_wrong_output_shape_is_a_shape_failure_not_a_leak():
    report = _audit(ToyLM(squeeze=True))
    prefix = report["prefix"]
    assert not prefix.passed
    assert "shape (2, 2, 11)" in prefix.detail and "(B, T, V) = (2, 1, 11)" in prefix.detail
    assert "depend on what follows" not in prefix.detail
    assert not report["inputs"].passed and "expected (3, 1, 11)" in report["inputs"].detail


# ---- assert_decoder ---------------------------------------------------------------------------

def test_assert_decoder_returns_the_report_of_a_correct_decoder():
    report = assert_decoder(ToyLM(), vocab_size=V, max_seq_len=None, intervention_len=12)
    assert report.passed


def test_assert_decoder_lists_every_failing_check_with_its_evidence():
    with pytest.raises(AssertionError) as caught:
        assert_decoder(ToyLM(leak_from=2), vocab_size=V, max_seq_len=None, intervention_len=12)
    message = str(caught.value)
    report = da.audit(ToyLM(leak_from=2), vocab_size=V, max_seq_len=None, intervention_len=12)
    assert message == failure_message(report)
    for check in report.failures:
        assert f"- {check.name}: {check.detail}" in message
    assert "causal" in message.splitlines()[0] and "moved_rows" in message


# ---- Hugging Face models built tiny -----------------------------------------------------------

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()
import conformance  # noqa: E402 - needs transformers


def _hf(model_type: str):
    families = conformance.causal_lm_families()
    if model_type not in families:
        pytest.skip(f"transformers {tf.__version__} has no causal LM of model_type={model_type!r}")
    model, _ = conformance.build_tiny(model_type, families[model_type])
    return model


def _hf_audit(model, **options):
    from decoder_audit.references.hf_models import audit_facts

    facts = audit_facts(model).audit_options()
    facts.update(options)
    facts.setdefault("intervention_len", conformance.INTERVENTION_LEN)
    return da.audit(model, **facts)


def test_gpt_oss_sinks_pass_on_the_eager_path():
    model = _hf("gpt_oss")
    report = _hf_audit(model, checks=["causal", "attention_rows"])
    rows = report["attention_rows"]
    assert rows.passed and not rows.skipped, rows.detail
    assert any(name.endswith("self_attn.sinks") for name in rows.evidence["sinks"])
    assert min(r["min_row_sum"] for r in rows.evidence["heads"]) < 1 - 1e-3


def test_sdpa_models_are_checked_on_an_eager_path_and_given_back_unchanged():
    model = _hf("llama")
    assert model.config._attn_implementation == "sdpa"
    if not callable(getattr(model, "set_attn_implementation", None)):  # from 4.54
        pytest.skip("this release cannot switch a built model's attention path")
    ids = torch.randint(0, conformance.V, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    report = _hf_audit(model, checks=["causal", "attention_rows"])
    rows = report["attention_rows"]
    assert rows.passed and not rows.skipped, rows.detail
    assert rows.evidence["path"] == "eager" and rows.evidence["default_path"] == "sdpa"
    assert "switched from the model's default sdpa" in rows.detail
    assert "already passed `causal`" in rows.detail
    # a passing check found no leak, so its evidence speaks of none (newcomer item 2)
    assert "leak" not in rows.detail and "leak" not in rows.evidence["plain_forward"]
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_a_stock_rope_model_given_its_config_length_is_told_how_to_audit_it():
    model = _hf("llama")
    report = da.audit(model, vocab_size=conformance.V,
                      max_seq_len=model.config.max_position_embeddings, checks=["overlength"])
    assert not report["overlength"].passed
    assert "max_seq_len=None" in report["overlength"].detail


def test_falcons_output_attentions_path_leak_is_named():
    model = _hf("falcon")
    with torch.no_grad():  # the leak itself, seen without the gate: weight on a future key
        weights = model(torch.zeros(1, 5, dtype=torch.long), output_attentions=True,
                        use_cache=False).attentions[0]  # (1, H, T, T)
    if not bool((weights.triu(diagonal=1).abs() > 0).any()):
        pytest.skip("this release's Falcon output_attentions path is causal")
    report = _hf_audit(model)
    assert report["causal"].passed  # the plain (sdpa) forward is causal
    rows = report["attention_rows"]
    assert not rows.passed
    assert "future key" in rows.detail and "output_attentions=True" in rows.detail
    assert "eager attention" in rows.detail and "leak is in this path only" in rows.detail
    assert [c.name for c in report.failures] == ["attention_rows"]


@pytest.mark.parametrize("model_type", ["cpmant", "xlm"])
def test_bidirectional_defaults_fail_causal_and_prefix(model_type):
    report = _hf_audit(_hf(model_type), checks=["causal", "prefix", "attention_rows"])
    assert not report["causal"].passed and "reads future tokens" in report["causal"].detail
    assert not report["prefix"].passed
    rows = report["attention_rows"]
    assert not rows.passed and "plain forward" in rows.detail and "fails `causal` too" in rows.detail


# ---- decoder-audit verify / ledger / account --hf DIR -----------------------------------------

@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """save_pretrained folders: GPT-2 (learned positions), Llama (rotary), BERT masked LM."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    models = {
        "gpt2": tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=29, n_embd=16, n_layer=2, n_head=2,
                                                 n_positions=12, bos_token_id=None,
                                                 eos_token_id=None)),
        "llama": tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=29, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)),
        "bert": tf.BertForMaskedLM(tf.BertConfig(vocab_size=29, hidden_size=16,
                                                 num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=24, max_position_embeddings=12,
                                                 pad_token_id=0)),
    }
    folders = {}
    for name, model in models.items():
        folders[name] = root / name
        model.eval().save_pretrained(folders[name])
    return folders


def _cli(*argv):
    import contextlib
    import io

    from decoder_audit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_verify_hf_reads_v_and_the_length_policy_from_the_folder(hf_folders):
    import json

    status, out, _ = _cli("verify", "--hf", str(hf_folders["gpt2"]), "--json", "--no-progress")
    report = json.loads(out)
    assert status == 0, [c["detail"] for c in report["checks"] if c["status"] == "FAIL"]
    assert (report["vocab_size"], report["max_seq_len"]) == (29, 12)
    assert "learned position table" in report["notes"][0]
    assert next(c for c in report["checks"] if c["name"] == "oracle")["status"] == "pass"
    assert report["command"].startswith("decoder-audit verify --hf ")

    status, out, _ = _cli("verify", "--hf", str(hf_folders["llama"]), "--json", "--no-progress")
    report = json.loads(out)
    assert status == 0, [c["detail"] for c in report["checks"] if c["status"] == "FAIL"]
    assert report["max_seq_len"] is None and "no hard length limit" in report["notes"][0]
    causal = next(c for c in report["checks"] if c["name"] == "causal")
    assert causal["evidence"]["seq_len"] == 64


def test_verify_hf_masked_lm_fails_causal_and_prefix(hf_folders, tmp_path):
    status, out, _ = _cli("verify", "--hf", str(hf_folders["bert"]), "--no-progress",
                          "--report", str(tmp_path / "bert"))
    assert status == 1
    import json

    report = json.loads((tmp_path / "bert" / "report.json").read_text())
    failed = {c["name"] for c in report["checks"] if c["status"] == "FAIL"}
    assert {"causal", "prefix", "attention_rows"} <= failed
    assert (tmp_path / "bert" / "dependency_matrix.png").is_file()


def test_ledger_and_account_take_hf_folders_where_the_family_converts(hf_folders):
    status, out, _ = _cli("ledger", "--hf", str(hf_folders["llama"]))
    assert status == 0 and "reconciled" in out
    status, out, _ = _cli("ledger", "--hf", str(hf_folders["bert"]))
    assert status == 0 and "measured ledger only" in out and "model_type='bert'" in out
    status, out, _ = _cli("account", "--hf", str(hf_folders["gpt2"]), "--no-measure")
    assert status == 0
    status, _, err = _cli("account", "--hf", str(hf_folders["bert"]))
    assert status == 2 and "needs a DecoderConfig" in err


def test_the_oracle_reads_any_config_registered_for_a_converted_class():
    """EXAONE's config (model_type 'exaone') is registered for LlamaForCausalLM: the class
    decides, so the oracle runs on it."""
    model = _hf("exaone")
    assert type(model) is tf.LlamaForCausalLM and model.config.model_type == "exaone"
    oracle = _hf_audit(model, checks=["oracle"])["oracle"]
    assert oracle.passed and not oracle.skipped, oracle.detail


def test_cli_input_vocab_size_and_intervention_len_reach_the_gate(tmp_path):
    import json

    path = tmp_path / "toy.py"
    path.write_text("from zoo_foreign import ToyLM\n\n\ndef build():\n"
                    f"    return ToyLM(input_vocab={V + 1})\n")
    spec = f"{path}:build"
    status, out, _ = _cli("verify", "--model", spec, "--vocab-size", str(V), "--json",
                          "--intervention-len", "12", "--no-progress")
    report = json.loads(out)
    assert status == 1 and report["first_failure"] == "inputs"
    status, out, _ = _cli("verify", "--model", spec, "--vocab-size", str(V), "--json",
                          "--input-vocab-size", str(V + 1), "--intervention-len", "12",
                          "--no-progress")
    report = json.loads(out)
    assert status == 0 and report["input_vocab_size"] == V + 1
    assert "--input-vocab-size 12" in report["command"]
    causal = next(c for c in report["checks"] if c["name"] == "causal")
    assert causal["evidence"]["seq_len"] == 12


@pytest.mark.parametrize("wrapper", [BridgeLike, WrapperLike, KVGPTLike])
def test_a_call_convention_guessed_from_names_is_established_by_calling(wrapper):
    """Forwards with a `past_key_values` or `cache` parameter that take the ids positionally
    and keep (or have) no cache they hand back: the gate calls them as they work. The ids go in
    positionally, kv_cache is skipped with the reason (not failed with the TypeError of a call
    they cannot take), and a mask is used only where the forward takes attention_mask."""
    model = wrapper(random_decoder(da.preset("tiny-368")))
    report = da.audit(model, vocab_size=8, max_seq_len=4)
    assert report.passed, report.first_failure
    conv = report.facts.convention
    assert not conv.ids_keyword and not conv.cached
    assert report["kv_cache"].skipped and "no cache" in report["kv_cache"].detail
    assert report["padding"].skipped == (wrapper is not BridgeLike)


def test_a_model_whose_forward_requires_an_attention_mask_is_audited_with_one():
    """A forward with attention_mask as a required argument: every check's plain call raised
    TypeError (missing argument), so a correct model failed most of the gate. The gate passes
    the all-ones mask a batch without pads has; a leak planted in it still fails `causal`."""
    tf = pytest.importorskip("transformers")

    class NeedsMask(tf.LlamaForCausalLM):
        def forward(self, input_ids, attention_mask, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=32)
    report = da.audit(NeedsMask(config).eval())
    assert report.passed, [(c.name, c.detail) for c in report.failures]
    assert report.facts.convention.mask_required

    class LeaksWithMask(NeedsMask):
        def forward(self, input_ids, attention_mask, **kwargs):
            out = super().forward(input_ids, attention_mask, **kwargs)
            out.logits = out.logits + 0.1 * out.logits.flip(1)  # each row reads a later one
            return out

    torch.manual_seed(0)
    assert not da.audit(LeaksWithMask(config).eval(), checks=["causal"])["causal"].passed
