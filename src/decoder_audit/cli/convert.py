"""`decoder-audit convert`: move weights between Hugging Face folders and our checkpoints.

    decoder-audit convert --from-hf HF_DIR --out CKPT_DIR
    decoder-audit convert --to-hf --checkpoint CKPT_DIR --out HF_DIR

Every conversion is proven before it is put in place: the result is written to a temporary
folder beside --out, loaded back from disk and its logits compared with the source's on a seeded
random batch that fills the whole context (float32; tolerance --tolerance, default 1e-4). Only
then does it replace --out; a failed check leaves --out as it was and nothing behind. --out is
never the source (nor inside it, nor around it), and an existing --out is replaced only if it is
an earlier output of the same kind whose every file is written again (a user's own file there
makes the command refuse).
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import torch

from ..console import console
from ..errors import ConfigError

CHECK_BATCH = 2


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert weights to and from Hugging Face (GPT-2, Llama)",
        description="Convert a Hugging Face GPT-2 or Llama folder (config.json + "
                    "model.safetensors, as save_pretrained writes it) into a decoder-audit "
                    "checkpoint, or a checkpoint into such a folder. The result is read back and "
                    "its logits compared with the source's before success is reported.")
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from-hf", metavar="HF_DIR",
                           help="Hugging Face folder to convert into a checkpoint")
    direction.add_argument("--to-hf", action="store_true",
                           help="convert --checkpoint DIR into a Hugging Face folder")
    parser.add_argument("--checkpoint", metavar="DIR", help="decoder-audit checkpoint (with --to-hf)")
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="folder to write (replaced atomically if it holds an earlier output "
                             "of the same kind and nothing else)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest accepted |logit difference| in the check (default 1e-4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the check's random ids")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run, _parser=parser)


def run(args) -> int:
    if args.to_hf and not args.checkpoint:
        args._parser.error("--to-hf needs --checkpoint DIR")
    if args.from_hf and args.checkpoint:
        args._parser.error("--checkpoint goes with --to-hf; --from-hf reads HF_DIR")
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise ConfigError(f"--tolerance={args.tolerance} must be a finite number > 0 (the largest "
                          "accepted |logit difference|)")
    source = args.from_hf or args.checkpoint
    _refuse_overlap(Path(source), Path(args.out))
    from ..checkpoint import checkpoint_folder, load_checkpoint, save_checkpoint
    from ..references.hf import (
        ATTN_IMPLEMENTATION,
        _transformers,
        export_changes,
        load_hf_folder,
        max_logit_difference,
        save_hf_folder,
    )

    try:
        tf = _transformers()
    except ImportError as exc:
        print(f"decoder-audit convert: error: {exc}", file=sys.stderr)
        return 2
    tf.utils.logging.disable_progress_bar()  # keep our output readable; the check is the evidence
    found: dict = {}

    def compare(ours, hf_model) -> None:
        """The check on the written result, before it replaces anything at --out."""
        hf_model = hf_model.to(torch.float32).eval()
        ours = ours.to(torch.float32)
        cfg = ours.config
        generator = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, cfg.vocab_size, (CHECK_BATCH, cfg.max_seq_len), generator=generator)
        diff = max_logit_difference(ours, hf_model, ids)
        found.update(ours=ours, hf_model=hf_model, ids=ids, diff=diff)
        if not diff <= args.tolerance:
            raise ConversionMismatch(diff)

    changes: list[str] = []
    tokenizer = None  # the Hugging Face folder's, kept with the checkpoint (--from-hf)
    try:
        if args.from_hf:
            decoder = load_hf_folder(args.from_hf)
            tokenizer = _hf_tokenizer(args.from_hf, decoder.config.vocab_size)
            hf_model = tf.AutoModelForCausalLM.from_pretrained(
                args.from_hf, attn_implementation=ATTN_IMPLEMENTATION)
            written = save_checkpoint(decoder, args.out,
                                      extra_files=tokenizer.folder_files() if tokenizer else None,
                                      check=lambda tmp: compare(load_checkpoint(tmp), hf_model))
            direction = "Hugging Face -> decoder-audit checkpoint"
        else:
            ours = load_checkpoint(checkpoint_folder(args.checkpoint))
            changes = export_changes(ours.config)

            def reread(tmp) -> None:
                compare(ours, tf.AutoModelForCausalLM.from_pretrained(
                    str(tmp), attn_implementation=ATTN_IMPLEMENTATION))

            with warnings.catch_warnings():  # the changes are printed below, once
                warnings.simplefilter("ignore", UserWarning)
                written = save_hf_folder(ours, args.out, check=reread)
            direction = "decoder-audit checkpoint -> Hugging Face"
    except ConversionMismatch as mismatch:
        print(f"decoder-audit convert: error: the converted model's logits differ from the "
              f"source's by max |diff| = {mismatch.diff:.3e} > --tolerance {args.tolerance:g}; "
              f"nothing was written to {args.out!r}", file=sys.stderr)
        return 1
    ours, hf_model, ids, diff = found["ours"], found["hf_model"], found["ids"], found["diff"]
    cfg = ours.config
    result = {
        "direction": direction, "source": str(source), "out": str(written),
        "hf_class": type(hf_model).__name__, "config": cfg.to_dict(),
        "parameters": ours.num_parameters(), "check_ids_shape": list(ids.shape),
        "max_abs_logit_difference": diff, "tolerance": args.tolerance, "passed": True,
        "changes": changes, "tokenizer": tokenizer.name if tokenizer is not None else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        out = console()
        out.print(f"{direction}: {source} -> {written}")
        if tokenizer is not None:
            out.print(f"tokenizer {tokenizer.name} kept with the checkpoint")
        out.print(f"{type(hf_model).__name__}, {ours.num_parameters():,} parameters, "
                  f"tie_embeddings={cfg.tie_embeddings}")
        for change in changes:
            out.print(f"[yellow]note[/yellow]: {change}")
        out.print(f"logits on random ids {tuple(ids.shape)} (float32): max |ours - HF| = "
                  f"{diff:.3e} (tolerance {args.tolerance:g}) [green]equal[/green]")
    return 0


class ConversionMismatch(Exception):
    """The written result's logits differ from the source's by more than the tolerance."""

    def __init__(self, diff: float) -> None:
        super().__init__(f"max |diff| = {diff}")
        self.diff = diff


def _refuse_overlap(source: Path, out: Path) -> None:
    """--out may not be the source, hold it, or lie inside it: writing there would replace or
    change what is being converted."""
    src, dst = source.resolve(), out.resolve()
    if dst == src or src.is_relative_to(dst) or dst.is_relative_to(src):
        raise ConfigError(f"--out {str(out)!r} overlaps the folder being converted "
                          f"({str(source)!r}); write the result to a separate folder")


def _hf_tokenizer(folder: str, vocab_size: int):
    """The tokenizer a Hugging Face folder holds (tokenizer.json, or vocab.json + merges.txt,
    with tokenizer_config.json and special_tokens_map.json), checked to fit the model's V; None
    when it holds none. Its files are saved beside the checkpoint's weights."""
    from ..tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer is not None:
        tokenizer.check_fits(vocab_size, f"the model in {folder!r}")
    return tokenizer
