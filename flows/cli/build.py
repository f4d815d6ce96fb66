"""``pileworks build``: run the build_corpus flow and print the summary table."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli.s3_flags import add_s3_arguments, dotted_s3_overrides
from flows.runtime.local_server import Api
from pipeline.config import parse_overrides, split_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build a corpus: ingest, clean, dedup, tokenize, shard, publish")
    add_build_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.set_defaults(func=run, precheck=precheck)


def add_build_arguments(
    p: argparse.ArgumentParser,
    set_help: str = "override a corpus config field, e.g. dedup.near.threshold=0.7 (repeatable)",
) -> None:
    p.add_argument("--config", help="corpus YAML (default: the embedded pipeline/configs/corpus.yaml)")
    p.add_argument("--input", action="append", dest="inputs", help="input path/glob/URI (repeatable)")
    p.add_argument("--output", help="store root: a folder, file://, s3://, gs://, az:// or abfs[s]://")
    p.add_argument("--name", help="dataset name (default: the config's, `sample` for the bundled corpus)")
    add_set_argument(p, set_help)
    p.add_argument(
        "--task-runner",
        default="local",
        help="local (worker processes on this machine) | threads | dask://host:port (a Dask scheduler) | ray "
        "(a local Ray) | ray://host:port (a Ray cluster; pip install pileworks[ray])",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="worker processes for local (default: the cores)"
    )
    add_s3_arguments(p)


def add_set_argument(p: argparse.ArgumentParser, help: str, *aliases: str) -> None:
    """``--set KEY=VALUE``, the one override syntax of every command (read by ``pipeline.config``)."""
    p.add_argument("--set", *aliases, action="append", default=[], dest="set", metavar="KEY=VALUE", help=help)


def corpus_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` values, then the S3 flags (which win) as ``s3.<field>`` overrides of the corpus config."""
    return parse_overrides(args.set) | dotted_s3_overrides(args)


def corpus_and_train_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """``run``/``serve``: ``--set train.KEY=VALUE`` (and the hidden ``--train-set KEY=VALUE``) go to the training
    config, the other ``--set`` values and the S3 flags (which win) to the corpus config."""
    train, corpus = split_overrides(parse_overrides(args.set), "train")
    train.update(parse_overrides(getattr(args, "train_set", None) or []))
    return corpus | dotted_s3_overrides(args), train


def precheck(args: argparse.Namespace) -> None:
    from flows.cli.precheck import check_build
    from flows.runtime import profile
    from pipeline.storage.retry import STATS

    profile.COMMAND_STORAGE0 = STATS.snapshot()  # the build's S3 calls count from here (listing, lease)
    if local_workers(args) >= 2:
        one_thread_before_numpy()
    try:
        check_build(args.config, args.inputs, args.output, args.name, corpus_overrides(args))
    except BaseException:
        restore_env()  # the command ends here
        raise
    args.abandon = abandon  # what the command undoes when it ends before :func:`run` (no Prefect API, say)
    if local_workers(args):  # the first pass starts now, while the command imports Prefect and finds its API
        from flows.build import head_start
        from flows.runtime.local_server import check_environment_api

        check_environment_api()  # a dead API fails in one line before any work
        head_start.start(flow_parameters(args), local_workers(args))


def abandon() -> None:
    """A build that ends before or during :func:`run`: its head start's queued calls dropped (not waited for),
    its listing and its workers' env forgotten."""
    from flows.build import head_start
    from flows.build.inputs import forget_listing

    head_start.close(wait=False)
    forget_listing()
    restore_env()


def local_workers(args: argparse.Namespace) -> int:
    """The local worker processes a build of ``args`` may start (0: another task runner)."""
    from flows.runtime.pool import cores

    return (args.workers or cores()) if args.task_runner in ("local", "process") else 0


_ADDED_ENV: list[str] = []  # the names one_thread_before_numpy set, taken out when the command ends


def restore_env() -> None:
    """Take out what :func:`one_thread_before_numpy` set, and where :func:`precheck` started the build's S3
    count (a later command in this process starts clean)."""
    import os

    from flows.runtime import profile

    profile.COMMAND_STORAGE0 = None
    for name in _ADDED_ENV:
        os.environ.pop(name, None)
    _ADDED_ENV.clear()


def one_thread_before_numpy() -> None:
    """One BLAS thread (``OMP_NUM_THREADS=1``, as ``flows.runtime.pool.ONE_THREAD`` says) in this process before
    numpy loads its BLAS, which reads it then: the head start forks the workers from here
    (``flows/build/head_start.py``), and each must start with one BLAS thread as the fork server's do. With two
    or more workers this process computes nothing itself. Only that name: the workers set the others when they
    start, and this process reads ``RAYON_NUM_THREADS`` as the user's choice of training threads."""
    import os

    from flows.runtime.pool import ONE_THREAD

    _ADDED_ENV[:] = [name for name in ("OMP_NUM_THREADS",) if name not in os.environ]
    os.environ.update({name: ONE_THREAD[name] for name in _ADDED_ENV})


