"""A journal of multipart uploads in flight, kept in the work folder, so a killed run's uploads are found at once.

S3 keeps (and bills) the parts of an upload nobody completes or aborts. A process killed mid-upload cannot abort
its own, and listing uploads by age (``abort_stale_uploads``) must wait long enough not to hit live ones. So
each upload is recorded when it starts and the record deleted when it ends; a rerun or ``pileworks janitor``
aborts every upload still recorded whose run is gone, and age stays the rule only for uploads nobody recorded.

Whether a run is gone is its *lease*'s answer: a build holds ``work/leases/<run>.json`` (its host, pid and an
expiry), which its heartbeat refreshes; a record names its run. A run is gone when its lease expired, was
released, or names a pid on this host that no longer runs (a ``kill -9``: found at once, no expiry to wait
for). A record without a run (written before leases) counts as gone, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any, Protocol


class JournalStore(Protocol):
    """What the journal needs of a store (base.ObjectStore holds a journal, so this module cannot import it)."""

    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def list(self, prefix: str = "") -> Iterable[Any]: ...


log = logging.getLogger(__name__)

UPLOADS_FOLDER = "work/uploads"


class UploadJournal:
    """Records ``(bucket, key, upload id)`` under ``folder`` of ``store``; ``None`` store: records nothing."""

    def __init__(self, store: JournalStore | None, folder: str = UPLOADS_FOLDER, run: str = ""):
        self.store, self.folder, self.run = store, folder.strip("/"), run

    def _record_key(self, upload_id: str) -> str:
        return f"{self.folder}/{hashlib.sha256(upload_id.encode()).hexdigest()[:32]}.json"

    def started(self, bucket: str, key: str, upload_id: str, store_uri: str = "") -> None:
        """Record an upload; ``store_uri``: the bucket's URI when not ``s3://`` (``gs://b``, ``az://c``),
        which the janitor opens to abort it (``pipeline.storage.janitor``)."""
        if self.store is not None:
            record = {"bucket": bucket, "key": key, "upload_id": upload_id, "started": time.time()}
            if store_uri:
                record["store_uri"] = store_uri
            if self.run:
                record["run"] = self.run
            self.store.put_bytes(self._record_key(upload_id), json.dumps(record).encode())

    def finished(self, bucket: str, key: str, upload_id: str) -> None:
        if self.store is not None:
            self.store.delete(self._record_key(upload_id))

    def records(self) -> list[tuple[str, dict]]:
        """``(record key, record)`` for every upload still recorded."""
        if self.store is None:
            return []
        out = []
        for info in self.store.list(self.folder + "/"):
            if info.key.endswith(".json"):
                out.append((info.key, json.loads(self.store.get_bytes(info.key))))
        return out


NO_JOURNAL = UploadJournal(None)

LEASES_FOLDER = "work/leases"
LEASE_TTL_S = 120.0  # a lease not refreshed for this long is expired (the heartbeat refreshes it every 10 s)


def lease_key(run: str) -> str:
    return f"{LEASES_FOLDER}/{run}.json"


def hold_lease(store: JournalStore, run: str, ttl_s: float = LEASE_TTL_S) -> None:
    """Take or refresh ``run``'s lease: this process, alive until ``ttl_s`` from now unless refreshed."""
    lease = {"run": run, "host": socket.gethostname(), "pid": os.getpid(), "expires": time.time() + ttl_s}
    store.put_bytes(lease_key(run), json.dumps(lease).encode())


def release_lease(store: JournalStore, run: str) -> None:
    store.delete(lease_key(run))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def run_alive(store: JournalStore, run: str, now: float | None = None) -> bool:
    """Whether ``run`` holds a live lease (see the module doc); ``""`` (no run recorded): never."""
    if not run:
        return False
    try:
        lease = json.loads(store.get_bytes(lease_key(run)))
    except FileNotFoundError:
        return False
    if float(lease["expires"]) < (time.time() if now is None else now):
        return False
    if lease.get("host") == socket.gethostname():
        return pid_alive(int(lease["pid"]))  # dead at once after a kill -9, not an expiry later
    return True


def live_upload_ids(journal: UploadJournal) -> set[str]:
    """The upload ids recorded by runs still alive: what no janitor or other build may abort, however old."""
    if journal.store is None:
        return set()
    records = journal.records()
    alive = {run: run_alive(journal.store, run) for run in {str(r.get("run", "")) for _, r in records}}
    return {str(r["upload_id"]) for _, r in records if alive[str(r.get("run", ""))]}
