"""``pileworks serve``: serve the scheduled ``build_corpus`` deployment and the ``prepare_and_train`` deployment."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli.build import add_set_argument, corpus_and_train_overrides
from flows.cli.s3_flags import add_s3_arguments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve deployments: scheduled corpus rebuilds and one-click prepare-and-train"
    )
    p.add_argument("--cron", default="0 3 * * *", help="rebuild schedule (cron, default daily 03:00)")
    p.add_argument("--timezone", default="UTC", help="time zone of the cron schedule (default UTC)")
    p.add_argument("--config", help="corpus YAML for the scheduled rebuild (default: the embedded one)")
    p.add_argument("--output", help="store root for the scheduled rebuild")
    p.add_argument("--train-config", help="train YAML for prepare_and_train")
    add_set_argument(
        p, "override a config field: dedup.near.threshold=0.7 (corpus) or train.lr=1e-3 (training)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the deployments and exit")
    add_s3_arguments(p)
    p.set_defaults(func=run)


def build_deployments(args: argparse.Namespace) -> list[Any]:
    from prefect.schedules import Cron

    from flows.build.flow import build_corpus
    from flows.train.flow import prepare_and_train
    from pipeline.corpus_config import load_corpus_config

    overrides, train_overrides = corpus_and_train_overrides(args)
    # fail now, not at 3 a.m., on a bad config
    load_corpus_config(args.config, output=args.output, overrides=overrides)
    rebuild = build_corpus.to_deployment(
        name="scheduled-rebuild",
        schedule=Cron(args.cron, timezone=args.timezone),
        parameters={"config_path": args.config, "output": args.output, "overrides": overrides},
        description="Rebuild the corpus on a schedule; only changed inputs are reprocessed.",
        tags=["pileworks", "corpus"],
    )
    one_click = prepare_and_train.to_deployment(
        name="one-click",
        parameters={
            "corpus_config": args.config,
            "train_config": args.train_config,
            "output": args.output,
            "corpus_overrides": overrides,
            "train_overrides": train_overrides,
        },
        description="Prepare the corpus and train on it.",
        tags=["pileworks", "training"],
    )
    return [rebuild, one_click]


def run(args: argparse.Namespace) -> int:
    deployments = build_deployments(args)
    if args.dry_run:
        for d in deployments:
            schedules = [str(getattr(s, "schedule", s)) for s in (d.schedules or [])]
            print(f"{d.flow_name}/{d.name}: parameters={d.parameters} schedules={schedules}")
        return 0
    from prefect import serve

    serve(*deployments)
    return 0