def flow_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The build_corpus flow's parameters from the command line."""
    return {
        "config_path": args.config,
        "inputs": args.inputs,
        "output": args.output,
        "name": args.name,
        "overrides": corpus_overrides(args),
    }


def run(args: argparse.Namespace) -> int:
    from flows.build import head_start
    from flows.build.inputs import forget_listing

    parameters = flow_parameters(args)
    try:
        summary = unchanged_before_flow(args.api, parameters)
        if summary is None:
            summary = run_flow(args, parameters)  # on the head start :func:`precheck` made, if any
    except BaseException:
        head_start.close(wait=False)  # Ctrl-C or a failure: no waiting on the head start's queued calls
        raise
    finally:
        head_start.close()  # a pool the flow did not adopt stops once its calls finish
        forget_listing()  # a listing the flow did not take is not for a later command in this process
        restore_env()  # nor the one-thread BLAS env of its workers, nor where its S3 count started
    if not args.json:
        print_summary(summary)
    finish_build(summary, args.json)
    return 0


def unchanged_before_flow(api: Api, parameters: dict[str, Any]) -> dict[str, Any] | None:
    """A rebuild whose dataset is published, found and recorded through Prefect's client before the flow engine
    starts (about one CPU-second instead of three); None: run the flow (something changed, the config reads
    files only a full build checks, or the API did not take the run: the flow records it, slower but the same)."""
    import logging
    import time

    from flows.build.unchanged import find_published, nothing_changed_line, record_unchanged
    from flows.runtime.profile import BuildProfile
    from flows.runtime.recorded_run import RunNotRecorded
    from pipeline.errors import StorageError

    log = logging.getLogger("pileworks")
    started, build_profile = time.perf_counter(), BuildProfile()
    try:
        found = find_published(parameters, build_profile)
    except (StorageError, OSError) as exc:  # the flow retries its listing and reports what failed, in its run
        log.info("could not look for a published dataset before the flow (%s)", exc)
        return None
    if found is None:
        return None
    try:
        summary = record_unchanged(api.url, parameters, found, build_profile, started)
    except RunNotRecorded as exc:
        log.info("recording the run through the Prefect API failed (%s); running the flow instead", exc)
        return None
    log.info("%s", nothing_changed_line(summary))
    summary["flow_run_url"] = api.run_url(summary["lineage"]["prefect_flow_run_id"])
    return summary


def run_flow(args: argparse.Namespace, parameters: dict[str, Any]) -> dict[str, Any]:
    from flows.build.flow import build_corpus
    from flows.cli.report import flow_run_outcome
    from flows.runtime import shutdown
    from flows.runtime.runners import prefect_api, with_task_runner

    shutdown.freeze_for_the_command()  # Prefect and the flow are imported: fewer objects for each collection
    flow = with_task_runner(build_corpus, args.task_runner, args.workers)
    with prefect_api():  # one API for the flow and every worker
        state = flow(**parameters, return_state=True)
    summary, run_id = flow_run_outcome(state)
    summary["flow_run_url"] = args.api.run_url(run_id)
    return dict(summary)


def dataset_folder(manifest_uri: str) -> str:
    return manifest_uri.rsplit("/", 1)[0]


def build_next_commands(summary: dict[str, Any]) -> list[str]:
    from flows.cli.report import command

    manifest = summary["manifest_uri"]
    return [
        command("train", "--manifest", manifest),
        command("inspect", "dedup", dataset_folder(manifest)),
    ]


def finish_build(summary: dict[str, Any], as_json: bool) -> None:
    from flows.cli.report import finish

    said = "published dataset"
    if summary.get("nothing_changed"):
        said = "nothing changed: dataset"
    elif summary.get("reused"):  # the inputs changed, the content did not: the published dataset is the build
        said = "inputs changed, same content: reused dataset"
    lines = [
        f"{said} {summary['name']} {summary['dataset_id']} "
        f"({summary['docs_out']} documents, {sum(summary['tokens'].values()):,} tokens)",
        f"  manifest  {summary['manifest_uri']}",
    ]
    if summary.get("flow_run_url"):
        lines.append(f"  run       {summary['flow_run_url']}")
    finish(summary, lines, build_next_commands(summary), as_json)


def print_summary(summary: dict[str, Any]) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    from flows.ui.build_artifacts import stage_rows

    # Not a terminal: wide enough for the table; the values that must be copied whole are printed as plain lines.
    console = Console() if sys.stdout.isatty() else Console(width=120)
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
        ("seconds", summary["seconds"]),
    ):
        totals.add_row(label, str(value))
    console.print(totals)
