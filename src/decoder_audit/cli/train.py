"""`decoder-audit train`: audit the model, refuse on any failure, train what passed.

Runs unchanged under `torchrun --nproc_per_node N --no-python decoder-audit train ...`
(DistributedDataParallel; rank 0 prints and writes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import helptext  # the checks its description names, from the gate's registry
from . import values
from ..console import console, literal
from ..errors import ConfigError
from .common import (
    absolute,
    add_model_source,
    flag_and_value,
    rerun_command,
    source_from_args,
)

DEFAULT_OUT = "runs/train"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="audit, then train (refuses a model that fails a check of the training "
                      "path)",
        description="Run the full gate on the model; if a check of the path training takes "
                    "fails, name the first and exit 1 without training or writing anything. "
                    f"Every check is on that path but {helptext.off_training_path()}, whose "
                    "failures affect only the paths named: they are reported and do not refuse "
                    "training (`decoder-audit verify` still fails on them). Otherwise train it: "
                    "by default the tiny model's counting task (<bos> x y z <eos>), or a "
                    "byte-level model on --text FILE (with --tokenizer T: its tokens), or on a "
                    "prepared token dataset (--data DIR). There is no option to train a model "
                    "that failed. A loss that becomes NaN or inf stops the run (exit 1) and "
                    "keeps the last good checkpoint; a run folder another run is writing is "
                    "refused (run.lock).")
    add_model_source(parser, foreign=True, intervention=True)
    parser.add_argument("--steps", type=values.count(), metavar="N", help="optimizer steps (default 400)")
    parser.add_argument("--seed", type=values.seed, metavar="S",
                        help="seeds the initialisation and the batches (default 0)")
    parser.add_argument("--batch-size", type=values.count(), metavar="B",
                        help="global batch, all processes together (default 64)")
    parser.add_argument("--lr", type=values.positive(),
                        help="peak learning rate (default 3e-2; 3e-3 with --text)")
    parser.add_argument("--warmup", type=values.count(0), metavar="N", help="linear warmup steps (default 20)")
    parser.add_argument("--weight-decay", type=values.non_negative(), metavar="WD",
                        help="AdamW decay on matrices (default 0.1)")
    parser.add_argument("--decay-embeddings", action="store_true", default=None,
                        help="also decay embeddings (and a tied readout)")
    parser.add_argument("--grad-clip", type=values.non_negative("0: off"), metavar="NORM",
                        help="clip the gradient norm (default 1.0; 0 = off)")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--text", metavar="FILE", help="train a byte-level model (V >= 256) on FILE")
    data.add_argument("--data", metavar="DIR",
                      help="train on a token dataset written by `decoder-audit prepare` (V >= "
                           "its tokenizer's ids); the checkpoint carries the tokenizer")
    parser.add_argument("--tokenizer", metavar="T",
                        help="with --text: encode FILE with this tokenizer (a tokenizer.json, or "
                             "a folder with GPT-2's vocab.json + merges.txt) instead of bytes; "
                             "the checkpoint carries it")
    _add_step_options(parser)
    _add_run_options(parser)
    parser.set_defaults(func=run)


def _add_run_options(parser) -> None:
    """Where the run writes and how it is carried out (none of these changes its result)."""
    parser.add_argument("--out", metavar="DIR", help="run folder: metrics.jsonl, loss_curve.png, "
                                                     f"checkpoint/ (default {DEFAULT_OUT})")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the run saved in DIR (a run of a --model: with --model "
                             "FILE.py:FACTORY again, the factory it was trained from)")
    parser.add_argument("--save-every", type=values.count(0), metavar="N",
                        help="checkpoint every N steps too (default: only at the end; a resumed "
                             "run keeps its own)")
    parser.add_argument("--eval-every", type=values.count(), metavar="N",
                        help="evaluation loss every N steps (default 50; a resumed run keeps its "
                             "own)")
    parser.add_argument("--device", help="cpu (default), cuda, cuda:N or auto (a resumed run "
                                          "keeps its own)")
    parser.add_argument("--threads", type=values.threads, metavar="N",
                        help="CPU threads (default: 1 for models under 1M parameters, whose ops "
                             "are too small to split, else torch's default; a resumed run keeps "
                             "its own)")
    parser.add_argument("--shard", action="store_true",
                        help="FSDP2: each process holds 1/N of the weights, gradients and AdamW "
                             "state (run under torchrun; a sharded run's checkpoint resumes "
                             "with or without --shard)")
    parser.add_argument("--pack", action="store_true", default=None,
                        help="pack documents: split each window at the tokenizer's end-of-"
                             "sequence id, each document read alone (positions restart, a "
                             "document mask); the gate proves the model's packing first")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing: recompute each block's activations in "
                             "backward (less memory, the same gradients; the gate proves it first)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_step_options(parser) -> None:
    """How each step runs: accumulation, precision, compilation, and the MFU's peak."""
    parser.add_argument("--grad-accum", type=values.count(), metavar="N",
                        help="split each step's batch into N micro-batches (the same update as "
                             "the whole batch at once, in 1/N of the activation memory; "
                             "--batch-size must be divisible by N; default 1)")
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        help="bf16: forward and loss under bfloat16 autocast, float32 weights "
                             "and AdamW state (default fp32)")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="torch.compile the model for the training steps")
    parser.add_argument("--peak-flops", type=values.positive(), metavar="FLOPS",
                        help="peak FLOP/s for the final MFU (default: a measured matmul ceiling "
                             "on the device)")


