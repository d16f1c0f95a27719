"""`da.audit` of a model inside the wrappers it trains in (decoder_audit.gate.wrappers): under
DistributedDataParallel and torch.compile the module inside is audited, under FSDP2 the sharded
module itself, and each correct model passes with no false alarm while a causal leak planted
inside the wrapper still fails `causal`. A backend with no backward on this device (flex
attention on CPU) makes every check that takes a gradient a skip that gives the reason.

The process group is a world of one (gloo, in this process): DDP and FSDP2 need one, and one
rank runs every collective they ask for."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zoo
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from zoo_integrations import LeakyLlama, config

import decoder_audit as da

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")

# The checks that take a gradient (registry needs "has_backward")
BACKWARD_CHECKS = ("tying_grad", "oracle", "dead_parameters", "expert_gradients",
                   "checkpointing", "grad_causal")


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _failures(report: da.AuditReport) -> list[tuple[str, str]]:
    return [(c.name, c.detail) for c in report.failures]


def tied_llama(cls=None):
    import transformers as tf

    torch.manual_seed(0)
    return (cls or tf.LlamaForCausalLM)(config(tie_word_embeddings=True))


# ---- DistributedDataParallel --------------------------------------------------------------------

def test_a_ddp_wrapped_decoder_is_audited_inside_and_a_leak_there_still_fails_causal(
        world_of_one):
    """DDP(Decoder) of a world of one: every check passes, white-box as the Decoder alone (its V
    read through the wrapper), no "Expected to have finished reduction"; the DDP-wrapped
    LeakOne fails causal."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    report = da.audit(DDP(zoo.decoder()))
    assert report.passed, _failures(report)
    assert report.mode == "white-box" and report.vocab_size == zoo.TINY.vocab_size
    assert not report["dead_parameters"].skipped and not report["grad_causal"].skipped
    assert any("DistributedDataParallel" in note for note in report.notes)
    leaky = da.audit(DDP(zoo.with_attention(zoo.LeakOne)))
    assert not leaky["causal"].passed


