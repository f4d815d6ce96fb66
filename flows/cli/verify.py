"""``pileworks verify``: check a store's published datasets (and, with ``--work``, its build units) byte for byte.

Exit 0 when all is intact, 1 when something is damaged (each damaged object on its own line, with what repairs
it), so a scheduled rebuild or a cron job can run it before trusting a store.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="check published datasets (and build units) against their sha256 records"
    )
    p.add_argument(
        "target",
        help="a store root, a dataset folder or its manifest.json, or datasets/<name> (follows latest.json)",
    )
    p.add_argument(
        "--work", action="store_true", help="also check every build unit under work/ against its marker"
    )
    add_s3_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.verify import verify_target
    from pipeline.storage import open_store

    target = str(args.target).rstrip("/").removesuffix("/manifest.json")
    if "://" not in target and not Path(target).expanduser().exists():
        raise FileNotFoundError(f"{target}: no such folder (give a store root or a dataset folder)")
    report = verify_target(open_store(target, resolve_s3(args)), work=args.work)
    for damage in report.damage:
        print(damage.line())
    print(report.summary())
    return 0 if report.ok else 1
