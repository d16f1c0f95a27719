"""`decoder-audit sample`: continue a prompt with a trained checkpoint, greedy or sampled."""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sample", help="continue a prompt with a trained checkpoint",
        description="Greedy (default) or temperature sampling. Stops at <eos>, at the context "
                    "limit (max_seq_len + 1 tokens in all) or after --max-new-tokens. A prompt "
                    "longer than max_seq_len is an error, never cropped. Tiny-vocabulary models "
                    "take space-separated tokens ('<bos> A'); byte-level models take text.")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a checkpoint folder, or a training run folder holding checkpoint/")
    parser.add_argument("--prompt", required=True, help="e.g. '<bos> A'")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 (default) is greedy; T > 0 samples from softmax(logits / T)")
    parser.add_argument("--seed", type=int, default=0, help="seed for temperature sampling")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="stop after N new tokens")
    parser.add_argument("--tokenizer", metavar="T",
                        help="read the model's ids with T (bytes, tiny-vocab, a tokenizer.json, a "
                             "GPT-2 vocab.json or a folder holding one) instead of the tokenizer "
                             "the checkpoint carries")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..checkpoint import checkpoint_folder, load_checkpoint
    from ..sample import Tokenizer, generate
    from ..training import TRAINER_FILE

    folder = checkpoint_folder(args.checkpoint)
    model = load_checkpoint(folder).eval()
    cfg = model.config
    declared = None
    if (folder / TRAINER_FILE).is_file():
        declared = json.loads((folder / TRAINER_FILE).read_text()).get("tokenizer")
    tokenizer = Tokenizer.for_checkpoint(folder, cfg.vocab_size, declared=declared,
                                         override=args.tokenizer)
    try:
        prompt = tokenizer.encode(args.prompt)
    except ValueError as exc:  # a token outside the vocabulary
        print(f"decoder-audit sample: error: {exc}", file=sys.stderr)
        return 2
    generator = torch.Generator().manual_seed(args.seed)
    result = generate(model, prompt, max_seq_len=cfg.max_seq_len, eos_id=tokenizer.eos_id,
                      temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      generator=generator)
    if args.json:
        print(json.dumps({"prompt": args.prompt, "ids": result.ids, "new_ids": result.new_ids,
                          "text": tokenizer.decode(result.ids), "stop": result.stop}))
        return 0
    mode = ("greedy" if args.temperature == 0
            else f"temperature {args.temperature}, seed {args.seed}")
    print(tokenizer.decode(result.ids))
    print(f"({mode}; {len(result.new_ids)} new tokens; stopped at {result.stop})")
    return 0
