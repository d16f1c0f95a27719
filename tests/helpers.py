"""Helpers the test modules share (import as `from helpers import ...`)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import decoder_audit as da


def randomise(module: nn.Module, seed: int = 0, std: float = 0.5) -> nn.Module:
    """Every parameter (norm gains and biases too) ~ N(0, std) from its own generator, so no term
    of the computation is trivially zero or one; returns the module in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():  # a tied weight is drawn once
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return module.eval()


def random_decoder(cfg: da.DecoderConfig, seed: int = 0, dtype: torch.dtype | None = None,
                   std: float = 0.5) -> da.Decoder:
    return randomise(da.Decoder(cfg, dtype=dtype), seed, std)


def oracle_leaves(model: da.Decoder, ids: torch.Tensor, weights: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """The gradients of sum(logits * weights) through the model (into each .grad) and through
    the float64 oracle fed the same values: the oracle's leaves, one per Parameter object (a
    tied weight is one leaf under its two names), their .grad its gradients."""
    (model(ids) * weights).sum().backward()
    fresh = {id(p): p.detach().clone().requires_grad_() for p in model.parameters()}
    leaves = {name: fresh[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
    (da.oracle_logits(leaves, model.config, ids) * weights).sum().backward()
    return leaves


BPE_CORPUS = ["the cat sat on the mat", "the dog ate the log"] * 20


def trained_bpe():
    """A byte-level BPE (300 ids, end token `<|endoftext|>`) trained here on BPE_CORPUS, so no
    test downloads a tokenizer: the `tokenizers` object itself is the independent expectation."""
    import tokenizers as lib

    backend = lib.Tokenizer(lib.models.BPE())
    backend.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = lib.decoders.ByteLevel()
    trainer = lib.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
    backend.train_from_iterator(BPE_CORPUS, trainer)
    return backend


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tiny_decoder(seed: int = 0) -> da.Decoder:
    torch.manual_seed(seed)
    return da.Decoder(da.preset("tiny-368"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*command: str, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node nproc COMMAND` on this machine's loopback (gloo on the CPU),
    one thread per process as torchrun sets by default."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *command],
        capture_output=True, text=True, env=env, timeout=timeout)


def cli_path() -> str:
    """The installed `decoder-audit` script beside this interpreter."""
    cli = Path(sys.executable).parent / "decoder-audit"
    return str(cli if cli.exists() else shutil.which("decoder-audit") or "decoder-audit")


def verdict_facts(text: str) -> tuple[list[int], list[str]]:
    """The facts of the PASSED line in `text` (a report as printed, or one line): its numbers
    in the order said (the checks that held, all checks, the checks that did not run) and the
    check names it lists (those skipped), whatever the sentence's words."""
    from decoder_audit.gate import CHECKS, BatchReport

    line = next(line for line in text.splitlines() if "PASSED" in line)
    known = set(CHECKS) | set(BatchReport.CHECK_TITLES)
    return ([int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", line)],
            [word for word in re.findall(r"\w+", line) if word in known])


def assert_read_and_written_back(model: nn.Module) -> None:
    """A Hugging Face model whose config the gate reads: its spec is found, params and the oracle
    pass, and in float64 the decoder read from it (from_hf) and that decoder written back (to_hf)
    give its own logits."""
    from decoder_audit.references.hf import from_hf, to_hf
    report = da.audit(model, checks=["params", "oracle"])
    assert report.facts.spec is not None, report["oracle"].detail
    assert report["params"].passed, report["params"].detail
    assert report["oracle"].passed, report["oracle"].detail
    model = model.double()
    ids = torch.randint(0, model.config.vocab_size, (2, 7),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        ours = from_hf(model)
        torch.testing.assert_close(ours(ids), theirs, atol=1e-6, rtol=0)
        torch.testing.assert_close(to_hf(ours)(input_ids=ids).logits, theirs, atol=1e-6, rtol=0)
