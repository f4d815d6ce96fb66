"""``pileworks reap``: mark flow runs whose process died ``Crashed`` (once, or every N seconds with ``--watch``)."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reap",
        help="mark Running flow runs without a recent heartbeat (or whose process is gone) Crashed",
        description="Finds Running flow runs on the Prefect server at PREFECT_API_URL whose heartbeat is older than "
        "--max-age seconds, that never beat and started longer ago than that, or whose process on this host is "
        "gone, and sets them Crashed with the reason in the state message.",
    )
    p.add_argument(
        "--max-age",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="heartbeat age after which a run counts as dead (default 120; keep it several intervals)",
    )
    p.add_argument(
        "--watch", type=float, default=None, metavar="SECONDS", help="repeat every SECONDS until Ctrl-C"
    )
    p.add_argument(
        "--flow",
        action="append",
        dest="flows",
        metavar="NAME",
        help="only runs of this flow (repeatable), e.g. --flow build_corpus --flow train",
    )
    p.add_argument("--dry-run", action="store_true", help="list the zombie runs, change nothing")
    p.set_defaults(func=run, precheck=precheck)


def precheck(args: argparse.Namespace) -> None:
    from flows.cli.precheck import UsageError

    if args.watch is not None and args.watch <= 0:
        raise UsageError(f"--watch must be > 0 seconds, got {args.watch}")


def run(args: argparse.Namespace) -> int:
    from flows.runtime.reaper import reap

    try:
        while True:
            reaped = reap(args.max_age, dry_run=args.dry_run, flow_names=args.flows)
            verb = "would mark" if args.dry_run else "marked"
            print(
                f"{verb} {len(reaped)} flow run(s) Crashed" + (": " + ", ".join(reaped) if reaped else ""),
                flush=True,
            )
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:  # the way to stop --watch
        return 0
