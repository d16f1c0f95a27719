"""`decoder-audit verify --shard`: the gate on a model sharded with FSDP2, under torchrun with
gloo processes on the CPU, against the same audit in one process.

The expectation is the unsharded audit of the same model, run in this process on one thread
(torchrun gives each rank one): the sharded ranks gather the same weights and compute the same
products in the same order, so every verdict and every figure of the evidence must be equal,
bit for bit. What may differ is named: the seconds and the report's note that the model was
sharded.
"""

from __future__ import annotations

import json
import textwrap
from contextlib import contextmanager

import configs
import pytest
import torch
import zoo
from helpers import cli_path, torchrun

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.gate.sharding import class_name
from decoder_audit.training import distributed

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed missing")

# Figures a sharded audit reports differently by design (see the module docstring).
SHARDING_ONLY = {"seconds"}

LEAKY = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import zoo

    def leaky():  # one future token visible to every query
        return zoo.with_attention(zoo.LeakOne)
""")

BUILD = textwrap.dedent("""
    import json, sys
    import torch
    import decoder_audit as da
    from decoder_audit.gate.sharding import on_every_rank
    from decoder_audit.training import distributed

    ranks = distributed.init_distributed("cpu", shard=True)
    found = {}
    for label, (config, dtype) in json.loads(sys.argv[1]).items():
        cfg = da.DecoderConfig.from_dict(config)
        model = distributed.build_sharded(cfg, ranks, "cpu", seed=7, dtype=getattr(torch, dtype))
        local = {n: p.to_local().shape[0] for n, p in model.named_parameters()}  # rank 0's rows
        whole = {n: p.full_tensor() for n, p in model.named_parameters()}
        torch.manual_seed(7)
        ref = da.Decoder(cfg, dtype=getattr(torch, dtype))
        found[label] = {
            "unequal": [n for n, p in ref.named_parameters() if not torch.equal(p, whole[n])],
            "local": local, "rows": {n: p.shape[0] for n, p in ref.named_parameters()},
            "tied": model.lm_head.weight is model.token_embeddings.weight}
    weight = model.token_embeddings.weight  # sharded: the vote is taken over every rank
    found["votes"] = [on_every_rank(ranks.rank != 1, weight), on_every_rank(True, weight)]
    if ranks.is_main:
        open(sys.argv[2], "w").write(json.dumps(found))
    distributed.close(ranks)
