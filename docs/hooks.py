"""MkDocs hooks (mkdocs.yml `hooks:`): the site's home page is the repository's README.md, its
links to `docs/PAGE.md` made relative to the site (where the pages lie at the top), so the
README and the home page are one text.

The home page's code blocks wrap (the `wrap` class, docs/stylesheets/extra.css): the README's
verdict and install lines are longer than the column at 1280 px, and a block cut at its edge
reads as the whole line. The other pages keep one line per line, with a visible scrollbar:
their rich tables are drawn in box characters, which wrapping would tear apart."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
WRAP = "wrap"  # the class of a code block that wraps its long lines (extra.css)


def home_page(readme: str) -> str:
    """The README as the site's index.md: `](docs/x.md` links become `](x.md`, and each fenced
    block opens as ``` { .LANG .wrap } (superfences' attribute form; `text` when it names no
    language)."""
    lines, inside = [], False
    for line in re.sub(r"\]\(docs/", "](", readme).splitlines():
        fence = re.fullmatch(r"```(\w*)", line)
        if fence and not inside:
            line = f"``` {{ .{fence[1] or 'text'} .{WRAP} }}"
        inside ^= bool(fence)
        lines.append(line)
    return "\n".join(lines) + "\n"


def on_files(files, config):
    from mkdocs.structure.files import File  # only where mkdocs runs (the tests read the above)

    files.append(File.generated(config, "index.md", content=home_page(README.read_text())))
    return files
