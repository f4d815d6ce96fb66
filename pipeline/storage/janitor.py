"""Abort the uploads that runs which are gone left recorded in the upload journal, on whichever cloud they ran.

A record names its bucket's store (``store_uri``: ``gs://b``, ``az://c``; none: ``s3://`` as before). Each
store aborts its own kind: an S3 multipart upload, a GCS resumable session, Azure's uncommitted blocks.
"""

from __future__ import annotations

import logging

from pipeline.storage import open_store
from pipeline.storage.options import S3Options
from pipeline.storage.uploads import UploadJournal, run_alive

log = logging.getLogger(__name__)


def abort_recorded_uploads(journal: UploadJournal, options: S3Options) -> int:
    """Abort every upload still recorded in ``journal`` whose run is gone (its lease expired or its process
    died, see ``pipeline.storage.uploads``); a live build's uploads are left alone. Returns how many."""
    if journal.store is None:
        return 0
    aborted, live = 0, {}
    for record_key, record in journal.records():
        run = str(record.get("run", ""))
        if run not in live:
            live[run] = run_alive(journal.store, run)
        if live[run]:
            continue
        store = open_store(str(record.get("store_uri") or f"s3://{record['bucket']}"), options)
        aborted += store.abort_upload(str(record["key"]), str(record["upload_id"]))  # False: gone already
        journal.store.delete(record_key)
    if aborted:
        log.info("aborted %d upload(s) recorded by runs that are gone", aborted)
    return aborted
