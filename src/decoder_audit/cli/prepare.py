"""`decoder-audit prepare`: encode text files into a token dataset that `train --data` streams.

    decoder-audit prepare --text a.txt b.txt --tokenizer tokenizer.json --out data/ \
        [--val-fraction 0.1]

See `decoder_audit.text.datasets` for the folder it writes.
"""

from __future__ import annotations

import json

from ..console import console


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
    parser.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                        help="share of the tokens held out for evaluation (default 0.1)")
    parser.add_argument("--json", action="store_true", help="print the header as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..text.datasets import prepare_dataset

    header = prepare_dataset(args.text, args.tokenizer, args.out, val_fraction=args.val_fraction)
    if args.json:
        print(json.dumps(header, indent=2))
        return 0
    out = console()
    tok = header["tokenizer"]
    (a, b), (c, d) = header["splits"]["train"], header["splits"]["val"]
    n_train, n_val = b - a, d - c
    out.print(f"{args.out}: {header['tokens']:,} tokens ({header['dtype']}), train "
              f"{n_train:,} + held out {n_val:,}")
    out.print(f"tokenizer {tok['name']} (vocab_size {tok['vocab_size']}, eos_id "
              f"{tok['eos_id']}, sha256 {tok['sha256'][:12]})")
    for source in header["sources"]:
        note = "" if source["round_trip"] else "  [yellow]decoding does not give the text back[/]"
        out.print(f"  {source['path']}: {source['bytes']:,} bytes -> {source['tokens']:,} tokens"
                  f"{note}")
    return 0