""")


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _verify_here(capsys, *flags: str) -> tuple[int, dict]:
    """`decoder-audit verify FLAGS --json` in this process, on one thread."""
    capsys.readouterr()
    with _one_thread():
        code = main(["verify", *flags, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _verify_sharded(*flags: str, nproc: int = 2) -> tuple[int, dict]:
    proc = torchrun("--no-python", cli_path(), "verify", *flags, "--shard", "--json",
                    nproc=nproc)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def _without(value, keys: set[str]):
    """`value` with every dict entry named in `keys` removed, at any depth."""
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def _assert_same_audit(one: dict, sharded: dict) -> None:
    assert (sharded["passed"], sharded["first_failure"]) == (one["passed"], one["first_failure"])
    verdicts = [(c["name"], c["status"]) for c in one["checks"]]
    assert [(c["name"], c["status"]) for c in sharded["checks"]] == verdicts
    for mine, theirs in zip(one["checks"], sharded["checks"]):  # every figure of the evidence
        assert _without(theirs, SHARDING_ONLY) == _without(mine, SHARDING_ONLY), mine["name"]
    assert [n for n in sharded["notes"] if "FSDP2" not in n] == one["notes"]
    assert any("FSDP2 over 2 ranks" in note for note in sharded["notes"])
    assert sharded["model"] == one["model"] == "Decoder"
    assert sharded["command"].startswith("torchrun --nproc_per_node 2 --no-python decoder-audit")
    assert sharded["command"].endswith("--shard") and "--shard" not in one["command"]


@pytest.fixture(scope="module")
def gqa_config(tmp_path_factory):
    """GQA, RoPE, SwiGLU, untied, V = 11: every root weight splits unevenly over 2 ranks."""
    path = tmp_path_factory.mktemp("shard") / "gqa.json"
    configs.named("gqa-small").save(path)
    return str(path)


def test_sharded_audit_of_an_untied_gqa_config_equals_the_unsharded_one(capsys, gqa_config):
    """A config built sharded (1/N of the weights per rank, never whole) audits as it does
    whole: every verdict and figure equal."""
    one_code, one = _verify_here(capsys, "--config", gqa_config, "--seed", "2")
    code, sharded = _verify_sharded("--config", gqa_config, "--seed", "2")
    assert (code, one_code) == (0, 0)
    _assert_same_audit(one, sharded)
    oracle = next(c for c in sharded["checks"] if c["name"] == "oracle")
    assert oracle["evidence"]["grad_passes"] > 1  # a share of the gradients at a time


def test_a_leak_is_caught_sharded_as_it_is_unsharded(capsys, tmp_path):
    factory = tmp_path / "leaky.py"
    factory.write_text(LEAKY.format(tests=str(zoo.__file__).rsplit("/", 1)[0]))
    model = f"{factory}:leaky"
    one_code, one = _verify_here(capsys, "--model", model)
    code, sharded = _verify_sharded("--model", model)
    assert (code, one_code) == (1, 1)
    assert sharded["first_failure"] == "causal"
    _assert_same_audit(one, sharded)


def test_a_sharded_build_draws_the_unsharded_seeds_weights(tmp_path):
    """Three ranks (uneven rows everywhere), tied and untied, float32 and bfloat16: rank 0 holds
    a third of every weight's rows (rounded up), and gathered they equal Decoder(cfg) after
    manual_seed(seed), bit for bit; the tie survives as one sharded Parameter."""
    cases = {"tiny": (da.preset("tiny-368").to_dict(), "float32"),
             "gqa": (configs.named("gqa-small").to_dict(), "bfloat16")}
    script, out = tmp_path / "build.py", tmp_path / "found.json"
    script.write_text(BUILD)
    proc = torchrun(str(script), json.dumps(cases), str(out), nproc=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(out.read_text())
    tiny, gqa = found["tiny"], found["gqa"]
    assert tiny["unequal"] == [] and gqa["unequal"] == []
    assert tiny["tied"] and not gqa["tied"]
    assert found["votes"] == [False, True]  # a fact rank 1 does not find is no one's
    for case in (tiny, gqa):  # rank 0 holds the first ceil(rows / 3) rows of every weight
        assert case["local"] == {n: -(-rows // 3) for n, rows in case["rows"].items()}


def test_one_process_shard_takes_the_sharded_path_and_agrees(capsys):
    """--shard without torchrun: a one-rank group, nothing split, the same report."""
    _, one = _verify_here(capsys, "--preset", "tiny-368")
    capsys.readouterr()
    with _one_thread():
        code = main(["verify", "--preset", "tiny-368", "--shard", "--json"])
    assert code == 0
    sharded = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["status"]) for c in sharded["checks"]] == \
        [(c["name"], c["status"]) for c in one["checks"]]
    assert any("FSDP2 over 1 ranks" in note for note in sharded["notes"])


@pytest.mark.parametrize("flags", [["--hf", "gpt2"], ["--preset", "tiny-368", "--spec", "x.json"]])
def test_shard_refuses_other_layouts_before_anything_is_built(capsys, flags):
    assert main(["verify", *flags, "--shard"]) == 2
    err = capsys.readouterr().err
    assert "--shard" in err and "Decoder" in err


def test_shard_refuses_a_model_that_is_not_a_decoder(capsys, tmp_path):
    factory = tmp_path / "plain.py"
    factory.write_text("import torch\n\ndef plain():\n    return torch.nn.Embedding(5, 5)\n")
    assert main(["verify", "--model", f"{factory}:plain", "--vocab-size", "5", "--shard"]) == 2
    err = capsys.readouterr().err
    assert "Embedding" in err and "--shard" in err
    assert not torch.distributed.is_initialized()  # the one-rank group was ended


def test_class_name_names_the_model_not_the_wrapping():
    """fully_shard derives FSDPDecoder from Decoder; the report names the Decoder."""
    ranks = distributed.init_distributed("cpu", shard=True)
    try:
        model = distributed.build_sharded(da.preset("tiny-368"), ranks, "cpu", seed=0)
        assert type(model).__name__ != "Decoder" and isinstance(model, da.Decoder)
        assert class_name(model) == "Decoder"
    finally:
        distributed.close(ranks)
