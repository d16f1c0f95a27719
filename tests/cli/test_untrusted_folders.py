"""A Hugging Face folder is data, never code (issue 26): a config.json whose `auto_map` points at
Python files in the folder (a custom `model_type` transformers does not know) is refused with
one line naming the folder and the auto_map entry; the folder's Python is never imported, and
nothing asks on stdin whether to run it (transformers' trust_remote_code prompt)."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys

import pytest
from cli_support import error_line, snapshot, transformers_or_skip

from decoder_audit.cli import main
from decoder_audit.errors import CheckpointError

AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}


@pytest.fixture
def evil(tmp_path):
    """A folder whose evil.py writes tmp_path/ran.txt when it is imported."""
    transformers_or_skip()
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil-thing", "architectures": ["EvilForCausalLM"], "auto_map": AUTO_MAP}))
    (folder / "evil.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(tmp_path / 'ran.txt')!r}).write_text('the folder ran its code')\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        "class EvilConfig(PretrainedConfig):\n"
        "    model_type = 'evil-thing'\n"
        "class EvilForCausalLM(PreTrainedModel):\n"
        "    config_class = EvilConfig\n")
    return folder


@pytest.fixture
def no_prompt(monkeypatch):
    """Fail any attempt to read stdin (transformers asks there whether to run a folder's code)."""
    asked = []

    def refuse_to_answer(prompt=""):
        asked.append(prompt)
        raise AssertionError(f"input() was called: {prompt!r}")

    monkeypatch.setattr(builtins, "input", refuse_to_answer)
    return asked


def _names_the_remote_code(message: str, folder) -> None:
    assert str(folder) in message
    assert "auto_map" in message and "evil.EvilForCausalLM" in message


def test_verify_hf_refuses_a_folder_that_needs_its_own_code(evil, tmp_path):
    # A real terminal would answer the prompt: here stdin says yes, so anything that asks runs
    # the code and leaves ran.txt.
    script = ("import sys\nfrom decoder_audit.cli import main\n"
              f"sys.exit(main(['verify', '--hf', {str(evil)!r}]))")
    done = subprocess.run(
        [sys.executable, "-c", script], check=False,
        input="y\ny\ny\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})  # where a copy would go
    assert not (tmp_path / "ran.txt").exists(), done.stdout + done.stderr
    assert done.returncode == 2, done.stdout + done.stderr
    assert "custom code" not in done.stdout  # no prompt was shown
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("decoder-audit verify: error: "), lines
    _names_the_remote_code(lines[0], evil)


def test_loading_refuses_without_asking_or_importing(evil, tmp_path, no_prompt):
    from decoder_audit.references.hf import load_hf_folder
    from decoder_audit.references.hf_models import load_hf_model

    before = snapshot(evil)
    for load in (load_hf_model, load_hf_folder):
        with pytest.raises(CheckpointError) as refused:
            load(evil)
        _names_the_remote_code(str(refused.value), evil)
    assert no_prompt == [] and not (tmp_path / "ran.txt").exists()
    assert "evil" not in sys.modules
    assert snapshot(evil) == before


def test_convert_from_hf_refuses_a_folder_that_needs_its_own_code(evil, tmp_path, capsys,
                                                                   no_prompt):
    assert main(["convert", "--from-hf", str(evil), "--out", str(tmp_path / "out")]) == 2
    _names_the_remote_code(error_line(capsys, "convert"), evil)
    assert no_prompt == [] and not (tmp_path / "ran.txt").exists()
    assert not (tmp_path / "out").exists()


def test_a_known_model_type_loads_its_own_class_and_never_the_folders_code(hf_folder, tmp_path,
                                                                           no_prompt):
    """auto_map beside a model_type transformers knows (gpt2): the built-in class is used."""
    from decoder_audit.references.hf_models import load_hf_model

    folder = tmp_path / "gpt2"
    folder.mkdir()
    for path in hf_folder.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP}))
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(tmp_path / 'ran.txt')!r}).write_text('ran')\n")
    model = load_hf_model(folder)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert no_prompt == [] and not (tmp_path / "ran.txt").exists()
