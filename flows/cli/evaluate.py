"""``pileworks evaluate --checkpoint DIR [--data jsonl|manifest] [--task FILE ...] [--json]``: loss and
perplexity, and each task's scores with their 95% intervals, as text (or one JSON object) and artifacts."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def add_task_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="[NAME=]FILE",
        help="a downstream task file (.jsonl: multiple choice {query, choices, gold} or completion "
        "{context, continuation} / {text}); NAME defaults to the file stem; repeatable",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="loss, perplexity and task scores of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="checkpoints folder (newest verified tag) or one tag")
    p.add_argument(
        "--data",
        default=None,
        help='a .jsonl file ({"text": ...} per line), or a manifest URI / dataset folder (its valid split); '
        "default: the valid split of the checkpoint's own dataset",
    )
    add_task_argument(p)
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the training seq_len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default 8)")
    p.add_argument("--max-samples", type=int, default=None, help="evaluate at most this many windows")
    p.add_argument("--json", action="store_true", help="print every score as one JSON object on stdout")
    add_s3_arguments(p)
    p.set_defaults(func=run_evaluate, precheck=precheck_evaluate)


def precheck_evaluate(args: argparse.Namespace) -> None:
    """Before Prefect: every task file reads."""
    from training.tasks import read_tasks

    read_tasks(args.task)


def without_per_item(result: dict[str, Any]) -> dict[str, Any]:
    """The result as printed: each task's scores and intervals, not its per-item lists."""
    tasks = {n: {k: v for k, v in t.items() if k != "per_item"} for n, t in result.get("tasks", {}).items()}
    return result | ({"tasks": tasks} if tasks else {})


def evaluation_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        f"step {result['step']} of {result['checkpoint']}",
        f"  loss {result['loss']:.4f}  perplexity {result['perplexity']:.2f}  on {result['data']} "
        f"({result['tokens']:,} tokens)",
    ]
    for name, task in result.get("tasks", {}).items():
        cells = []
        for metric in ("acc", "acc_norm", "prob"):
            if metric in task:
                low, high = task[f"{metric}_interval"] or (float("nan"), float("nan"))
                cells.append(f"{metric} {task[metric]:.4f} [{low:.4f}, {high:.4f}]")
        if "perplexity" in task:
            cells.append(f"perplexity {task['perplexity']:.2f}")
        lines.append(f"  {name} ({task['kind']}, {task['items']} items): " + "  ".join(cells))
    if result.get("tasks"):
        lines.append("  [low, high]: 95% bootstrap interval over the task's items")
    return lines


def run_evaluate(args: argparse.Namespace) -> int:
    from flows.train.evaluate import evaluate

    result = evaluate(
        args.checkpoint,
        args.data,
        args.seq_len,
        args.batch_size,
        args.max_samples,
        resolve_s3(args).to_dict(),
        args.task,
    )
    if args.json:
        print(json.dumps(without_per_item(result), indent=1))
    else:
        print("\n".join(evaluation_lines(result)))
    return 0
