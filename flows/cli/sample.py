"""``pileworks sample``: generate text from a checkpoint."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True, help="checkpoints folder or one tag folder in it")
    s.add_argument("--prompt", default="The")
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int, default=50)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=run_sample)


def run_sample(args: argparse.Namespace) -> int:
    from training.generate import generate

    print(
        generate(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    )
    return 0
