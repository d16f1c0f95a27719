"""The tables of README.md and docs/*.md that state facts of the code, written from the code.

    python docs/generate.py            # rewrite every generated block in place
    python docs/generate.py --check    # change nothing; exit 1 naming each stale block

A generated block lies between `<!-- generated: NAME -->` and `<!-- end: NAME -->` in a page;
NAME is one of BLOCKS below, and a page may hold any of them. Everything between the markers is
the generator's: edit the code (the registry, the dataclass, the parser, the layouts), then run
this. `tests/test_docs.py` fails while a committed page differs from what this writes, so the
pages always say what the code does.

    checks    the gate's checks (gate/registry.py CHECKS): name, what it holds, family, paths
    expectations  each check, what it compares, and where its expectation comes from (CHECKS'
              `expects`)
    config    DecoderConfig's fields (config.py): name, type, default, its attribute docstring
    commands  the subcommands and their one-line help (cli/)
    sources   which model-source flag each subcommand takes (cli/, from its parser)
    layouts   the weight layouts a --spec finds by their names (references/layout_table.py LAYOUTS)
    presets   the named configurations and their analytic parameter counts
    families  the Hugging Face families read as a spec (references/families.py FAMILIES): what
              each changes relative to Llama's block
    black-box the families left black-box on purpose (references/family_black_box.py
              BLACK_BOX): what each lacks
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The pages that may hold generated blocks: the README and every page of the site.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# The model-source flags, as `decoder-audit COMMAND --help` names them.
SOURCE_FLAGS = ("--preset", "--config", "--checkpoint", "--hf", "--model")
BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


def _cell(text: str) -> str:
    """Text on one line, fit for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    rule = align or "|".join("---" for _ in header)
    lines = ["| " + " | ".join(header) + " |", f"|{rule}|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def checks_block() -> str:
    from decoder_audit.gate import CHECKS

    rows = [[str(i), f"`{c.name}`", c.title, c.family, ", ".join(c.paths)]
            for i, c in enumerate(CHECKS.values(), 1)]
    return _table(["#", "check", "what it holds", "family", "a failure affects"], rows,
                  "--:|---|---|---|---")


def config_fields() -> list[tuple[str, str, str, str]]:
    """(name, type, default, docstring on one line) of each DecoderConfig field, in order. The
    docstring is the string literal under the field in config.py (an attribute docstring)."""
    from decoder_audit.config import DecoderConfig

    source = inspect.getsource(DecoderConfig)
    body = ast.parse(source).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and \
                isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    fields = []
    for f in dataclasses.fields(DecoderConfig):
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory()!r}`"
        else:
            default = "required"
        fields.append((f.name, str(f.type), default, docs.get(f.name, "")))
    return fields


def config_block() -> str:
    rows = [[f"`{name}`", f"`{kind}`", default, doc]
            for name, kind, default, doc in config_fields()]
    return _table(["field", "type", "default", "meaning"], rows)


def _subcommands() -> argparse._SubParsersAction:
    """The `decoder-audit` parser's subcommands: `.choices` their parsers, in `--help`'s order,
    `._choices_actions` their one-line help."""
    from decoder_audit.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))


def commands_block() -> str:
    rows = [[f"`decoder-audit {choice.dest}`", choice.help or ""]
            for choice in _subcommands()._choices_actions]
    return _table(["command", "what it does"], rows)


def source_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{source flag: "yes" or "required"} for the model-source flags `parser` takes."""
    taken = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in SOURCE_FLAGS:
                taken[flag] = "required" if action.required else "yes"
    return taken


def sources_block() -> str:
    rows = []
    for name, parser in _subcommands().choices.items():
        taken = source_options(parser)
        if taken:
            rows.append([f"`{name}`", *(taken.get(flag, "-") for flag in SOURCE_FLAGS)])
    return _table(["command", *(f"`{flag}`" for flag in SOURCE_FLAGS)], rows,
                  "---|" + "|".join(":-:" for _ in SOURCE_FLAGS))


def layouts_block() -> str:
    from decoder_audit.references.layout_table import LAYOUTS

    rows = [[layout.name, f"`{layout.embedding}`", f"`{layout.block}`",
             f"`{layout.final_norm}`" if layout.final_norm else "none (GPT-1)",
             f"`{layout.head}`"] for layout in LAYOUTS]
    return _table(["layout", "embedding", "blocks", "final norm", "readout"], rows)


def presets_block() -> str:
    import decoder_audit as da

    rows = []
    for name in da.preset_names():
        cfg = da.preset(name)
        blocks = f"{cfg.norm}, {cfg.mlp}, {cfg.pos}, {'tied' if cfg.tie_embeddings else 'untied'}"
        rows.append([f"`{name}`", str(cfg.vocab_size), str(cfg.d_model), str(cfg.n_layers),
                     f"{cfg.n_heads}/{cfg.kv_heads}", str(cfg.d_ff), str(cfg.max_seq_len),
                     blocks, f"{da.parameter_ledger(cfg).total:,}"])
    return _table(["preset", "V", "D", "L", "H/Hkv", "F", "T", "blocks", "unique parameters"],
                  rows, "---|--:|--:|--:|--:|--:|--:|---|--:")


def expectations_block() -> str:
    from decoder_audit.gate import CHECKS

    rows = [[f"`{c.name}`", c.title, c.expects, f"`{_module_path(c.run)}`"]
            for c in CHECKS.values()]
    return _table(["check", "what it compares", "where its expectation comes from",
                   "where it lives"], rows)


def _module_path(function: Callable) -> str:
    """src/decoder_audit/gate/checks/invariance.py for a check function of that module."""
    return "src/" + function.__module__.replace(".", "/") + ".py"


def _source(source) -> str:
    if isinstance(source, str):
        return f"`{source}`"
    if isinstance(source, tuple):
        return " or ".join(f"`{name}`" for name in source)
    return f"`{source.__name__.strip('_')}()`"


def _changes(family) -> str:
    """What an entry of the families table changes relative to Llama's block, from its data."""
    parts = [f"{name}={value!r}" for name, value in family.fixes().items()
             if (name, value) not in (("norm", "rmsnorm"), ("pos", "rope"))]
    parts += [f"{name} from {_source(source)}" for name, source in family.read.items()]
    acts = ", ".join(f"{name}: {ours}" for name, ours in family.activations.items())
    if family.activation and dict(family.activations) != {"silu": "swiglu"}:  # () : fixed mlp
        parts.append(f"activation ({', '.join(family.activation)}) {acts}")
    parts += [flag for flag, on in (("partial rotary", family.partial_rotary),
                                    ("no window", not family.windows),
                                    ("heads D / H, no grouped keys", not family.grouped)) if on]
    if family.experts:
        parts.append(f"experts: {family.experts}")
    if family.refused:
        parts.append("refused: " + ", ".join(f"`{r[0]}`" for r in family.refused))
    return "; ".join(parts) or "Llama's block"


def families_block() -> str:
    from decoder_audit.references.families import FAMILIES

    rows = [[f"`{f.model_type}`", f"`{f.model_class}`",
             {"llama": "Llama", "gpt2": "GPT-2"}.get(f.block, f.block), _changes(f)]
            for f in FAMILIES]
    return _table(["family", "class", "block", "what it changes"], rows)


def black_box_block() -> str:
    from decoder_audit.references.family_black_box import BLACK_BOX

    lacks: dict[str, list[str]] = {}
    for model_type, why in BLACK_BOX.items():
        lacks.setdefault(why, []).append(f"`{model_type}`")
    return _table(["families", "what no DecoderConfig expresses"],
                  [[", ".join(names), why] for why, names in lacks.items()])


BLOCKS: dict[str, Callable[[], str]] = {
    "checks": checks_block, "expectations": expectations_block, "config": config_block,
    "commands": commands_block, "sources": sources_block, "layouts": layouts_block,
    "presets": presets_block, "families": families_block, "black-box": black_box_block,
}


def regenerate(text: str) -> str:
    """`text` with every generated block rewritten; an unknown block name is an error."""
    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"<!-- generated: {name} -->: no such block (known: "
                             f"{', '.join(BLOCKS)})")
        return match.group(1) + BLOCKS[name]() + match.group(4)

    return BLOCK.sub(fill, text)


def stale_pages(pages=PAGES) -> list[str]:
    """The pages whose generated blocks differ from what the code writes now."""
    return [str(page.relative_to(ROOT)) for page in pages
            if regenerate(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    stale = stale_pages()
    if args.check:
        for page in stale:
            print(f"stale: {page} (run python docs/generate.py)")
        return 1 if stale else 0
    for page in PAGES:
        text = page.read_text()
        new = regenerate(text)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
