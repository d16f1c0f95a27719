"""The generation family of the gate (kv_cache, padding, grad_causal): every mutant of
tests/zoo_generation.py fails with the right check named, correct models (our presets, the
mutants' own configs unmutated, Hugging Face GPT-2 and Llama) pass, and models that cannot be
driven that way are skipped with the reason."""

from __future__ import annotations

import inspect

import pytest
import torch
import zoo
import zoo_generation as zg
from helpers import randomise
from torch import nn

import decoder_audit as da
from decoder_audit.gate import CHECK_ORDER
from decoder_audit.gate.registry import NEED_REASONS
from decoder_audit.generation.convention import position_origin

CHECKS = zg.GENERATION_CHECKS


def test_the_family_sits_after_the_oracle_and_before_the_loss():
    order = list(CHECK_ORDER)
    assert order.index("oracle") < order.index("kv_cache") < order.index("padding") \
        < order.index("grad_causal") < order.index("loss_alignment")


@pytest.mark.parametrize("case", zg.MUTANTS, ids=lambda case: case.name)
def test_mutant_is_caught_by_the_right_check(case):
    report = da.audit(case.build(), **case.kwargs)
    failing = [c.name for c in report.failures]
    assert case.expect in failing, f"{case.name}: expected {case.expect} to fail, got {failing}"
    if case.first:
        first = report.first_failure
        assert first.name == case.expect, f"{case.name}: first failure {first.name}: {first.detail}"
    if case.only:  # no other check can see the defect
        assert failing == [case.expect], failing
    # caught by the check's own verdict, not by the check crashing on the mutant
    assert "exception" not in report[case.expect].evidence, report[case.expect].detail
    assert case.says in report[case.expect].detail, report[case.expect].detail


def _passes(model, **facts) -> da.AuditReport:
    report = da.audit(model, checks=CHECKS, **facts)
    assert not report.failures, {c.name: c.detail for c in report.failures}
    assert [c.name for c in report.checks if c.name in CHECKS and c.skipped] == []
    return report


@pytest.mark.parametrize("cfg", [da.preset("tiny-368"), da.preset("cs336-test"),
                                 da.preset("llama-debug"), zg.LEARNED, zg.ROPE, zg.LONG],
                         ids=["tiny-368", "cs336-test", "llama-debug", "learned-untied",
                              "rope-gqa", "long-context-40"])
def test_correct_decoders_pass(cfg):
    report = _passes(zg.decoder(cfg))
    kv = report["kv_cache"].evidence
    assert kv["convention"] == "decoder"
    sizes = [r["sizes"] for r in kv["schedules"]]
    if cfg.max_seq_len >= 4:  # one-token steps and a chunk of >= 2 after a non-empty cache
        assert any(s[1:] and set(s[1:]) == {1} for s in sizes)
        assert any(size >= 2 for s in sizes for size in s[1:])
    assert report["grad_causal"].evidence["positions"][0]["position"] == 0
    # padding reports the convention it drove the model under, as kv_cache does
    assert report["padding"].evidence["convention"] == "decoder"


def test_the_gate_leaves_no_hook_behind():
    model = zg.decoder(zg.ROPE)
    da.audit(model, checks=["grad_causal"])
    assert not model.token_embeddings._forward_hooks


def test_models_without_a_cache_a_mask_or_an_embedding_are_skipped_with_the_reason():
    report = da.audit(zg.BlackBox(zg.decoder(zg.TINY)), checks=CHECKS, **zg.BLACKBOX)
    assert report["kv_cache"].skipped and report["padding"].skipped
    assert report["kv_cache"].evidence["reason"] == NEED_REASONS["has_cache"](report.facts)
    assert report["padding"].evidence["reason"] == NEED_REASONS["takes_mask"](report.facts)
    assert not report["grad_causal"].skipped and report.passed  # its token_embeddings is found

    class Linear(nn.Module):  # one-hot input, no embedding module at all
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(5, 5)

        def forward(self, ids):
            return self.proj(nn.functional.one_hot(ids, 5).float())

    report = da.audit(Linear(), checks=["grad_causal"], vocab_size=5)
    assert report["grad_causal"].skipped
    assert report["grad_causal"].evidence["reason"] == NEED_REASONS["has_input_embedding"](report.facts)


def test_a_model_whose_cache_is_kept_elsewhere_skips_kv_cache_with_the_reason():
    report = da.audit(zg.CacheKeptElsewhere(), checks=["kv_cache"], vocab_size=11)
    detail = report["kv_cache"].detail
    assert report["kv_cache"].skipped and "returned no cache" in detail
    # the user is told why it cannot be stepped, in those words
    assert detail.endswith("its cache is kept elsewhere (in the module or a caller-owned "
                           "object), so it cannot be stepped"), detail


