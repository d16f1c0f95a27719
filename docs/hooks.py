"""MkDocs hooks (mkdocs.yml `hooks:`): the site's home page is the repository's README.md, its
links to `docs/PAGE.md` made relative to the site (where the pages lie at the top), so the
README and the home page are one text."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parents[1] / "README.md"


def home_page(readme: str) -> str:
    """The README as the site's index.md: `](docs/x.md` links become `](x.md`."""
    return re.sub(r"\]\(docs/", "](", readme)


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=home_page(README.read_text())))
    return files
