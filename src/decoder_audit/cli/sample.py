"""`decoder-audit sample`: continue a prompt with a trained checkpoint, greedy or sampled.

Runs `decoder_audit.generate` (the model's KV cache; --num-samples rows in one batch) and shows
a progress bar on stderr for long generations when stderr is a terminal."""

from __future__ import annotations

import json
import os
import sys
import time

from ..config import DecoderConfig
from .common import absolute, source_from_args, user_output_to_stderr
from . import values


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sample", help="continue a prompt with a trained checkpoint",
        description="Greedy (default) or temperature sampling, with optional top-k and top-p "
                    "filtering. Stops at <eos>, at the context limit (max_seq_len + 1 tokens in "
                    "all) or after --max-new-tokens. A prompt longer than max_seq_len is an "
                    "error, never cropped. Tiny-vocabulary models take space-separated tokens "
                    "('<bos> A'); byte-level models take text. stdout holds the samples alone, "
                    "one a line; how they were drawn (greedy, the new tokens, where each "
                    "stopped) goes to stderr.")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a checkpoint folder, or a training run folder holding checkpoint/ "
                             "(a model trained from FILE.py:FACTORY needs --model too)")
    parser.add_argument("--model", metavar="FILE.py:FACTORY",
                        help="the factory a --model run was trained from, which rebuilds its "
                             "module (a folder's own code is never run)")
    parser.add_argument("--prompt", required=True, help="e.g. '<bos> A'")
    parser.add_argument("--temperature", type=values.non_negative("0: greedy"), default=0.0,
                        help="0 (default) is greedy; T > 0 samples from softmax(logits / T)")
    parser.add_argument("--top-k", type=values.count(), metavar="K",
                        help="sample among the K most likely tokens only (needs --temperature)")
    parser.add_argument("--top-p", type=values.number(0.0, 1.0, low_open=True), metavar="P",
                        help="sample from the smallest set of most likely tokens holding "
                             "probability P (nucleus; needs --temperature)")
    parser.add_argument("--num-samples", type=values.count(), default=1, metavar="N",
                        help="N continuations of the prompt, generated as one batch (default 1)")
    parser.add_argument("--seed", type=values.seed, default=0, help="seed for temperature sampling")
    parser.add_argument("--max-new-tokens", type=values.count(), metavar="N",
                        help="stop after N new tokens (default: up to the context limit)")
    parser.add_argument("--tokenizer", metavar="T",
                        help="read the model's ids with T (bytes, tiny-vocab, a tokenizer.json, a "
                             "GPT-2 vocab.json or a folder holding one) instead of the tokenizer "
                             "the checkpoint carries")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..errors import ConfigError
    from ..generation.generate import generate
    from ..text.tokenizer import Tokenizer
    from ..training.state import TRAINER_FILE

    if args.tokenizer is not None and os.path.exists(args.tokenizer):
        args.tokenizer = absolute(args.tokenizer)  # before a factory's code can change directory
    folder, model, vocab_size, max_seq_len = _model(source_from_args(args))
    declared = None
    if (folder / TRAINER_FILE).is_file():
        declared = json.loads((folder / TRAINER_FILE).read_text()).get("tokenizer")
    tokenizer = Tokenizer.for_checkpoint(folder, vocab_size, declared=declared,
                                         override=args.tokenizer)
    try:
        prompt = tokenizer.encode(args.prompt)
    except ValueError as exc:  # a token outside the vocabulary
        print(f"decoder-audit sample: error: {exc}", file=sys.stderr)
        return 2
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples {args.num_samples} must be at least 1")
    budget = _budget(args, folder, max_seq_len, len(prompt))
    generator = torch.Generator().manual_seed(args.seed)
    # A Decoder's limit is its config's; another module's is the one its factory.json records.
    limit = {} if isinstance(getattr(model, "config", None), DecoderConfig) else {
        "max_seq_len": max_seq_len}
    with _Progress(budget) as on_token, user_output_to_stderr():
        result = generate(model, [prompt] * args.num_samples, max_new_tokens=budget,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          eos_id=tokenizer.eos_id, generator=generator, on_token=on_token,
                          **limit)
    samples = [{"ids": ids, "new_ids": new, "text": tokenizer.decode(ids), "stop": stop}
               for ids, new, stop in zip(result.ids, result.new_ids, result.stop)]
    if args.json:
        body = samples[0] if args.num_samples == 1 else {"samples": samples}
        print(json.dumps({"prompt": args.prompt, **body}))
        return 0
    mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}"
    mode += "".join(f", {name} {value}" for name, value in (("top-k", args.top_k),
                                                            ("top-p", args.top_p)) if value)
    mode += f", seed {args.seed}" if args.temperature else ""
    for i, sample in enumerate(samples):
        if args.num_samples > 1:
            print(f"[{i + 1}/{args.num_samples}] ", end="")
        print(sample["text"])
    # How the samples were drawn goes to stderr, beside the progress: stdout holds the samples
    # alone, for a script that reads them (`--json` has the same facts as fields).
    if args.num_samples == 1:
        count = len(samples[0]["new_ids"])
        print(f"({mode}; {count} new token{'' if count == 1 else 's'}; stopped at "
              f"{samples[0]['stop']})", file=sys.stderr)
    else:
        counts = ", ".join(str(len(sample["new_ids"])) for sample in samples)
        stops = ", ".join(sorted({sample["stop"] for sample in samples}))
        print(f"({mode}; {args.num_samples} samples; new tokens {counts}; stopped at {stops})",
              file=sys.stderr)
    return 0


