"""``pileworks janitor``: abort multipart uploads (S3), resumable sessions (GCS), uncommitted blocks (Azure) or
temp files (local) left behind by killed processes.

A running build's uploads are never touched (its lease says it is alive); a dead run's go at once, and so do
the temp files of a writer on this host that no longer runs; the rest go by age (``--older-than``)."""

from __future__ import annotations

import argparse

from flows.cli.s3_flags import add_s3_arguments, resolve_s3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("janitor", help="abort dangling multipart uploads / temp files under a store root")
    p.add_argument(
        "--output", required=True, help="store root: a folder, file://, s3://, gs://, az:// or abfs[s]://"
    )
    p.add_argument(
        "--older-than", type=float, default=3600.0, help="only uploads started this many seconds ago"
    )
    add_s3_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.storage import open_store
    from pipeline.storage.janitor import abort_recorded_uploads
    from pipeline.storage.uploads import UploadJournal, live_upload_ids

    s3 = resolve_s3(args)
    store = open_store(args.output, s3)
    journal = UploadJournal(store)
    recorded = abort_recorded_uploads(journal, s3)  # runs whose lease expired or whose process died
    live = frozenset(live_upload_ids(journal))  # a running build's: never aborted, however old
    n = store.abort_stale_uploads(older_than_s=args.older_than, keep=live)
    print(
        f"{store.uri}: aborted {recorded} upload(s) recorded by runs that are gone, "
        f"{n} other upload(s) or temp file(s) of dead or {args.older_than:.0f} s old writers; "
        f"kept {len(live)} upload(s) of live builds"
    )
    return 0
