"""What the command-line tests share: snapshots of files that must be kept, the one-line error,
the interrupted tiny run, a Hugging Face folder and its conversion, a foreign model file.
The fixtures are registered by tests/cli/conftest.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import decoder_audit.training.loop as loop
from decoder_audit.cli import main
from decoder_audit.training.state import read_trainer_state


def snapshot(*roots: Path) -> dict[Path, bytes]:
    """Every file under `roots` (hidden ones too) and its bytes."""
    files = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files.update({path: path.read_bytes() for path in paths})
    return files


def assert_kept(before: dict[Path, bytes]) -> None:
    for path, data in before.items():
        assert path.is_file(), f"{path} was deleted"
        assert path.read_bytes() == data, f"{path} was changed"


def error_line(capsys, command: str) -> str:
    """stderr is exactly one line, `decoder-audit COMMAND: error: ...`; returns it."""
    return one_line(capsys.readouterr().err, command)


def one_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith(f"decoder-audit {command}: error: "), lines[0]
    return lines[0]


def strict_rows(path: Path) -> list[dict]:
    """metrics.jsonl parsed as strict JSON: a bare NaN/Infinity is an error."""
    def refuse(constant):
        raise AssertionError(f"{path} holds bare {constant}, which is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


TRAIN = ["--batch-size", "16", "--warmup", "4", "--no-progress"]


class Interrupt:
    """Ctrl-C (KeyboardInterrupt) right after step `at` has been recorded (and checkpointed if
    due), the way the user's key press would arrive."""

    def __init__(self, at: int) -> None:
        # private: the one point after a step's checkpoint where a key press is replayed
        self.at, self.original = at, loop._record

    def __call__(self, setting, prepared, training, *rest):
        outcome = self.original(setting, prepared, training, *rest)
        if training.step == self.at:
            raise KeyboardInterrupt
        return outcome


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """A tiny run of 24 steps with --save-every 8, interrupted after step 13: checkpoint/ at
    step 8, metrics for steps 0..13. Tests copy it."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "_record", Interrupt(13))
        code = main(["train", "--steps", "24", "--save-every", "8", "--out", str(out), *TRAIN])
    assert code == 130
    assert read_trainer_state(out / "checkpoint")[0]["step"] == 8
    return out


@pytest.fixture
def run_copy(interrupted_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(interrupted_run, copy)
    return copy


tf = None


def transformers_or_skip():
    global tf
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    return tf


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A GPT-2 with V = 300 saved by save_pretrained, plus the tokenizer files a user keeps in
    such a folder."""
    tf = transformers_or_skip()
    config = tf.GPT2Config(vocab_size=300, n_embd=16, n_layer=1, n_head=2, n_positions=8,
                           bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "hf_tiny"
    tf.GPT2LMHeadModel(config).save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 8}\n')
    return folder


@pytest.fixture(scope="module")
def converted(hf_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "ckpt"
    assert main(["convert", "--from-hf", str(hf_folder), "--out", str(out)]) == 0
    return out


FOREIGN = '''
import sys
import torch
from torch import nn


class PrefixMean(nn.Module):
    """Not a Decoder: embedding + positions, a causal prefix mean, a tied readout."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 8)
        self.pos = nn.Parameter(torch.zeros(4, 8))
        self.head = nn.Linear(8, 8, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be (B, T) int64, got {tuple(ids.shape)} {ids.dtype}")
        if not 1 <= ids.shape[1] <= 4 or ids.min() < 0 or ids.max() >= 8:
            raise ValueError("ids outside the contract")
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        x = torch.cumsum(x, 1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        return self.head(x)


def build():
    torch.manual_seed(0)
    model = PrefixMean()
    with torch.no_grad():
        model.emb.weight.mul_(0.02)
    return model


class ExitsInForward(nn.Module):
    def forward(self, ids):
        sys.exit(0)


def exits_in_forward():
    return ExitsInForward()


def exits():
    sys.exit(0)


def needs_arguments(width, depth=2):
    return nn.Linear(width, width)


def raises():
    raise ValueError("width must be positive, got -3")
'''


@pytest.fixture
def foreign(tmp_path) -> Path:
    path = tmp_path / "foreign.py"
    path.write_text(FOREIGN)
    return path


# A causal running mean with no position table (V = 8): a --model without a hard length limit.
NO_LIMIT = '''
import torch
from torch import nn


class Running(nn.Module):
    """A causal running mean with no position table: it runs at any length, V = 8."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 8)
        self.head = nn.Linear(8, 8, bias=False)

    def forward(self, ids):
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T), got {tuple(ids.shape)}")
        x = self.emb(ids)
        x = torch.cumsum(x, 1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        return self.head(x)


def build():
    torch.manual_seed(0)
    model = Running()
    with torch.no_grad():
        model.emb.weight.mul_(0.02)
    return model
'''
