"""The BERT contrast (seed 001's optional unit): a tiny BertForMaskedLM beside a GPT-2 decoder of
the same size, both written as Hugging Face folders and audited by `decoder-audit verify --hf`,
exactly as a user would run it. Regenerates the figures and the table of docs/bert-contrast.md:

    python docs/bert_contrast.py                 # folders and reports under /tmp/bert-contrast
    python docs/bert_contrast.py --docs docs/bert-contrast   # also the page's pictures

Run as the first line shows, it writes nothing in the repository: the table goes to stdout and
the folders and reports (with their pictures) under --out. `--docs DIR` copies the pictures
into DIR too (the page's own are in docs/bert-contrast/, tracked). --out is emptied first only
when it holds nothing but what this script writes there; any other file makes it refuse.

Same sizes on both sides: V = 64, D = 32, L = 2 layers, H = 4 heads, F = 64, 16 learned
positions (a hard limit on both). Every weight matrix is drawn from N(0, 0.3) with seed 0 (the
families' own 0.02 initialisation makes every attention row nearly uniform, so the pictures
would show little); norms and biases keep their initial values.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import warnings
from pathlib import Path

import torch

SIZES = dict(V=64, D=32, L=2, H=4, F=64, T=16)
PICTURES = ("dependency_matrix.png", "attention_patterns.png")
MODELS = ("bert", "gpt2")
# What this script writes into --out: a folder and a report folder per model.
WRITTEN = frozenset(name for model in MODELS for name in (model, f"{model}-report"))


def build_folders(out: Path) -> dict[str, Path]:
    """Write the two models with `save_pretrained`; returns {name: folder}."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    v, d, layers, heads, ff, t = (SIZES[k] for k in ("V", "D", "L", "H", "F", "T"))
    torch.manual_seed(0)
    bert = tf.BertForMaskedLM(tf.BertConfig(
        vocab_size=v, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ff, max_position_embeddings=t, pad_token_id=0,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    torch.manual_seed(0)
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=v, n_embd=d, n_layer=layers, n_head=heads, n_inner=ff, n_positions=t,
        bos_token_id=None, eos_token_id=None))
    folders = {}
    for name, model in (("bert", bert), ("gpt2", gpt2)):
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():  # a tied weight is drawn once
                if param.dim() == 2:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        folder = out / name
        model.eval().save_pretrained(folder)
        folders[name] = folder
    return folders


def audit_folder(folder: Path, report_dir: Path) -> dict:
    """`decoder-audit verify --hf FOLDER --report DIR` through the command line's own entry
    point; returns the report's JSON."""
    from decoder_audit.cli import main

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        status = main(["verify", "--hf", str(folder), "--report", str(report_dir),
                       "--no-progress", "--json"])
    report = json.loads((report_dir / "report.json").read_text())
    report["exit_status"] = status
    return report


def table(reports: dict[str, dict]) -> str:
    """The side-by-side table of docs/bert-contrast.md."""
    names = list(reports)
    lines = ["| check | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, check in enumerate(reports[names[0]]["checks"]):
        cells = []
        for name in names:
            row = reports[name]["checks"][i]
            first = row["detail"].split(";")[0].replace("|", "/")
            cells.append("FAIL: " + first[:100] if row["status"] == "FAIL" else row["status"])
        lines.append(f"| `{check['name']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/bert-contrast", help="folders and reports")
    parser.add_argument("--docs", metavar="DIR",
                        help="also copy the pictures here (docs/bert-contrast for the page; "
                             "default: only under --out)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in WRITTEN)
        if foreign or not out.is_dir():
            parser.error(f"--out {str(out)!r} holds {foreign or 'a file'}, which this script "
                         "did not write: it empties --out first, so choose another folder")
        shutil.rmtree(out)
    folders = build_folders(out)
    reports = {}
    for name, folder in folders.items():
        report_dir = out / f"{name}-report"
        reports[name] = audit_folder(folder, report_dir)
        if args.docs:  # the pictures are in report_dir either way
            Path(args.docs).mkdir(parents=True, exist_ok=True)
            for picture in PICTURES:
                if (report_dir / picture).is_file():
                    shutil.copy(report_dir / picture, Path(args.docs) / f"{name}-{picture}")
    print(table(reports))
    for name, report in reports.items():
        print(f"{name}: exit {report['exit_status']}, failed: "
              f"{[c['name'] for c in report['checks'] if c['status'] == 'FAIL']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
