"""`decoder-audit prepare`: encode text files into a token dataset that `train --data` streams.

    decoder-audit prepare --text a.txt b.txt --tokenizer tokenizer.json --out data/ \
        [--val-fraction 0.1]

See `decoder_audit.text.datasets` for the folder it writes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..console import console, literal
from ..errors import ConfigError
from .common import tokenizer_said
from . import values


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="encode text files into a token dataset for train --data",
        description="Encode UTF-8 text files with a tokenizer into DIR: tokens.bin (raw "
                    "little-endian uint16, or uint32 when the vocabulary exceeds 65536 ids), "
                    "dataset.json (dtype, token count, the train and held-out ranges, the "
                    "tokenizer's name and SHA-256, each source file's SHA-256) and the "
                    "tokenizer's files. The last --val-fraction of the tokens are held out. "
                    "DIR is written atomically and only replaces an earlier dataset.")
    parser.add_argument("--text", nargs="+", required=True, metavar="FILE",
                        help="UTF-8 text files, encoded in this order (each ends with the "
                             "tokenizer's end-of-sequence id, if it has one)")
    parser.add_argument("--tokenizer", required=True, metavar="T",
                        help="bytes, tiny-vocab, a tokenizer.json, a GPT-2 vocab.json (with "
                             "merges.txt beside it), or a folder holding one (a checkpoint, a "
                             "training run, a prepared dataset, a Hugging Face model folder)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the dataset folder")
    parser.add_argument("--val-fraction", type=values.number(0.0, 1.0, low_open=True, high_open=True), default=0.1, metavar="F",
                        help="share of the tokens held out for evaluation (default 0.1)")
    parser.add_argument("--json", action="store_true", help="print the header as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..text.datasets import prepare_dataset

    refuse_duplicates(args.text)
    header = prepare_dataset(args.text, args.tokenizer, args.out, val_fraction=args.val_fraction)
    if args.json:
        print(json.dumps(header, indent=2))
        return 0
    out = console()
    tok = header["tokenizer"]
    (a, b), (c, d) = header["splits"]["train"], header["splits"]["val"]
    n_train, n_val = b - a, d - c
    # paths and the tokenizer's name are the user's: `literal`, so brackets print as they are
    out.print(f"{literal(args.out)}: {header['tokens']:,} tokens ({header['dtype']}), train "
              f"{n_train:,} + held out {n_val:,}")
    # the file the user named (its Tokenizer.name keeps only the file's name, after its kind)
    named = f"{tok['kind']}:{args.tokenizer}" if os.path.exists(args.tokenizer) else tok["name"]
    said = literal(tokenizer_said(tok["kind"], named))
    out.print(f"tokenizer {said} (vocab_size {tok['vocab_size']}, eos_id {tok['eos_id']}, "
              f"sha256 {tok['sha256'][:12]})")
    for source in header["sources"]:
        note = "" if source["round_trip"] else "  [yellow]decoding does not give the text back[/]"
        out.print(f"  {literal(source['path'])}: {source['bytes']:,} bytes -> "
                  f"{source['tokens']:,} tokens{note}")
    return 0


def refuse_duplicates(texts: list[str]) -> None:
    """ConfigError naming both files when two --text files are one file (the same resolved path)
    or hold the same bytes (the same SHA-256): the tokens go in order and the last ones are held
    out, so a repeated file would make the held-out split a copy of training text."""
    seen: dict[Path, str] = {}
    for text in texts:
        path = Path(text).resolve()
        if path in seen:
            raise ConfigError(f"--text {text!r} and {seen[path]!r} are the same file "
                              f"({str(path)!r}); give each file once")
        seen[path] = text
    by_size: dict[int, list[str]] = {}
    for path, text in seen.items():
        if path.is_file():  # a missing file is prepare_dataset's to name
            by_size.setdefault(path.stat().st_size, []).append(text)
    digests: dict[str, str] = {}
    for same_size in (group for group in by_size.values() if len(group) > 1):
        for text in same_size:  # only files of equal size can hold the same bytes
            with open(text, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            if digest in digests:
                raise ConfigError(f"--text {text!r} and {digests[digest]!r} hold the same bytes "
                                  f"(SHA-256 {digest[:16]}...); give each text once, or the "
                                  "held-out split repeats training text")
            digests[digest] = text
