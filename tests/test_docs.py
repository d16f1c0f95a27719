"""The docs say what the code does: each generated table is what `docs/generate.py` writes from
the code now, and the facts in them hold against the code by another route (the parser
accepting a flag, a fresh DecoderConfig's values, `--help` as printed); every repository path,
test name and link a page names exists; the example outputs are what the code prints; every
distribution the test extra installs is pinned in constraints.txt at the installed version."""

from __future__ import annotations

import ast
import importlib.util
import re
from importlib import metadata
from pathlib import Path

import pytest

import decoder_audit as da
from decoder_audit.cli import build_parser, main
from decoder_audit.gate import CHECKS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(page: str, block: str) -> list[list[str]]:
    """The body rows of the generated table `block` of docs/`page`, as cells."""
    text = (DOCS / page).read_text()
    body = text[text.index(f"<!-- generated: {block} -->"):text.index(f"<!-- end: {block} -->")]
    rows = [line for line in body.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def _help(argv: list[str], capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


def test_every_generated_table_is_what_the_code_writes_now():
    assert _generator().stale_pages() == [], "run python docs/generate.py"


# ---- the facts of the tables, by another route ----------------------------------------------

# What each command needs besides a model source, so that its parser gets as far as the flags.
REQUIRED = {"sample": ["--checkpoint", "d", "--prompt", "x"], "convert": ["--to-hf", "--out", "o"],
            "prepare": ["--text", "t.txt", "--tokenizer", "bytes", "--out", "o"]}


def _accepts(command: str, flag: str) -> bool:
    """Whether `decoder-audit COMMAND FLAG VALUE` gets past argparse's check of the names."""
    parser = build_parser()
    _, unknown = parser.parse_known_args([command, *REQUIRED.get(command, []), flag, "x"])
    return flag not in unknown


def test_the_sources_table_is_what_each_command_accepts():
    flags = ("--preset", "--config", "--checkpoint", "--hf", "--model")
    rows = {row[0].strip("`"): row[1:] for row in _table("commands.md", "sources")}
    for command in build_parser()._subparsers._group_actions[0].choices:
        accepted = [_accepts(command, flag) for flag in flags]
        if not any(accepted):
            assert command not in rows, command
            continue
        assert [cell != "-" for cell in rows[command]] == accepted, command
    assert rows["sample"][flags.index("--checkpoint")] == "required"  # it has no default model
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["sample", "--prompt", "x"])


def test_the_config_table_is_a_fresh_configs_fields_and_defaults():
    cfg = da.DecoderConfig(vocab_size=8, d_model=4, n_layers=1, n_heads=1, d_ff=8, max_seq_len=4)
    rows = _table("python.md", "config")
    assert [row[0].strip("`") for row in rows] == list(vars(cfg)), "every field, in order"
    for name, _, default, meaning in rows:
        name = name.strip("`")
        if default != "required":
            assert ast.literal_eval(default.strip("`")) == getattr(cfg, name), name
        assert meaning, f"{name} has no attribute docstring in config.py"


def test_verify_help_names_every_check_of_the_registry(capsys, monkeypatch):
    text = _help(["verify", "--help"], capsys, monkeypatch)
    for name, check in CHECKS.items():
        assert re.search(rf"^\s+{name}\s+{re.escape(check.title)}", text, re.M), name


def test_train_help_names_as_not_refused_exactly_the_checks_off_trainings_path(capsys,
                                                                                monkeypatch):
    """tests/training/test_train.py holds the behaviour (a kv_cache failure fails verify and
    trains); the help names the checks of that kind, read from the registry's paths."""
    text = _help(["train", "--help"], capsys, monkeypatch)
    description = text[text.index("Run the full gate"):].split("\n\n")[0]  # not the options'
    named = {name for name in CHECKS if re.search(rf"(?<![-\w]){name}\b", description)}
    assert named == {name for name, c in CHECKS.items() if "training" not in c.paths} != set()


def test_verify_help_names_every_layout_a_spec_is_found_in(capsys, monkeypatch):
    from decoder_audit.references.layout_table import LAYOUTS

    text = _help(["verify", "--help"], capsys, monkeypatch)
    spec_help = re.search(r"^\s+--spec CONFIG.json\s+(.*)$", text, re.M)[1]
    for layout in LAYOUTS:
        assert layout.name in spec_help, layout.name
    assert [row[0] for row in _table("gate.md", "layouts")] == [l.name for l in LAYOUTS]


def test_the_pages_that_speak_of_the_families_read_as_a_spec_point_to_their_table():
    """The families are listed once, in docs/families.md (generated from the table); a page that
    speaks of them links there instead of keeping a list of its own that could drift."""
    for name in ("gate.md", "foreign-models.md", "defects.md"):
        assert "(families.md)" in (ROOT / "docs" / name).read_text(), name


def test_the_checks_table_is_the_registry_in_diagnosis_order():
    rows = _table("gate.md", "checks")
    assert [row[1].strip("`") for row in rows] == list(CHECKS)
    for row in rows:
        assert row[4].split(", ") == list(CHECKS[row[1].strip("`")].paths)


def test_the_presets_table_counts_are_the_ledgers():
    rows = {row[0].strip("`"): row for row in _table("commands.md", "presets")}
    assert sorted(rows) == sorted(da.preset_names())
    for name, row in rows.items():
        assert int(row[-1].replace(",", "")) == da.parameter_ledger(da.preset(name)).total, name


# ---- what the pages name exists -------------------------------------------------------------

REPO_PATH = re.compile(r"`((?:src|tests|benchmarks|tools|examples|docs)/[\w./-]+?)(?:::(\w+))?`")


def test_every_repository_path_and_test_a_page_names_exists():
    missing = []
    for page in PAGES:
        for path, test in REPO_PATH.findall(page.read_text()):
            target = ROOT / path
            if not target.exists():
                missing.append(f"{page.name}: {path}")
            elif test and not re.search(rf"^def {test}\(", target.read_text(), re.M):
                missing.append(f"{page.name}: {path}::{test}")
    assert missing == []


def test_every_install_command_a_page_shows_goes_through_the_constraints():
    unpinned = [f"{page.name}: {line.strip()}"
                for page in [*PAGES, ROOT / "benchmarks" / "README.md"]
                for line in page.read_text().splitlines()
                if re.search(r"pip install (?!.*-c constraints\.txt)", line)]
    assert unpinned == []


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (toc's slugify: lower case, punctuation dropped)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a shell comment is no heading
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}


def test_every_relative_link_resolves_with_its_anchor():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


# ---- the site (mkdocs.yml, docs/hooks.py, docs/stylesheets) ---------------------------------

def test_the_sites_nav_names_each_page_as_the_readmes_list_does():
    """Issue 44: integrations.md was "The trainers people use" in the nav and "The gate where
    people train" in the README's list of the pages."""
    listed = dict((page, label) for label, page in
                  re.findall(r"^- \[(.+?)\]\(docs/([\w-]+\.md)\)", _readme(), re.M))
    nav = {page: label for label, page in
           re.findall(r"^\s+- (.+?): ([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)}
    assert len(listed) >= 15
    assert {page: nav.get(page) for page in listed} == listed


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_the_home_pages_code_blocks_wrap_and_table_names_stay_whole():
    """Issue 44: at 1280 px the home page's blocks were cut at the column's edge, and check
    names broke mid-word in docs/gate.md's table (Material breaks code anywhere). The home page
    (the README through docs/hooks.py) marks each block to wrap; the site's stylesheet wraps
    those and keeps code in a table cell on one line."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    readme, home = _readme(), hooks.home_page(_readme())
    opened = re.findall(r"^```(.*)$", home, re.M)[::2]  # every other fence opens a block
    assert len(opened) == len(re.findall(r"^```", readme, re.M)) // 2 >= 4
    assert all(re.fullmatch(rf"\s*{{ \.\w+ \.{hooks.WRAP} }}", fence) for fence in opened), opened
    assert "](docs/" not in home and home.count("](") == readme.count("](")
    config = (ROOT / "mkdocs.yml").read_text()
    css_path = re.search(r"^extra_css:.*\n\s+- (\S+)$", config, re.M)[1]
    css = " ".join((DOCS / css_path).read_text().split())
    assert re.search(rf"\.{hooks.WRAP} pre > code {{[^}}]*white-space: pre-wrap", css)
    assert re.search(r"td code {[^}]*white-space: nowrap", css)


# ---- example outputs and figures ------------------------------------------------------------

def test_the_python_example_runs_as_written(tmp_path, monkeypatch):
    page = (DOCS / "python.md").read_text()
    code = page[page.index("```python\n") + 10:]
    code = code[:code.index("```")]
    monkeypatch.chdir(tmp_path)  # it saves a checkpoint into ckpt/
    scope: dict = {}
    exec(compile(code, "docs/python.md", "exec"), scope)
    assert scope["da"].parameter_ledger(scope["cfg"]).total == 368  # as its comment says
    assert scope["logits"].shape == (1, 4, 8) and scope["report"].passed
    assert [len(row) for row in scope["gen"].ids] == [5, 4]  # 2 + 3 and 1 + 3 ids


def test_the_assert_decoder_example_is_the_message(capsys):
    from zoo_foreign import V, ToyLM

    from decoder_audit.testing import assert_decoder

    page = (DOCS / "foreign-models.md").read_text()
    block = page[page.index("```\nToyLM (black-box") + 4:]
    block = block[:block.index("```")]
    with pytest.raises(AssertionError) as raised:
        assert_decoder(ToyLM(leak_from=2), vocab_size=V, max_seq_len=None, intervention_len=12)
    message = str(raised.value).splitlines()
    shown = block.splitlines()
    assert shown[0] == message[0]
    assert [line for line in shown if line.startswith("- ")] == \
        [line for line in message if line.startswith("- ")]


def test_the_accounting_examples_are_what_account_prints(capsys):
    """Every `$ decoder-audit account ...` block of docs/accounting.md, run analytic only: each
    line shown is in what it prints (the meta-device measurement's lines aside: the figure it
    confirms is the analytic one, `tests/accounting/` holds them equal)."""
    import shlex

    text = (DOCS / "accounting.md").read_text()
    blocks = re.findall(r"```\n(\$ decoder-audit account.*?)```", text, re.S)
    assert len(blocks) >= 5
    for block in blocks:
        for run in re.split(r"^(?=\$ )", block, flags=re.M)[1:]:
            command, _, shown = run.partition("\n")
            assert main([*shlex.split(command)[2:], "--no-measure"]) == 0, command
            printed = " ".join(capsys.readouterr().out.split())
            for line in shown.splitlines():
                line = " ".join(line.split())
                if line and line != "..." and not line.startswith(("measured", "by op")):
                    assert line in printed, (command, line)


def test_the_tiny_ledger_sentence_is_the_ledgers():
    found = re.search(r"token embedding (\d+), positions (\d+), two blocks of \(norms (\d+) \+ "
                      r"attention (\d+) \+ MLP (\d+)\) = (\d+), final norm (\d+), tied readout "
                      r"(\d+), total (\d+)", " ".join((DOCS / "commands.md").read_text().split()))
    rows = {row.name: row.count for row in da.parameter_ledger(da.preset("tiny-368")).rows}
    expected = (rows["token_embeddings"], rows["position_embeddings"], rows["layers.0.norms"],
                rows["layers.0.attn"], rows["layers.0.ffn"],
                sum(n for name, n in rows.items() if name.startswith("layers.")),
                rows["ln_final"], rows["lm_head"], sum(rows.values()))
    assert tuple(map(int, found.groups())) == expected


def test_the_gate_pages_conformance_figures_are_the_conformance_pages():
    conformance = (DOCS / "conformance.md").read_text()
    total, built, passed, failed = map(int, re.search(
        r"\*\*(\d+) families: (\d+) built, (\d+) pass, (\d+) fail", conformance).groups())
    not_built = int(re.search(r"(\d+) not built", conformance)[1])
    oracle = int(re.search(r"oracle and the parameter ledger ran on (\d+) families",
                           conformance)[1])
    gate = " ".join((DOCS / "gate.md").read_text().split())
    assert f"({total} families in transformers" in gate
    assert f"{built} built, {passed} pass, {failed} fail" in gate
    assert f"{not_built} could not be built tiny" in gate and f"run on the {oracle} whose" in gate


# ---- the pinned versions --------------------------------------------------------------------

def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {_normal(name): version for name, version in
            (line.split("==") for line in lines if line and not line.startswith("#"))}


def _installed_closure(extras: tuple[str, ...]) -> dict[str, str]:
    """{name: installed version} of decoder-audit's requirements with `extras`, and theirs, as
    far as they are installed (a requirement whose marker does not hold here is not)."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    todo = [(r, extras) for r in metadata.requires("decoder-audit") or []]
    while todo:
        requirement, wanted = todo.pop()
        req = Requirement(requirement)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted or ("",)):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # an optional extra of a dependency this environment does not have
        if _normal(req.name) in found and not req.extras:
            continue
        found[_normal(req.name)] = dist.version
        todo += [(r, tuple(req.extras)) for r in dist.requires or []]
    return found


def test_every_distribution_the_extras_install_is_pinned_at_its_version():
    """The test extra's closure (the dev and docs extras' too, as far as they are installed)."""
    pins = _pins()
    assert next(iter(pins)) == "torch", "torch==... stays the first pin"
    installed = _installed_closure(("test", "dev", "docs"))
    assert {"transformers", "transformer-lens", "pytest"} <= set(installed)
    unpinned = sorted(set(installed) - set(pins))
    assert unpinned == [], "pin them in constraints.txt (a fresh install's pip freeze)"
    from packaging.version import Version

    differ = {name: (version, pins[name]) for name, version in installed.items()
              if Version(version).public.split("+")[0] != pins[name]}
    assert differ == {}, "installed (version, pin): reinstall with -c constraints.txt"
