"""`verify --hf DIR` on a damaged Hugging Face folder (issue 26): a garbled or truncated
model.safetensors, a config.json with a size that is not a positive integer, weights whose shapes
or layers are not the config's, pickle weights alone, a config too large for memory. Each is one
line naming the file and the field or tensor, exit 2; nothing is unpickled, and nothing the size
of the declared model is built before it is refused."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from cli_support import error_line, transformers_or_skip

from decoder_audit.cli import main


@pytest.fixture
def damaged(hf_folder, tmp_path):
    """A copy of the tiny GPT-2 folder (V=300, n_embd=16, 1 layer, 8 positions) to damage."""
    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    return folder


def _edit_config(folder, **fields) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _verify(folder, capsys) -> str:
    assert main(["verify", "--hf", str(folder), "--no-progress"]) == 2
    return error_line(capsys, "verify")


@pytest.mark.parametrize("damage", ["garbled", "truncated"])
def test_a_garbled_or_truncated_safetensors_file_is_one_line_naming_it(damaged, capsys, damage):
    weights = damaged / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"not safetensors " * 40 if damage == "garbled" else data[:len(data) // 2])
    line = _verify(damaged, capsys)
    assert str(weights) in line and "safetensors" in line


@pytest.mark.parametrize("field, value", [("n_layer", -2), ("n_head", 0), ("n_embd", "big"),
                                          ("vocab_size", 2.5)])
def test_a_size_that_is_not_a_positive_integer_is_named(damaged, capsys, field, value):
    _edit_config(damaged, **{field: value})
    line = _verify(damaged, capsys)
    assert str(damaged / "config.json") in line
    assert field in line and repr(value) in line, line


def test_weights_of_another_shape_name_the_tensors_and_both_shapes(damaged, capsys):
    _edit_config(damaged, n_embd=32)  # the file holds n_embd=16 tensors
    line = _verify(damaged, capsys)
    assert str(damaged / "model.safetensors") in line and str(damaged / "config.json") in line
    assert "transformer.h.0.ln_1.bias is (16,)" in line and "(32,)" in line, line


def test_weights_missing_a_layer_the_config_declares_are_named(damaged, capsys):
    _edit_config(damaged, n_layer=2)  # the file holds one layer
    line = _verify(damaged, capsys)
    assert str(damaged / "model.safetensors") in line
    assert "missing" in line and "transformer.h.1.attn.c_attn.weight" in line, line


@pytest.fixture
def never_unpickled(monkeypatch):
    """Every torch.load (the way to a pickle) recorded."""
    loads = []
    real = torch.load

    def recorded(*args, **kwargs):
        loads.append(args[:1])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recorded)
    monkeypatch.setattr(torch.serialization, "load", recorded)
    return loads


@pytest.mark.parametrize("command", ["verify", "convert"])
def test_pickle_weights_alone_are_refused_unread(damaged, tmp_path, capsys, never_unpickled,
                                                 command):
    from safetensors.torch import load_file

    weights = damaged / "model.safetensors"
    torch.save(load_file(str(weights)), damaged / "pytorch_model.bin")
    weights.unlink()
    argv = (["verify", "--hf", str(damaged), "--no-progress"] if command == "verify" else
            ["convert", "--from-hf", str(damaged), "--out", str(tmp_path / "out")])
    assert main(argv) == 2
    line = error_line(capsys, command)
    assert str(damaged) in line and "pytorch_model.bin" in line, line
    assert never_unpickled == []
    assert not (tmp_path / "out").exists()


# ---- a declared model far larger than its weights or than memory: refused before it is built ----

@pytest.fixture
def nothing_deep_built(monkeypatch):
    """GPT2LMHeadModel refuses to be built with more than 1,000 layers, on meta or not: counting
    100,000 on the meta device takes minutes (and GBs of modules), allocating them far more."""
    tf = transformers_or_skip()
    init = tf.GPT2LMHeadModel.__init__

    def shallow_only(self, config, *args, **kwargs):
        assert config.n_layer <= 1000, f"a {config.n_layer}-layer GPT2LMHeadModel was built"
        init(self, config, *args, **kwargs)

    monkeypatch.setattr(tf.GPT2LMHeadModel, "__init__", shallow_only)


def _gpt2_parameters(v: int, d: int, layers: int, positions: int) -> int:
    """GPT-2's unique parameters, tied: wte, wpe, L x (12 D^2 + 13 D), ln_f."""
    return v * d + positions * d + layers * (12 * d * d + 13 * d) + 2 * d


def test_a_config_too_large_for_memory_is_refused_with_the_figures(damaged, capsys, monkeypatch,
                                                                   nothing_deep_built):
    from decoder_audit.references import hf_models

    monkeypatch.setattr(hf_models, "available_bytes", lambda device="cpu": 2 * 10**9)
    _edit_config(damaged, n_layer=100_000, n_embd=1024)
    started = time.perf_counter()
    line = _verify(damaged, capsys)
    assert time.perf_counter() - started < 60
    params = _gpt2_parameters(300, 1024, 100_000, 8)
    assert str(damaged / "config.json") in line and "n_layer=100000" in line, line
    assert f"{params:,} parameters x 4 bytes" in line and f"{params * 4 / 1e9:,.1f} GB" in line
    assert "2.0 GB" in line  # what is available


def test_weights_far_smaller_than_the_declared_model_are_refused_before_building_it(
        damaged, capsys, nothing_deep_built):
    _edit_config(damaged, n_layer=100_000)  # 1.3 GB would fit; the file holds one layer
    started = time.perf_counter()
    line = _verify(damaged, capsys)
    assert time.perf_counter() - started < 60
    stored = _gpt2_parameters(300, 16, 1, 8)
    assert str(damaged / "model.safetensors") in line and "n_layer=100000" in line, line
    assert f"{stored:,} values" in line and f"{_gpt2_parameters(300, 16, 100_000, 8):,}" in line