# CLI flag -> TrainConfig field, for the flags that define the run.
_OPTIONS = ("steps", "seed", "batch_size", "lr", "warmup", "weight_decay", "decay_embeddings",
            "grad_clip", "text", "data", "tokenizer", "grad_accum", "precision", "compile",
            "pack")


def run(args) -> int:
    from ..errors import LeakageSuspected, TrainingDiverged
    from ..training import GateRefusal, train

    if args.intervention_len is not None and args.intervention_len < 1:
        raise ConfigError(f"--intervention-len={args.intervention_len} must be >= 1")
    from ..training.settings import TrainConfig

    warning = values.warmup_warning(args, default_steps=TrainConfig().steps)
    if warning and int(os.environ.get("RANK", "0")) == 0:
        print(f"decoder-audit train: warning: {warning}", file=sys.stderr)
    _absolute_paths(args)  # before a --model's code runs: an os.chdir in it moves nothing
    options = {name: getattr(args, name) for name in _OPTIONS if getattr(args, name) is not None}
    source_given = any(getattr(args, f, None) for f in ("preset", "config", "checkpoint"))
    if args.resume:
        if source_given:
            print("decoder-audit train: error: --resume loads the model from its checkpoint; "
                  "drop --preset/--config/--checkpoint", file=sys.stderr)
            return 2
        # A --model run's factory is named again, never read off the run folder.
        model = source_from_args(args) if args.model else None
    else:
        if args.checkpoint:
            _refuse_module_checkpoint(args.checkpoint)
        # The source itself, not a built module: the trainer builds it after locking the run
        # folder and checking it fits, and saves a --model factory's reference with its weights.
        model = source_from_args(args)
    # resuming writes into its own run folder
    out = args.out or (None if args.resume else absolute(DEFAULT_OUT))
    try:
        train(
            model, out=out, resume=args.resume,
            save_every=args.save_every, eval_every=args.eval_every, device=args.device,
            progress=not args.no_progress, expect_fresh=not args.checkpoint, shard=args.shard,
            vocab_size=args.vocab_size, max_seq_len=args.max_seq_len,
            intervention_len=args.intervention_len,
            threads=args.threads if args.threads is not None else "auto",
            peak_flops=args.peak_flops, checkpointing=args.checkpointing,
            return_model=False, **options)  # the model is in the run folder's checkpoint
    except GateRefusal as refusal:
        _print_refusal(refusal, args)
        return 1
    except (TrainingDiverged, LeakageSuspected) as diverged:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"decoder-audit train: error: {diverged}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _print_interrupted(out or args.resume)
        return 130
    except BaseException as exc:
        if getattr(exc, "said_by_another_rank", False) and not args.debug:
            from . import USER_ERRORS  # rank 0 says the failure every rank shares: once

            return 2 if isinstance(exc, USER_ERRORS) else 1
        raise
    return 0


