"""``pileworks janitor``: abort multipart uploads (S3) or temp files (local) left behind by killed processes."""

from __future__ import annotations

import argparse

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("janitor", help="abort dangling multipart uploads / temp files under a store root")
    p.add_argument("--output", required=True, help="store root: a folder, file:// or s3://bucket/prefix")
    p.add_argument(
        "--older-than", type=float, default=3600.0, help="only uploads started this many seconds ago"
    )
    add_s3_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.storage import open_store
    from pipeline.storage.s3 import abort_recorded_uploads
    from pipeline.storage.uploads import UploadJournal

    s3 = resolve_s3(args)
    store = open_store(args.output, s3)
    recorded = abort_recorded_uploads(UploadJournal(store), s3)
    n = store.abort_stale_uploads(older_than_s=args.older_than)
    print(
        f"{store.uri}: aborted {recorded} upload(s) recorded by earlier runs, "
        f"{n} other upload(s) older than {args.older_than:.0f} s"
    )
    return 0