def _budget(args, folder, max_seq_len: int | None, prompt_len: int) -> int:
    """The new tokens to generate: --max-new-tokens, else up to the context limit (max_seq_len
    + 1 ids in all); a prompt longer than max_seq_len is refused by generate, never cropped."""
    from ..errors import ConfigError

    if args.max_new_tokens is not None:
        return args.max_new_tokens
    if max_seq_len is None:
        raise ConfigError(f"the model in {str(folder)!r} has no hard length limit (its "
                          "factory.json records max_seq_len null), so there is no context limit "
                          "to stop at: give --max-new-tokens N")
    return max(1, max_seq_len + 1 - prompt_len)


def _model(source):
    """(the checkpoint folder, its model in eval mode, V, max_seq_len): a Decoder's from its
    config; a module trained with --model rebuilt by the factory named with --model, with the
    V and length limit its factory.json records (None: no hard limit)."""
    from ..errors import CheckpointError
    from ..sources import checkpoint_of

    folder, _ = checkpoint_of(source.value)
    with user_output_to_stderr():  # a factory's prints: stdout holds the samples only
        model = source.build().eval()
    cfg = getattr(model, "config", None)
    if isinstance(cfg, DecoderConfig):
        return folder, model, cfg.vocab_size, cfg.max_seq_len
    declared = source.declared()
    if not isinstance(declared.get("vocab_size"), int):
        raise CheckpointError(f"{str(folder)!r}: its factory.json records no vocab_size, which "
                              "sample needs to read the model's ids")
    return folder, model, declared["vocab_size"], declared.get("max_seq_len")


class _Progress:
    """A rich progress bar of new tokens on stderr, only when stderr is a terminal, shown once
    generation has run for a second (a short one prints nothing extra). Yields `on_token(n)`."""

    DELAY_S = 1.0

    def __init__(self, total: int) -> None:
        self.total, self.bar, self.task = total, None, None
        self.enabled = sys.stderr.isatty()

    def __enter__(self):
        if not self.enabled:
            return None
        started = time.perf_counter()

        def on_token(done: int) -> None:
            if self.bar is None and time.perf_counter() - started >= self.DELAY_S:
                self._start()
            if self.bar is not None:
                self.bar.update(self.task, completed=done)

        return on_token

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("sample: new tokens"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("", total=self.total)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