class RefusesPadLastInCachedCall(da.Decoder):
    """A correct decoder that, like Hugging Face Mistral and Qwen2 under flash attention 2,
    refuses a cached call whose mask has a pad in its last column (it reads that as right
    padding). generate never feeds one: a left-padded prompt ends in a real token."""

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False):
        if cache is not None and attention_mask is not None and not attention_mask[:, -1].all():
            raise ValueError("right padding is not supported with a cache: pad on the left")
        return super().forward(ids, attention_mask, cache=cache, last_only=last_only)


def test_padding_through_the_cache_prefills_only_rows_ending_in_a_real_token():
    """T = 5 (LEARNED), left pads k in {1, 2}: the prefill holds all but the last two columns,
    so even the row padded by 2 ends its prefill in a real token (a prefill one column shorter
    would be all pads there, and this model, correct for generate, would be failed)."""
    report = _passes(zg.decoder(zg.LEARNED, RefusesPadLastInCachedCall))
    padding = report["padding"]
    assert "through the cache" in padding.detail
    cached = [r["pad"] for r in padding.evidence["rows"] if r["how"] != "one masked forward"]
    assert cached == [1, 2]


def test_a_plain_torch_decoder_runs_grad_causal_through_its_first_embedding():
    report = da.audit(zoo.TorchDecoder(), checks=CHECKS, **zoo.TORCH_BLACKBOX)
    assert report.passed and not report["grad_causal"].skipped
    assert report["grad_causal"].evidence["embedding"] == "Embedding"


# ---- Hugging Face models ----------------------------------------------------------------------

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _gpt2(impl: str = "eager", cls=None):
    config = tf.GPT2Config(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=4,
                           attn_implementation=impl)
    return randomise((cls or tf.GPT2LMHeadModel)(config), seed=2, std=0.3)


def _llama(impl: str = "eager"):
    config = tf.LlamaConfig(vocab_size=37, hidden_size=24, intermediate_size=20,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=16, attn_implementation=impl)
    return randomise(tf.LlamaForCausalLM(config), seed=2, std=0.3)


@pytest.mark.parametrize("build, impl", [(_gpt2, "eager"), (_gpt2, "sdpa"), (_llama, "eager"),
                                         (_llama, "sdpa")],
                         ids=["gpt2-eager", "gpt2-sdpa", "llama-eager", "llama-sdpa"])
def test_hugging_face_models_pass(build, impl):
    report = _passes(build(impl), vocab_size=37, max_seq_len=16)
    assert report["kv_cache"].evidence["convention"] == "hugging face"
    assert report["padding"].evidence["convention"] == "hugging face"


class PositionsRestartHF(tf.GPT2LMHeadModel):
    """GPT-2 whose forward, given no position_ids, numbers the tokens of each call from 0,
    whatever its cache holds (mlx-vlm#1983's defect under the Hugging Face call convention):
    its full forward is GPT-2's own."""

    def forward(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if kwargs.get("position_ids") is None and ids is not None:
            kwargs["position_ids"] = torch.arange(ids.shape[1])[None]  # the call's own length
        return super().forward(*args, **kwargs)


# the parameter names the gate reads the call convention from
PositionsRestartHF.forward.__signature__ = inspect.signature(tf.GPT2LMHeadModel.forward)


def test_a_hugging_face_model_whose_cached_positions_restart_fails_kv_cache_first():
    report = da.audit(_gpt2(cls=PositionsRestartHF), vocab_size=37, max_seq_len=16)
    assert [c.name for c in report.failures] == ["kv_cache"], report.first_failure.detail
    assert "a one-token step after 8 cached" in report["kv_cache"].detail
    assert not report["oracle"].skipped  # its full forward is GPT-2's: the oracle agrees


# ---- outside families the generation checks once misjudged, in small ---------------------------

def test_a_model_numbering_positions_from_padding_idx_plus_one_passes_padding():
    """RoBERTa's numbering: position_ids from 0 do not reproduce its own forward (the origin the
    gate used to assume), from PAD + 1 they do; driven from there its padded rows are right."""
    model = zg.OffsetPositions()
    ids = torch.tensor([[3, 4, 5, 6, 7]])  # content ids: PAD = 1 is not among them
    assert position_origin(model, ids, (0,)) is None
    assert position_origin(model, ids, (0, zg.OffsetPositions.PAD + 1)) == 2
    report = _passes(model, **zg.OffsetPositions.FACTS)
    assert report["padding"].evidence["position_origin"] == zg.OffsetPositions.PAD + 1
    assert "through the cache" in report["padding"].detail
    assert report["kv_cache"].evidence["convention"] == "hugging face"


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "recomputed"])
def test_generate_gives_each_ragged_row_what_it_gives_alone_on_offset_positions(use_cache):
    model = zg.OffsetPositions()
    rows = [[3, 4, 5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]]
    together = da.generate(model, rows, max_new_tokens=6, use_cache=use_cache)
    alone = [da.generate(model, [row], max_new_tokens=6, use_cache=use_cache).ids[0]
             for row in rows]
    assert together.ids == alone


