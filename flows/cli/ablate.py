"""``pileworks ablate``: build variants of a corpus, train the same small model on each for the same tokens, and
compare their loss on your evaluation text (one table, printed and published as a Prefect artifact).

    pileworks ablate --base corpus.yaml --eval held_out.jsonl --tokens 2000000 --seeds 3 \\
        --task arc=arc_easy.jsonl --task lambada.jsonl \\
        --variant rules=clean.quality.enabled=true \\
        --variant clf50=clean.classifier.model=q.bin,clean.classifier.keep_fraction=0.5

Every metric comes with its 95% intervals and every difference to the base with a paired one; ``--json`` prints
the whole result as one JSON object.
"""

from __future__ import annotations

import argparse
import json

from flows.cli.build import add_set_argument
from flows.cli.evaluate import add_task_argument
from flows.cli.s3_flags import add_s3_arguments, dotted_s3_overrides
from pipeline.config import parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser(
        "ablate", help="train a small model on each corpus variant and compare eval losses and task scores"
    )
    a.add_argument("--base", default=None, help="the base corpus config (default: the embedded one)")
    a.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=k=v[,k=v]",
        help="a variant: the base with these overrides (NAME=--set k=v,... reads the same); repeatable",
    )
    a.add_argument("--eval", required=True, help="a .jsonl file of evaluation texts ({'text': ...} per line)")
    add_task_argument(a)
    budget = a.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--tokens", type=int, default=None, help="training tokens per run (equal tokens for every variant)"
    )
    budget.add_argument("--steps", type=int, default=None, help="optimiser steps per run (equal steps)")
    a.add_argument(
        "--seeds", type=int, default=3, help="training seeds per variant (default 3; 2+ give intervals)"
    )
    a.add_argument("--input", nargs="+", default=None, help="raw inputs (instead of the config's)")
    a.add_argument("--output", default=None, help="the store (default: the config's output)")
    add_set_argument(a, "override a base corpus config field (repeatable)")
    a.add_argument("--train-config", default=None, help="train YAML (default: training/configs/tiny.yaml)")
    a.add_argument(
        "--train-set", action="append", default=[], metavar="KEY=VALUE", help="a TrainConfig field"
    )
    a.add_argument("--nproc", type=int, default=1, help="training ranks per run (default 1)")
    a.add_argument("--workdir", default="runs/ablate", help="where each run's checkpoints go")
    a.add_argument(
        "--timeout", type=float, default=None, help="kill one training job after this many seconds"
    )
    a.add_argument("--json", action="store_true", help="print every row and score as one JSON object")
    add_s3_arguments(a)
    a.set_defaults(func=run_ablate, precheck=precheck_ablate)


def precheck_ablate(args: argparse.Namespace) -> None:
    """Before Prefect: the variants parse and their configs load, the evaluation file exists."""
    from flows.train.ablate import check_inputs
    from flows.train.ablate_plan import parse_variants

    if not args.variant:
        raise ValueError("give at least one --variant NAME=k=v to compare with the base")
    base = parse_overrides(args.set) | dotted_s3_overrides(args)
    check_inputs(args.base, base, parse_variants(args.variant), args.eval, args.task)


def run_ablate(args: argparse.Namespace) -> int:
    from flows.train.ablate import ablate
    from flows.train.ablate_plan import format_table

    result = ablate(
        eval_data=args.eval,
        tokens=args.tokens,
        variants=args.variant,
        base_config=args.base,
        base_overrides=parse_overrides(args.set) | dotted_s3_overrides(args),
        inputs=args.input,
        output=args.output,
        seeds=args.seeds,
        train_config=args.train_config,
        train_overrides=parse_overrides(args.train_set, flag="--train-set"),
        nproc=args.nproc,
        workdir=args.workdir,
        timeout_s=args.timeout,
        tasks=args.task,
        steps=args.steps,
    )
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1))
    else:
        print(format_table(result["rows"], result["budget_line"]))
    return 0