def _absolute_paths(args) -> None:
    """The paths the run reads and writes, absolute against the directory the command started
    in. A --tokenizer is a path only when it names one (else a built-in name: bytes, tiny-vocab)."""
    for name in ("out", "resume", "text", "data"):
        setattr(args, name, absolute(getattr(args, name)))
    if args.tokenizer is not None and os.path.exists(args.tokenizer):
        args.tokenizer = absolute(args.tokenizer)


def _refuse_module_checkpoint(path: str) -> None:
    """train --checkpoint starts a new run from a Decoder's weights. A module trained with
    --model (factory.json) is continued with --resume; a Hugging Face folder is refused by
    `checkpoint_of`, naming what it is."""
    from ..sources import checkpoint_of
    from ..storage.checkpoint import CHECKPOINT_DIR

    folder, factory = checkpoint_of(path)
    if factory is not None:
        run = folder.parent if folder.name == CHECKPOINT_DIR else folder
        raise ConfigError(
            f"{str(folder)!r} holds the weights of a module trained with --model (factory.json: "
            f"{factory.get('factory')!r}), not a Decoder checkpoint: continue its run with "
            f"`decoder-audit train --resume {run} --model FILE.py:FACTORY` (the factory it was "
            "trained from), or start a new one with --model FILE.py:FACTORY")


def _print_refusal(refusal, args) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    out = console()
    out.print(f"[bold red]training refused[/bold red]: check [bold]{refusal.check}[/bold] failed")
    out.print(f"  {literal(refusal.detail)}")
    checks = getattr(refusal.report, "checks", [])
    failed = [c for c in checks if not c.passed and not c.skipped]
    if len(failed) > 1:
        out.print(f"  other failed checks: {', '.join(c.name for c in failed[1:])}")
    if any(c.name == refusal.check for c in checks):  # a gate check: verify shows it
        out.print("Nothing was trained and no checkpoint was written. Fix the model and rerun; "
                  f"`{literal(rerun_command('verify', args))}` shows the full evidence.")
        return
    # train's own check (the loss before training), after a gate that passed: verify passes
    # this model, and only train, on the same model, seed and task, measures it again.
    task = [part for name in ("seed", "batch_size", "text", "data", "tokenizer",
                              "intervention_len") if getattr(args, name, None) is not None
            for part in flag_and_value(name, getattr(args, name))]
    out.print("Nothing was trained and no checkpoint was written. The gate passed (`decoder-audit "
              "verify` passes this model too): this is train's own check, before the first "
              f"step; `{literal(rerun_command('train', args, *task))}` measures it again.")


def _print_interrupted(out: str) -> None:
    import warnings

    from ..errors import CheckpointError
    from ..storage.checkpoint import CHECKPOINT_DIR, resolve_checkpoint_dir
    from ..training.state import TRAINER_FILE

    if int(os.environ.get("RANK", "0")) != 0:
        return
    checkpoint = Path(out) / CHECKPOINT_DIR
    try:  # checkpoint/ itself, or the newest complete copy a save stopped mid-swap left
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the line below says where it is
            folder = resolve_checkpoint_dir(checkpoint)
    except CheckpointError:
        folder = None
    if folder is not None and (folder / TRAINER_FILE).is_file():
        step = json.loads((folder / TRAINER_FILE).read_text())["step"]
        where = "" if folder == checkpoint else (
            f" (in {str(folder)!r}, where the interrupted save left it; --resume takes it)")
        print(f"\ninterrupted; the last checkpoint is at step {step}{where}: continue with "
              f"`decoder-audit train --resume {out}`", file=sys.stderr)
    else:
        print("\ninterrupted before the first checkpoint; nothing to resume", file=sys.stderr)
