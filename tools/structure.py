"""The package's structure as the layering rules see it: rooms (the top-level modules and
packages of decoder_audit), modules, import arrows, loops, arrows that point up a layer, long
functions, and long files.

    python tools/structure.py            # summary of src/decoder_audit
    python tools/structure.py --arrows   # every arrow too

Read by tests/test_structure.py, which holds the package to these rules:
  - the import graph has no cycle (type-only imports included);
  - a room imports only rooms of a lower layer (LAYERS), so no arrow points up or sideways;
  - nothing outside gate/ imports a gate module other than `decoder_audit.gate` itself;
  - no function longer than MAX_FUNCTION_LINES.
Files longer than LONG_FILE_LINES are listed as a line of the report, not a failure: a file is
split where a concept ends, never to get under a number.
Imports are read from the source text (every `import` statement, wherever it stands), not run.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "decoder_audit"
MAX_FUNCTION_LINES = 60
LONG_FILE_LINES = 400

# The rooms of the package, lowest layer first. A room may import rooms of lower layers only;
# rooms of one layer do not import each other. `__init__` is the package's public face.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "console"),
    ("config", "objective"),
    ("model", "generation"),
    ("storage", "accounting"),
    ("text",),
    ("references",),
    ("gate", "sources"),
    ("training", "testing"),
    ("cli", "integrations"),
    ("__init__",),
)


def room_of(module: str) -> str:
    """decoder_audit.gate.subject -> "gate"; decoder_audit -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(room: str) -> int | None:
    return next((i for i, rooms in enumerate(LAYERS) if room in rooms), None)


@dataclass
class Structure:
    files: dict[str, Path]  # module name -> file
    arrows: dict[str, set[str]] = field(default_factory=dict)  # module -> modules it imports

    def loops(self) -> list[list[str]]:
        """Every strongly connected group of two or more modules (Tarjan's algorithm)."""
        index, low, stack, on_stack, groups = {}, {}, [], set(), []

        def visit(node: str) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            on_stack.add(node)
            for nxt in sorted(self.arrows[node]):
                if nxt not in index:
                    visit(nxt)
                    low[node] = min(low[node], low[nxt])
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

        for node in sorted(self.arrows):
            if node not in index:
                visit(node)
        return groups

    def upward(self) -> list[str]:
        """Arrows that break the layer rules: into a room of the same or a higher layer, into a
        private gate module from outside gate/, and every module in a room LAYERS lacks."""
        bad = []
        for source, targets in sorted(self.arrows.items()):
            here = room_of(source)
            if layer_of(here) is None:
                bad.append(f"{source} is in room {here!r}, which no layer holds (tools/structure.py "
                           "LAYERS)")
                continue
            for target in sorted(targets):
                there = room_of(target)
                if there != here and (layer_of(there) is None
                                      or layer_of(there) >= layer_of(here)):
                    bad.append(f"{source} imports {target}: {there!r} is not below {here!r}")
                if (target.startswith(f"{PACKAGE}.gate.")
                        and not source.startswith(f"{PACKAGE}.gate")):
                    bad.append(f"{source} reaches into {target}")
        return bad

    def long_functions(self) -> list[str]:
        found = []
        for module, path in sorted(self.files.items()):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{path}:{node.lineno} {node.name}(): {length} lines "
                                     f"(limit {MAX_FUNCTION_LINES})")
        return found

    def long_files(self) -> list[str]:
        """Files over LONG_FILE_LINES: reported, never a failure (see the module docstring)."""
        found = []
        for module, path in sorted(self.files.items()):
            lines = path.read_text().count("\n")
            if lines > LONG_FILE_LINES:
                found.append(f"{path}: {lines} lines")
        return found

    def rooms(self) -> dict[str, list[str]]:
        """room -> its modules."""
        out: dict[str, list[str]] = {}
        for module in sorted(self.files):
            out.setdefault(room_of(module), []).append(module)
        return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement may refer to (the module and module.name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def read(src: Path) -> Structure:
    """The structure of the package under `src` (the folder holding `decoder_audit/`)."""
    files = {_module_name(p, src): p for p in sorted((src / PACKAGE).rglob("*.py"))}
    structure = Structure(files, {m: set() for m in files})
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            for name in _imported(node, module, is_package):
                parts = name.split(".")
                for k in range(len(parts), 0, -1):  # the longest prefix that is a module
                    target = ".".join(parts[:k])
                    if target in files:
                        # a package importing its own submodules, or a module its package,
                        # is containment, not an arrow between rooms
                        if (target != module and not target.startswith(module + ".")
                                and not module.startswith(target + ".")):
                            structure.arrows[module].add(target)
                        break
    return structure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    parser.add_argument("--arrows", action="store_true", help="list every import arrow")
    args = parser.parse_args(argv)
    structure = read(Path(args.src))
    n_arrows = sum(len(t) for t in structure.arrows.values())
    print(f"{len(structure.files)} modules, {n_arrows} import arrows")
    if args.arrows:
        for source, targets in sorted(structure.arrows.items()):
            for target in sorted(targets):
                print(f"  {source} -> {target}")
    problems = ([f"import loop: {' <-> '.join(g)}" for g in structure.loops()]
                + structure.upward() + structure.long_functions())
    for line in problems:
        print(line)
    top = [room for room, modules in structure.rooms().items() if modules == [f"{PACKAGE}.{room}"]
           or room == "__init__"]
    print(f"rooms: {len(structure.rooms())} ({len(top)} top-level modules, "
          f"{len(structure.rooms()) - len(top)} packages)")
    for line in structure.long_files():
        print(f"long file (over {LONG_FILE_LINES} lines, reported only): {line}")
    print(f"{len(structure.loops())} loops, {len(structure.upward())} arrows against the layers, "
          f"{len(structure.long_functions())} functions over {MAX_FUNCTION_LINES} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
