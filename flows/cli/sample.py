"""``pileworks sample``: generate text from a checkpoint, or convert it to a plain fp32 state dict."""

from __future__ import annotations

import argparse

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True, help="checkpoints folder or one tag folder in it")
    s.add_argument("--prompt", default="The", help="text to continue (default: 'The')")
    s.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    s.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    s.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens (default 50)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--manifest", default=None, help="take the tokenizer from this manifest instead")
    s.add_argument("--to-fp32", default=None, metavar="OUT.pt", help="write the fp32 state dict and stop")
    add_s3_arguments(s)
    s.set_defaults(func=run_sample)


def run_sample(args: argparse.Namespace) -> int:
    from training.generate import convert_to_fp32, generate

    if args.to_fp32:
        print(convert_to_fp32(args.checkpoint, args.to_fp32))
        return 0
    print(
        generate(
            args.checkpoint,
            args.prompt,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.seed,
            manifest_uri=args.manifest,
            s3=resolve_s3(args),
        )
    )
    return 0
