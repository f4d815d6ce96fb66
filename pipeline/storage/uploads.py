"""A journal of multipart uploads in flight, kept in the work folder, so a killed run's uploads are found at once.

S3 keeps (and bills) the parts of an upload nobody completes or aborts. A process killed mid-upload cannot abort
its own, and listing uploads by age (``abort_stale_uploads``) must wait long enough not to hit live ones. So
each upload is recorded when it starts and the record deleted when it ends; a rerun or ``pileworks janitor``
aborts every upload still recorded (those runs are gone), and age stays the rule only for uploads nobody
recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
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

    def __init__(self, store: JournalStore | None, folder: str = UPLOADS_FOLDER):
        self.store, self.folder = store, folder.strip("/")

    def _record_key(self, upload_id: str) -> str:
        return f"{self.folder}/{hashlib.sha256(upload_id.encode()).hexdigest()[:32]}.json"

    def started(self, bucket: str, key: str, upload_id: str) -> None:
        if self.store is not None:
            record = {"bucket": bucket, "key": key, "upload_id": upload_id, "started": time.time()}
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
