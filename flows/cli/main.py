"""The ``pileworks`` command line.

Each command lives in its own module of ``flows/cli/`` exposing ``register(subparsers)``, listed in
:data:`COMMANDS`; the parser registers a ``func(args) -> int`` default. Commands import heavy libraries (torch,
prefect) inside their ``run`` functions so that ``pileworks --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flows.cli import build, doctor, inspect, janitor, reap, run, sample, serve, trace, train
from pipeline import __version__

# Every command, in the order ``pileworks --help`` lists them.
COMMANDS = (build, doctor, inspect, janitor, reap, run, sample, serve, trace, train)

EXPECTED_FAILURES = {
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
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # A loaded 2-core machine can take longer than the 20 s default to start the ephemeral server.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
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
