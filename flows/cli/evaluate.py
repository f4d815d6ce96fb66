"""``pileworks evaluate --checkpoint DIR [--data jsonl|manifest]``: loss and perplexity as JSON and an artifact."""

from __future__ import annotations

import argparse
import json

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="loss and perplexity of a checkpoint (valid split or a JSONL file)")
    p.add_argument("--checkpoint", required=True, help="checkpoints folder (newest verified tag) or one tag")
    p.add_argument(
        "--data",
        default=None,
        help='a .jsonl file ({"text": ...} per line), or a manifest URI / dataset folder (its valid split); '
        "default: the valid split of the checkpoint's own dataset",
    )
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the training seq_len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default 8)")
    p.add_argument("--max-samples", type=int, default=None, help="evaluate at most this many windows")
    add_s3_arguments(p)
    p.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    from flows.train.evaluate import evaluate

    result = evaluate(
        args.checkpoint,
        args.data,
        args.seq_len,
        args.batch_size,
        args.max_samples,
        resolve_s3(args).to_dict(),
    )
    print(json.dumps(result, indent=1))
    return 0