def test_a_ddp_wrapped_hugging_face_model_needs_no_vocab_size(world_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP

    report = da.audit(DDP(tied_llama()), checks=["causal", "tying", "tying_grad", "grad_causal"])
    assert report.passed, _failures(report)
    assert report.vocab_size == config().vocab_size and report.model == "LlamaForCausalLM"
    assert not da.audit(DDP(tied_llama(LeakyLlama)), checks=["causal"])["causal"].passed


# ---- torch.compile ------------------------------------------------------------------------------

def test_a_compiled_decoder_is_audited_inside_and_a_leak_there_still_fails_causal():
    """torch.compile(Decoder): every check passes (dead_parameters was failed by AOTAutograd's
    donated buffers); the module inside runs eagerly, so nothing is compiled at all."""
    report = da.audit(torch.compile(zoo.decoder()))
    assert report.passed, _failures(report)
    assert report.mode == "white-box" and not report["dead_parameters"].skipped
    assert any("torch.compile" in note for note in report.notes)
    assert not da.audit(torch.compile(zoo.with_attention(zoo.LeakOne)))["causal"].passed


# ---- FSDP2 --------------------------------------------------------------------------------------

def _sharded(model: nn.Module, blocks) -> nn.Module:
    """fully_shard as a user writes it: each block, then the root, with FSDP2's defaults (the
    root keeps its weights gathered after a forward)."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)
    return fully_shard(model)


def test_a_tied_hugging_face_model_under_fsdp2_passes_and_the_oracle_skip_says_why(
        world_of_one):
    """A tied Llama sharded with fully_shard: tying_grad (failed with "mixed torch.Tensor and
    DTensor") passes; the oracle of its spec is skipped naming FSDP2; a leak inside fails."""
    model = tied_llama()
    report = da.audit(_sharded(model, model.model.layers))
    assert report.passed, _failures(report)
    assert not report["tying_grad"].skipped and report["tying_grad"].passed
    oracle = report["oracle"]
    assert oracle.skipped and "FSDP2" in oracle.detail
    leaky = tied_llama(LeakyLlama)
    assert not da.audit(_sharded(leaky, leaky.model.layers), checks=["causal"])["causal"].passed


def test_our_decoder_under_fsdp2_with_its_defaults_passes_every_check(world_of_one):
    """The root keeps its weights gathered after a forward (FSDP2's default): the gate reshards
    them between its calls, so tying_grad and the oracle read the Parameters the forward uses
    (they failed, by 0.31 and 16.5); the setting is the user's again afterwards."""
    model = zoo.decoder()
    _sharded(model, model.layers)
    groups = model._get_fsdp_state()._fsdp_param_groups
    before = [g.post_forward_mesh_info for g in groups]
    report = da.audit(model)
    assert report.passed, _failures(report)
    assert not report["oracle"].skipped and not report["tying_grad"].skipped
    assert [g.post_forward_mesh_info for g in groups] == before
    assert "run_with_trace" not in model.__dict__


# ---- a backend with no backward on this device --------------------------------------------------

class FlexDecoder(nn.Module):
    """One tied attention layer through torch's flex_attention, run eagerly: on the CPU it has
    a forward and no backward. `leak`: each query also reads the next key."""

    def __init__(self, vocab: int = 29, dim: int = 16, heads: int = 2, leak: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.leak = heads, leak
        self.embedding = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        x = self.embedding(ids)  # (B, T, D)
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        reach = 1 if self.leak else 0
        mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + reach, None, None, length,
                                 length, device=ids.device)
        y = flex_attention(q, k, v, block_mask=mask)  # (B, H, T, Dh)
        x = x + self.out(y.transpose(1, 2).reshape(batch, length, -1))
        return self.head(F.layer_norm(x, x.shape[-1:]))  # (B, T, V)


def test_flex_attention_on_cpu_skips_each_gradient_check_naming_the_missing_backward():
    """FlexAttention raises NotImplementedError on CPU as soon as its input requires grad: every
    check that takes a gradient is a skip that says so (grad_causal, tying_grad and
    dead_parameters failed with the exception), the forward's checks pass, and a leak planted
    in the mask still fails causal."""
    report = da.audit(FlexDecoder(), vocab_size=29)
    assert report.passed, _failures(report)
    for name in ("grad_causal", "tying_grad", "dead_parameters"):
        check = report[name]
        assert check.skipped and "no backward on cpu" in check.detail, (name, check.detail)
        assert "NotImplementedError" in check.detail
    assert not report["causal"].skipped and report["causal"].passed
    leaky = da.audit(FlexDecoder(leak=True), vocab_size=29, checks=["causal"])
    assert not leaky["causal"].passed


def test_a_correct_decoder_keeps_every_gradient_check():
    """The probe finds a backward where there is one: nothing is skipped for it."""
    report = da.audit(zoo.decoder())
    assert report.facts.backward_reason == ""
    assert all(not report[name].skipped for name in ("tying_grad", "oracle", "dead_parameters",
                                                     "grad_causal"))


@pytest.mark.skipif(os.environ.get("DECODER_AUDIT_SLOW_TESTS") != "1",
                    reason="transformers compiles flex attention for each probe's shape: 35 s on "
                           "one CPU thread (DECODER_AUDIT_SLOW_TESTS=1 runs it)")
def test_a_hugging_face_llama_on_flex_attention_skips_the_gradient_checks_on_cpu():
    """attn_implementation="flex_attention" (compiled by transformers): oracle, grad_causal and
    tying_grad failed with the NotImplementedError; now each is a skip naming it, and causal
    still runs on the flex forward."""
    import transformers as tf

    settings = config(tie_word_embeddings=True)
    settings._attn_implementation = "flex_attention"
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(settings)
    report = da.audit(model, checks=["causal", "oracle", "grad_causal", "tying_grad"],
                      intervention_len=8)
    assert report.passed, _failures(report)
    for name in ("oracle", "grad_causal", "tying_grad"):
        assert report[name].skipped and "no backward on cpu" in report[name].detail, name
    assert not report["causal"].skipped
