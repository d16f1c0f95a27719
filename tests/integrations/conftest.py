"""The integrations' tests share the tiny models, tokenizer and data of zoo_integrations.py
(beside this file)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