def test_a_convolution_that_masks_its_pads_passes_padding():
    """The correct counterpart of the convolution_reads_pads mutant (RecurrentGemma's defect):
    pads zeroed before the convolution are the zeros a row's own start sees."""
    report = da.audit(zg.ConvOverPads(masks_conv=True), checks=["padding"],
                      **zg.ConvOverPads.FACTS)
    assert report.passed and not report["padding"].skipped, report["padding"].detail


def test_a_backward_refusing_eval_mode_is_skipped_with_the_models_reason():
    model = zg.backward_through(zg.RefusesEvalBackward)
    report = da.audit(model, checks=["grad_causal"])
    result = report["grad_causal"]
    assert result.skipped, result.detail
    assert "refuses a backward pass in eval mode" in result.detail
    assert "model.train()" in result.detail  # the model's own words
    assert not model.training  # audited, and given back, in eval mode


def test_a_backward_raising_for_another_reason_still_fails():
    report = da.audit(zg.backward_through(zg.BackwardRaises), checks=["grad_causal"])
    result = report["grad_causal"]
    assert not result.passed and not result.skipped
    assert "raised RuntimeError" in result.detail and "inplace operation" in result.detail


def test_a_padding_failure_keeps_its_tolerance():
    """A failing `padding` verdict carries the tolerance it was judged with, as a passing one
    does (mutant: the failing CheckResult lost it, so the report printed 'exact')."""
    import zoo_generation as zg

    from decoder_audit.gate import tolerances

    padding = da.audit(zg.decoder(zg.LEARNED, zg.MaskIgnored), checks=["padding"])["padding"]
    assert not padding.passed
    assert padding.tolerance == tolerances.shape_change(torch.float32)


def test_kv_cache_passes_a_model_with_room_for_one_token():
    """max_seq_len = 1 leaves no cached step to compare: `kv_cache` passes and says why
    (mutant: it failed such a model)."""
    import dataclasses

    model = zoo.decoder(dataclasses.replace(zoo.TINY, max_seq_len=1))
    kv_cache = da.audit(model, checks=["kv_cache"])["kv_cache"]
    assert kv_cache.passed and not kv_cache.skipped
    assert "no cached step" in kv_cache.detail


def test_a_model_changed_by_an_all_ones_mask_is_told_so_before_any_pad():
    """`padding` first compares a row under an all-ones mask with the plain run; a model that
    the mere presence of a mask changes fails there, and the detail says it was without any
    pad (mutant: that sentence upper-cased)."""
    import zoo_generation as zg

    class MaskMoves(da.Decoder):
        def forward(self, ids, attention_mask=None, *, cache=None, last_only=False):
            out = super().forward(ids, attention_mask, cache=cache, last_only=last_only)
            return out if attention_mask is None else out + 1e-2

    padding = da.audit(zg.decoder(zg.LEARNED, MaskMoves), checks=["padding"])["padding"]
    assert not padding.passed
    assert "without any pad, an all-ones attention_mask" in padding.detail


def test_the_last_position_has_no_later_gradient_to_report():
    """grad_causal evidence: position T-1 has no later input, so its largest later gradient is
    0 and no later position is listed (mutant 65: 1.0 for an empty range, a phantom gradient
    into the future in the evidence of a passing model)."""
    result = da.audit(zoo.decoder(zoo.TINY), checks=["grad_causal"])["grad_causal"]
    assert result.passed
    last = result.evidence["positions"][-1]
    assert last["position"] == zoo.TINY.max_seq_len - 1 == 3
    assert last["max_grad_later"] == 0.0 and last["later_positions_nonzero"] == []
    assert all(r["max_grad_later"] == 0.0 for r in result.evidence["positions"])
    # mutant 85: the passing detail said "a T=None sequence"
    assert result.detail == ("losses at positions [0, 1, 2, 3] of a T=4 sequence: gradient "
                             "exactly 0 at every later input, nonzero at their own")
