"""The ``pileworks`` command line.

Each subcommand lives in its own ``flows/cmd_<name>.py`` module exposing ``register(subparsers)``; the parser
registers a ``func(args) -> int`` default. Subcommands import heavy libraries (torch, prefect) lazily so that
``pileworks --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

import flows
from pipeline import __version__

# Commands that run flows or talk to the Prefect API: they get the configured API or the local background server.
PREFECT_COMMANDS = {"build", "run", "train", "serve", "reap"}

EXPECTED_FAILURES = {
    "PrefectApiUnavailable",
    "CheckpointError",
    "StorageError",
    "StageFailed",
    "TrainingFailed",
    "DatasetConflictError",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pileworks",
        description="Raw text to a trained language model: build corpora, train, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"pileworks {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(flows.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"flows.{info.name}")
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if args.command not in PREFECT_COMMANDS:
            return int(args.func(args) or 0)
        from flows.local_server import resolve_api, using_api

        log = logging.getLogger("pileworks")
        with using_api(resolve_api(on_wait=log.info)):
            return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        # User errors: one clear line, no traceback.
        print(f"pileworks {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        # Our own failures carry actionable messages; matched by name so that the CLI imports no torch here.
        if type(exc).__name__ not in EXPECTED_FAILURES:
            raise
        print(f"pileworks {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
