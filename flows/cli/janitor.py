"""``pileworks janitor``: abort multipart uploads (S3) or temp files (local) left behind by killed processes."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("janitor", help="abort dangling multipart uploads / temp files under a store root")
    p.add_argument("--output", required=True, help="store root: a folder, file:// or s3://bucket/prefix")
    p.add_argument(
        "--older-than", type=float, default=3600.0, help="only uploads started this many seconds ago"
    )
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (MinIO, Ceph, ...)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.storage import S3Options, open_store

    store = open_store(args.output, s3=S3Options(endpoint_url=args.endpoint_url))
    n = store.abort_stale_uploads(older_than_s=args.older_than)
    print(f"{store.uri}: aborted {n} stale upload(s) older than {args.older_than:.0f} s")
    return 0
