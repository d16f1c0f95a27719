"""`decoder-audit ledger` and `presets` through the real console script entry point."""

import json
import re

import pytest

import decoder_audit as da
from decoder_audit.cli import main


def test_ledger_of_tiny_368_prints_the_seeds_rows(capsys):
    assert main(["ledger", "--preset", "tiny-368"]) == 0
    out = capsys.readouterr().out
    for row, count in (("token_embeddings", "32"), ("position_embeddings", "16"),
                       ("one block: norms", "16"), ("one block: attn", "64"),
                       ("one block: ffn", "76"), ("2 blocks", "312"), ("ln_final", "8"),
                       ("lm_head", "0"), ("total", "368")):
        line = next(line for line in out.splitlines() if row in line)
        assert f" {count} " in line, line
    assert "reconciled" in out


def test_ledger_json_of_gpt2_xl_without_allocating(capsys):
    assert main(["ledger", "--preset", "gpt2-xl", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measured_total"] == data["analytic_total"] == 1_557_611_200
    assert data["reconciled"] is True


def test_ledger_of_a_config_file(tmp_path, capsys):
    """llama-debug, written out: V=2048, D=256, L=4, Hkv*Dh=64, F=704, untied, no biases, RMSNorm,
    SwiGLU, RoPE: 2VD + L(2D^2 [q, o] + 2D*64 [k, v] + 3DF + 2D [norms]) + D [final norm]
    = 1_048_576 + 4 * 705_024 + 256."""
    path = tmp_path / "cfg.json"
    da.preset("llama-debug").save(path)
    assert main(["ledger", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["analytic_total"] == data["measured_total"] == 3_868_928


def test_ledger_of_a_users_model_file(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text("import torch\n"
                    "def build():\n"
                    "    return torch.nn.Sequential(torch.nn.Embedding(10, 3),\n"
                    "                               torch.nn.Linear(3, 10))\n")
    assert main(["ledger", "--model", f"{path}:build", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measured_total"] == 10 * 3 + 3 * 10 + 10 and data["analytic"] is None


def test_bad_config_file_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**da.preset("tiny-368").to_dict(), "n_heads": 3}))
    assert main(["ledger", "--config", str(path)]) == 2
    assert "d_model=4 is not divisible by n_heads=3" in capsys.readouterr().err


def test_presets_lists_every_preset_with_its_count(capsys):
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == da.preset_names()
    assert data["gpt2-small"]["parameters"] == 124_439_808


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "ledger" in out and "presets" in out


# ---- issue 26: --version; the pictures' colour scale and true cut positions --------------------

def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out.split()
    assert version("decoder-audit") in printed and da.__version__ in printed


def _drawn(monkeypatch, draw, check):
    """The matplotlib figure `draw(check, path)` saves."""
    import matplotlib.figure

    figures, save = [], matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    assert draw(check, _drawn.path)
    return figures[-1]


def test_the_attention_picture_has_a_colour_scale(monkeypatch, tmp_path):
    import numpy as np

    from decoder_audit.gate.pictures import attention_png
    from decoder_audit.gate.result import CheckResult

    pattern = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]  # (T, T) rows sum to 1
    check = CheckResult("attention_rows", True, "", arrays={
        "patterns": [np.stack([pattern, pattern])] * 2, "ids": [1, 2, 3, 4]})
    _drawn.path = tmp_path / "attention.png"
    figure = _drawn(monkeypatch, attention_png, check)
    bars = [ax for ax in figure.axes if getattr(ax, "_colorbar", None) is not None]
    assert len(bars) == 1
    assert bars[0]._colorbar.vmin == 0 and bars[0]._colorbar.vmax == 1  # probabilities


def test_the_dependency_picture_draws_sampled_cuts_at_their_positions(monkeypatch, tmp_path):
    from decoder_audit.gate.pictures import dependency_png
    from decoder_audit.gate.result import CheckResult

    rows, cols = list(range(40)), [0, 1, 10, 30, 39]  # sampled cuts, unevenly spaced
    change = [[1.0 if r >= c else 0.0 for c in cols] for r in rows]
    check = CheckResult("causal", True, "", {
        "allowed": 0.0, "dependency": {"rows": rows, "cols": cols, "max_change": change}})
    _drawn.path = tmp_path / "dependency.png"
    figure = _drawn(monkeypatch, dependency_png, check)
    ax = figure.axes[0]
    # the x axis is in input positions: each cut's tick stands at its value, not at its index
    assert [tick for tick in ax.get_xticks()] == cols
    assert [label.get_text() for label in ax.get_xticklabels()] == [str(c) for c in cols]
    mesh = ax.collections[0]
    x_edges = sorted({round(float(x), 6) for x in mesh.get_coordinates()[0, :, 0]})
    assert x_edges == [c - 0.5 for c in cols] + [cols[-1] + 0.5]


# ---- issue 44: a mistyped option under a command ---------------------------------------------

def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_mistyped_option_names_the_option_meant_and_the_commands_help(capsys):
    """argparse refused it in the top-level parser's name ("see decoder-audit --help"), with
    no suggestion; the command's own help and its nearest option are what help the user."""
    line = _usage_error(["verify", "--intervention-lne", "3"], capsys)
    assert "--intervention-lne" in line and "--intervention-len" in line
    assert "decoder-audit verify --help" in line and "decoder-audit --help" not in line
    line = _usage_error(["train", "--sed", "3"], capsys)
    assert "--seed" in line and "decoder-audit train --help" in line
    # an option of another command, or of decoder-audit itself, is named as such
    line = _usage_error(["verify", "--steps", "3"], capsys)
    assert "--steps" in line and "train" in line and "decoder-audit verify --help" in line
    line = _usage_error(["verify", "--debug"], capsys)
    assert "decoder-audit --debug verify" in line
    # one typed before the command is decoder-audit's own
    assert "see decoder-audit --help" in _usage_error(["--debg", "verify"], capsys)
    assert "--debug" in _usage_error(["--debg", "verify"], capsys)


# ---- issue 44: a small model's memory in a unit that shows it -------------------------------

UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20,
         "GiB": 2**30}
SIZE_ROW = re.compile(r"│ ([^│]+?) +│ +([\d,]+) │ +([\d.,]+) (B|kB|MB|GB) │ +([\d.,]+) "
                      r"(B|KiB|MiB|GiB) │")


@pytest.mark.parametrize("preset", ["tiny-368", "gpt2-small"])
def test_account_shows_each_size_in_the_largest_unit_it_fills(preset, capsys):
    """tiny-368's 1,472 bytes of weights showed as 0.00 GB. Each size's decimal and binary cells
    are its bytes over the unit (to the 2 decimals shown), in the largest unit of which there
    is at least one (GB at most), and in bytes below 1 kB."""
    assert main(["account", "--preset", preset, "--no-measure"]) == 0
    rows = SIZE_ROW.findall(capsys.readouterr().out)
    assert len(rows) >= 10
    for name, n_bytes, *cells in rows:
        n_bytes = int(n_bytes.replace(",", ""))
        for (value, unit), base in zip(zip(cells[::2], cells[1::2]), (1000, 1024)):
            size = UNITS[unit]
            assert abs(float(value.replace(",", "")) - n_bytes / size) <= 0.005, (name, value)
            larger = [u for u in UNITS.values() if u > size and u % base == 0 and u <= 2**30]
            assert size <= max(n_bytes, 1) and all(n_bytes < u for u in larger), (name, unit)
    assert preset != "tiny-368" or any(row[3] == "kB" for row in rows)
