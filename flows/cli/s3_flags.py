"""The S3 flags every ``pileworks`` command takes, spelled the same everywhere.

``--s3-endpoint-url``, ``--s3-region``, ``--s3-profile``, the other clouds' endpoints (``--gcs-endpoint-url``,
``--azure-endpoint-url``: emulators, sovereign clouds) and ``--s3-set KEY=VALUE`` (any field of the ``s3:``
config section, e.g. ``retry_budget_s=300``). Commands with a config file apply them over its ``s3:`` section
(build/run/serve: the corpus config; train/run: the training config); the others resolve them over the
defaults. Either way the result is one :class:`~pipeline.storage.S3Options` that every store is opened with.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.config import parse_overrides
from pipeline.storage import S3Options
from pipeline.storage.options import resolve_s3_options


def add_s3_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Object stores (s3://, gs://, az:// URIs; the s3: config section)")
    g.add_argument(
        "--s3-endpoint-url",
        metavar="URL",
        help="S3-compatible endpoint (MinIO: http://HOST:9000); default AWS",
    )
    g.add_argument("--s3-region", metavar="REGION", help="S3 region")
    g.add_argument(
        "--gcs-endpoint-url",
        metavar="URL",
        help="gs:// endpoint (an emulator: http://HOST:PORT, reached without credentials); default Google, "
        "or STORAGE_EMULATOR_HOST",
    )
    g.add_argument(
        "--azure-endpoint-url",
        metavar="URL",
        help="az:// Blob endpoint of the account (Azurite: http://127.0.0.1:10000/devstoreaccount1); default "
        "AZURE_STORAGE_CONNECTION_STRING's or https://ACCOUNT.blob.core.windows.net",
    )
    g.add_argument("--s3-profile", metavar="NAME", help="AWS profile for the credentials")
    g.add_argument(
        "--s3-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any s3: setting, e.g. retry_budget_s=300 (repeatable)",
    )


def s3_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The S3 settings given on the command line (field name -> value); empty when none."""
    changes = parse_overrides(getattr(args, "s3_set", None) or [], flag="--s3-set")
    for name in ("endpoint_url", "region", "profile"):
        value = getattr(args, f"s3_{name}", None)
        if value is not None:
            changes[name] = value
    for name in ("gcs_endpoint_url", "azure_endpoint_url"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    return changes


def dotted_s3_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as dotted config overrides (``s3.endpoint_url``), for commands with a config file."""
    return {f"s3.{k}": v for k, v in s3_changes(args).items()}


def resolve_s3(args: argparse.Namespace, base: S3Options | None = None) -> S3Options:
    """The one S3 configuration of a command without a config file: the flags over ``base`` (or defaults)."""
    return resolve_s3_options(s3_changes(args), base)
