"""`decoder-audit convert`: move weights between Hugging Face folders and our checkpoints.

    decoder-audit convert --from-hf HF_DIR --out CKPT_DIR
    decoder-audit convert --to-hf --checkpoint CKPT_DIR --out HF_DIR
    decoder-audit convert --to-safetensors --checkpoint SHARDED_DIR --out CKPT_DIR

--to-safetensors turns a sharded checkpoint (a `train --shard` run's, storage/sharded.py) into
an unsharded one (one model.safetensors), streamed one tensor at a time: the whole model is
never held. --to-hf reads a sharded checkpoint too, whole (the logit check needs the model).

Every conversion is proven before it is put in place: the result is written to a temporary
folder beside --out, loaded back from disk and its logits compared with the source's on a seeded
random batch that fills the whole context (float32; tolerance --tolerance, default 1e-4). Only
then does it replace --out; a failed check leaves --out as it was and nothing behind. --out is
never the source (nor inside it, nor around it), and an existing --out is replaced only if it is
an earlier output of the same kind whose every file is written again (a user's own file there
makes the command refuse).

The tokenizer travels with the weights: --from-hf keeps the folder's tokenizer with the
checkpoint; --to-hf writes the checkpoint's in the files Hugging Face reads (tokenizer.json, or
vocab.json + merges.txt, and tokenizer_config.json: references/hf_tokenizer.py), and the check
also loads it with AutoTokenizer, which must read a probe text as ours does.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..console import console, literal
from ..errors import ConfigError
from . import values
from .common import hf_folder, tokenizer_said

CHECK_BATCH = 2


def register(subparsers) -> None:
    families = hf_families()
    listed = ", ".join(f"{model_type} ({name})" for model_type, name in families.items())
    parser = subparsers.add_parser(
        "convert", help=f"convert weights to and from Hugging Face ({len(families)} families)",
        description="Convert a Hugging Face folder (config.json + model.safetensors, as "
                    "save_pretrained writes it) into a decoder-audit checkpoint, or a checkpoint "
                    "into such a folder. The result is read back and its logits compared with "
                    f"the source's before success is reported. --from-hf reads {len(families)} "
                    f"families, by model_type: {listed}. --to-hf writes GPT2LMHeadModel or "
                    "LlamaForCausalLM where their configs hold the checkpoint's, else the first "
                    "of these families whose config holds it exactly.")
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from-hf", metavar="HF_DIR",
                           help="Hugging Face folder to convert into a checkpoint")
    direction.add_argument("--to-hf", action="store_true",
                           help="convert --checkpoint DIR into a Hugging Face folder")
    direction.add_argument("--to-safetensors", action="store_true",
                           help="export the sharded checkpoint --checkpoint DIR as one "
                                "model.safetensors, one tensor at a time")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="decoder-audit checkpoint (with --to-hf or --to-safetensors)")
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="folder to write (replaced atomically if it holds an earlier output "
                             "of the same kind and nothing else)")
    parser.add_argument("--tolerance", type=values.positive(), default=1e-4,
                        help="largest accepted |logit difference| in the check (default 1e-4)")
    parser.add_argument("--seed", type=values.seed, default=0, help="seed of the check's random ids")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run, _parser=parser)


def hf_families() -> dict[str, str]:
    """model_type -> the Hugging Face class the converter reads it with: the families table
    itself (`references.families.FAMILIES`), so the help cannot drift from it; read without
    importing transformers (seconds, on every --help)."""
    from ..references.families import FAMILIES

    return {family.model_type: family.model_class for family in FAMILIES}


def run(args) -> int:
    _check_arguments(args)
    if args.to_safetensors:
        return _to_safetensors(args)
    from ..references.hf_config import _transformers
    from ..references.hf_tokenizer import TokenizerMismatch

    try:
        tf = _transformers()
    except ImportError as exc:
        print(f"decoder-audit convert: error: {exc}", file=sys.stderr)
        return 2
    tf.utils.logging.disable_progress_bar()  # keep our output readable; the check is the evidence
    check = _LogitCheck(args.seed, args.tolerance)
    try:
        done = _from_hf(args, tf, check) if args.from_hf else _to_hf(args, tf, check)
    except (ConversionMismatch, TokenizerMismatch) as mismatch:
        why = (f"the converted model's logits differ from the source's by max |diff| = "
               f"{mismatch.diff:.3e} > --tolerance {args.tolerance:g}"
               if isinstance(mismatch, ConversionMismatch)
               else "the tokenizer written for Hugging Face does not read text as ours: "
                    f"{mismatch}")
        print(f"decoder-audit convert: error: {why}; nothing was written to {args.out!r}",
              file=sys.stderr)
        return 1
    _report(args, done, check)
    return 0


def _check_arguments(args) -> None:
    if (args.to_hf or args.to_safetensors) and not args.checkpoint:
        args._parser.error(f"--{'to-hf' if args.to_hf else 'to-safetensors'} needs "
                           "--checkpoint DIR")
    if args.from_hf and args.checkpoint:
        args._parser.error("--checkpoint goes with --to-hf; --from-hf reads HF_DIR")
    if args.from_hf:
        hf_folder("--from-hf", args.from_hf)  # a Hub id, a missing folder: said first
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise ConfigError(f"--tolerance={args.tolerance} must be a finite number > 0 (the largest "
                          "accepted |logit difference|)")
    _refuse_overlap(Path(args.from_hf or args.checkpoint), Path(args.out))


@dataclass
class _Converted:
    direction: str
    written: Path
    changes: list[str]  # what the user should know: config fields the export changed, ...
    tokenizer: Any  # the Tokenizer carried over, or None


class _LogitCheck:
    """The check on the written result, before it replaces anything at --out: logits of ours and
    of Hugging Face's model on seeded random ids (B, max_seq_len), in float32."""

    def __init__(self, seed: int, tolerance: float) -> None:
        self.seed, self.tolerance = seed, tolerance
        self.ours = self.hf_model = self.ids = self.diff = None

    def __call__(self, ours, hf_model) -> None:
        from ..references.hf import max_logit_difference

        self.hf_model = hf_model.to(torch.float32).eval()
        self.ours = ours.to(torch.float32)
        cfg = self.ours.config
        generator = torch.Generator().manual_seed(self.seed)
        self.ids = torch.randint(0, cfg.vocab_size, (CHECK_BATCH, cfg.max_seq_len),
                                 generator=generator)  # (B, T)
        self.diff = max_logit_difference(self.ours, self.hf_model, self.ids)
        if not self.diff <= self.tolerance:
            raise ConversionMismatch(self.diff)


