"""``pileworks build``: run the build_corpus flow and print the summary table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.config import parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build a corpus: ingest, clean, dedup, tokenize, shard, publish")
    add_build_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def add_build_arguments(
    p: argparse.ArgumentParser,
    set_help: str = "override a corpus config field, e.g. dedup.near.threshold=0.7 (repeatable)",
) -> None:
    p.add_argument("--config", help="corpus YAML (default: the embedded flows/configs/corpus.yaml)")
    p.add_argument("--input", action="append", dest="inputs", help="input path/glob/URI (repeatable)")
    p.add_argument("--output", help="store root: a folder, file:// or s3://bucket/prefix")
    p.add_argument("--name", help="dataset name")
    add_set_argument(p, set_help)
    p.add_argument("--task-runner", default="local", help="local | process | dask | dask://host:port")


def add_set_argument(p: argparse.ArgumentParser, help: str, *aliases: str) -> None:
    """``--set KEY=VALUE``, the one override syntax of every command (read by ``pipeline.config``)."""
    p.add_argument("--set", *aliases, action="append", default=[], dest="set", metavar="KEY=VALUE", help=help)


def run(args: argparse.Namespace) -> int:
    from flows.corpus_config import load_corpus_config

    overrides = parse_overrides(args.set)
    # Fail in a second on a bad config or dataset name, before Prefect is imported and any part is computed.
    load_corpus_config(
        args.config, inputs=args.inputs, output=args.output, name=args.name, overrides=overrides
    )
    from flows.build import build_corpus
    from flows.runners import with_task_runner

    flow = with_task_runner(build_corpus, args.task_runner)
    summary = flow(
        config_path=args.config, inputs=args.inputs, output=args.output, name=args.name,
        overrides=overrides,
    )  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return 0


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from flows.artifacts import stage_rows

    console = Console()
    table = Table(title=f"pileworks build: {summary['name']}")
    rows = stage_rows(summary)
    for column in rows[0]:
        table.add_column(column, justify="left" if column in ("stage", "dropped") else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    totals = Table(show_header=False, box=None)
    for label, value in (
        ("documents in", summary["docs_in"]),
        ("MB in", round(summary["bytes_in"] / 1e6, 2)),
        ("quarantined", summary["quarantined"]),
        ("exact duplicates removed", summary["exact_duplicates"]),
        ("near duplicates removed", summary["near_duplicates"]),
        ("documents out", summary["docs_out"]),
        ("tokens", ", ".join(f"{k}={v:,}" for k, v in summary["tokens"].items())),
        ("shards", ", ".join(f"{k}={v}" for k, v in summary["shards"].items())),
        ("dataset id", summary["dataset_id"]),
        ("manifest", summary["manifest_uri"]),
        ("seconds", summary["seconds"]),
    ):
        totals.add_row(label, str(value))
    console.print(totals)
