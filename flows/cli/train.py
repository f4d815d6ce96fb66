"""``pileworks train``: train on a published dataset with DeepSpeed (local ranks)."""

from __future__ import annotations

import argparse
import json

from flows.cli.build import add_set_argument
from pipeline.config import parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train on a published dataset with DeepSpeed (local ranks)")
    t.add_argument(
        "--manifest", required=True, help="manifest URI, dataset folder or datasets/<name> (follows latest)"
    )
    add_train_arguments(t)
    add_set_argument(t, "override a TrainConfig field, e.g. lr=1e-3 (repeatable)", "--train-set")
    t.add_argument(
        "--allow-dataset-change", action="store_true", help="resume a checkpoint made on another dataset"
    )
    t.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts after a rank failure")
    t.set_defaults(func=run_train)


def add_train_arguments(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    p.add_argument(config_flag, dest="train_config", help="train YAML (default: training/configs/tiny.yaml)")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")


def run_train(args: argparse.Namespace) -> int:
    from flows.train import train

    result = train(
        args.manifest, args.train_config, args.nproc, parse_overrides(args.set), args.timeout,
        args.allow_dataset_change, args.max_restarts,
    )  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=1))
    return 0