def _from_hf(args, tf, check: _LogitCheck) -> _Converted:
    """The Hugging Face folder as a checkpoint, its tokenizer kept with it."""
    from ..references.hf import load_hf_folder
    from ..references.hf_config import ATTN_IMPLEMENTATION
    from ..storage.checkpoint import load_checkpoint, save_checkpoint

    decoder = load_hf_folder(args.from_hf)
    tokenizer = _hf_tokenizer(args.from_hf, decoder.config.vocab_size)
    hf_model = tf.AutoModelForCausalLM.from_pretrained(
        args.from_hf, attn_implementation=ATTN_IMPLEMENTATION, trust_remote_code=False,
        local_files_only=True)
    written = save_checkpoint(decoder, args.out,
                              extra_files=tokenizer.folder_files() if tokenizer else None,
                              check=lambda tmp: check(load_checkpoint(tmp), hf_model))
    return _Converted("Hugging Face -> decoder-audit checkpoint", written, [], tokenizer)


def _to_hf(args, tf, check: _LogitCheck) -> _Converted:
    """The checkpoint as a Hugging Face folder, with its tokenizer's files where it has one;
    the check reads both back as Hugging Face would."""
    from ..references.hf import export_changes, save_hf_folder
    from ..references.hf_config import ATTN_IMPLEMENTATION
    from ..references.hf_tokenizer import check_hf_tokenizer, hf_tokenizer_files
    from ..storage.checkpoint import checkpoint_folder, load_checkpoint

    folder = checkpoint_folder(args.checkpoint)
    ours = load_checkpoint(folder)
    changes = export_changes(ours.config)
    tokenizer = _hf_tokenizer(folder, ours.config.vocab_size)
    files, why_not = hf_tokenizer_files(tokenizer) if tokenizer is not None else ({}, None)
    if why_not is not None:
        changes.append(why_not)
        tokenizer = None

    def reread(tmp) -> None:
        check(ours, tf.AutoModelForCausalLM.from_pretrained(
            str(tmp), attn_implementation=ATTN_IMPLEMENTATION, trust_remote_code=False,
            local_files_only=True))
        if tokenizer is not None:
            check_hf_tokenizer(tmp, tokenizer, tf)

    with warnings.catch_warnings():  # the changes are printed below, once
        warnings.simplefilter("ignore", UserWarning)
        written = save_hf_folder(ours, args.out, check=reread, extra_files=files)
    return _Converted("decoder-audit checkpoint -> Hugging Face", written, changes, tokenizer)


