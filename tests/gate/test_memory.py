"""Running out of memory is the machine's limit, never the model's defect: an allocation that
fails inside the gate ends the audit as "could not run: out of memory" (GateOutOfMemory, exit 2
on the command line), never as a failed check; the pre-flight reads the address-space limit
(`ulimit -v`, RLIMIT_AS) besides the free memory; a probe length past the model's limit or past
memory is refused before anything runs; a declared vocabulary of any size costs nothing until
the model is called."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from zoo_foreign import V, ScratchLM, ToyLM

import decoder_audit as da
from decoder_audit.gate import GateOutOfMemory
from decoder_audit.gate.probes import ProbeIds

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2 * 2**30  # the address space a child may map: torch and the CLI map ~0.7 GB


def test_an_allocation_that_fails_in_a_check_is_no_verdict_on_the_model():
    model = ScratchLM(scratch=2**62)  # 4 EiB: no machine has it
    with pytest.raises(GateOutOfMemory) as ended:  # the first call at T >= 8: the inputs check
        da.audit(model, vocab_size=V, max_seq_len=16, checks=["inputs", "causal"])
    assert ended.value.needed == 2**62 and ended.value.where == "the check 'inputs'"
    assert isinstance(ended.value, MemoryError)
    with pytest.raises(GateOutOfMemory) as ended:  # without a limit: the length probe's call
        da.audit(model, vocab_size=V, max_seq_len=None, intervention_len=12)
    assert ended.value.where == "the length probe"  # not taken for a length limit
    assert da.audit(ScratchLM(scratch=1), vocab_size=V, max_seq_len=None,
                    intervention_len=12).passed  # the same model with the memory it asks for


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _verify(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    return subprocess.run([sys.executable, "-c", "import sys; from decoder_audit.cli import main; "
                           "sys.exit(main())", "verify", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, preexec_fn=_limited, timeout=240)


def test_under_ulimit_v_a_correct_model_could_not_run_and_nothing_is_failed(tmp_path):
    factory = tmp_path / "scratch.py"
    factory.write_text("from zoo_foreign import scratch_lm\n")
    done = _verify("--model", f"{factory}:scratch_lm", "--vocab-size", str(V),
                   "--intervention-len", "12", "--json")
    assert done.returncode == 2, (done.stdout[-800:], done.stderr[-800:])
    assert "out of memory" in done.stderr and str(3 * 2**30) in done.stderr
    assert done.stdout == "" and "FAILED" not in done.stderr  # no verdict was printed


def test_the_pre_flight_reads_the_address_space_limit(tmp_path):
    """4 GB of float32 weights cannot be mapped under a 2 GB limit, whatever MemAvailable says:
    refused before anything is built."""
    big = da.preset("tiny-368").replace(vocab_size=2**20, d_model=1024, max_seq_len=8)
    big.save(tmp_path / "big.json")
    done = _verify("--config", str(tmp_path / "big.json"))
    assert done.returncode == 2, done.stderr[-800:]
    assert "ulimit -v" in done.stderr and "would not fit" in done.stderr


def test_an_intervention_length_past_the_limit_or_past_memory_is_refused_before_any_call():
    calls = []
    model = ToyLM()
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(da.ConfigError, match=r"intervention_len=100000000.*T=100000000"):
        da.audit(model, vocab_size=V, intervention_len=100_000_000)
    with pytest.raises(da.ConfigError, match=r"intervention_len=100 exceeds max_seq_len=4"):
        da.audit(da.Decoder(da.preset("tiny-368")), intervention_len=100)
    assert calls == []


def test_a_vocabulary_is_an_id_range_never_listed():
    probes = ProbeIds(10**12)
    ids = probes.random(2, 5, torch.Generator().manual_seed(0))
    assert ids.shape == (2, 5) and int(ids.max()) < 10**12
    other = probes.other(ids, torch.Generator().manual_seed(1))
    assert bool((other != ids).all()) and int(other.max()) < 10**12
    padded = ProbeIds(5, pad_token_id=2)
    drawn = padded.random(50, 50, torch.Generator().manual_seed(0))
    assert set(drawn.unique().tolist()) == {0, 1, 3, 4}
    moved = padded.other(drawn, torch.Generator().manual_seed(1))
    assert bool((moved != drawn).all()) and 2 not in moved.unique().tolist()