def _to_safetensors(args) -> int:
    """A sharded checkpoint as one model.safetensors beside its config.json (and tokenizer),
    streamed; the written file is read back against its digests before it is put in place."""
    from ..storage.checkpoint import checkpoint_folder, read_config
    from ..storage.sharded import export_safetensors, is_sharded_checkpoint

    folder = checkpoint_folder(args.checkpoint)
    if not is_sharded_checkpoint(folder):
        raise ConfigError(f"--to-safetensors exports a sharded checkpoint; {str(folder)!r} "
                          "already holds its weights in one model.safetensors")
    cfg = read_config(folder)
    tokenizer = _hf_tokenizer(folder, cfg.vocab_size)
    written = export_safetensors(folder, args.out,
                                 extra_files=tokenizer.folder_files() if tokenizer else None)
    if args.json:
        print(json.dumps({"direction": "sharded checkpoint -> safetensors",
                          "source": str(args.checkpoint), "out": str(written),
                          "config": cfg.to_dict(), "passed": True}, indent=2))
    else:
        console().print(f"sharded checkpoint -> safetensors: {literal(args.checkpoint)} -> "
                        f"{literal(written)} (every tensor read back against its SHA-256)")
    return 0


def _report(args, done: _Converted, check: _LogitCheck) -> None:
    ours, hf_model, cfg = check.ours, check.hf_model, check.ours.config
    tokenizer = done.tokenizer.name if done.tokenizer is not None else None
    if args.json:
        print(json.dumps({
            "direction": done.direction, "source": str(args.from_hf or args.checkpoint),
            "out": str(done.written), "hf_class": type(hf_model).__name__,
            "config": cfg.to_dict(), "parameters": ours.num_parameters(),
            "check_ids_shape": list(check.ids.shape), "max_abs_logit_difference": check.diff,
            "tolerance": args.tolerance, "passed": True, "changes": done.changes,
            "tokenizer": tokenizer}, indent=2))
        return
    out = console()
    # folders, the tokenizer's name and the notes (which quote config values) are the user's
    out.print(f"{done.direction}: {literal(args.from_hf or args.checkpoint)} -> "
              f"{literal(done.written)}")
    if tokenizer is not None:
        said = literal(tokenizer_said(done.tokenizer.kind, tokenizer))
        out.print(f"tokenizer {said} kept with the checkpoint" if args.from_hf else
                  f"tokenizer {said} written for Hugging Face (AutoTokenizer reads the probe "
                  "text as ours)")
    out.print(f"{type(hf_model).__name__}, {ours.num_parameters():,} parameters, "
              f"tie_embeddings={cfg.tie_embeddings}")
    for change in done.changes:
        out.print(f"[yellow]note[/yellow]: {literal(change)}")
    out.print(f"logits on random ids {tuple(check.ids.shape)} (float32): max |ours - HF| = "
              f"{check.diff:.3e} (tolerance {args.tolerance:g}) [green]equal[/green]")


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


def _hf_tokenizer(folder: str | Path, vocab_size: int):
    """The tokenizer a folder holds (a Hugging Face folder: tokenizer.json, or vocab.json +
    merges.txt, with tokenizer_config.json and special_tokens_map.json; a checkpoint: its
    manifest), checked to fit the model's V; None when it holds none."""
    from ..text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer is not None:
        tokenizer.check_fits(vocab_size, f"the model in {folder!r}")
    return tokenizer
