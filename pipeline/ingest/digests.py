"""Content digests of raw inputs: what unit keys and the build key hold instead of an object's ETag/mtime.

An input's digest is the ``xxh3-128`` of its bytes, computed once per input *version*: digests are kept in the
build store under ``cache/digests/<root>.json`` (one object per input root), each with the URI, size and
ETag/mtime it was computed for. A rebuild reads only the objects that are new or whose tag changed: a touched
file is read once and gives the same digest (nothing downstream is recomputed); a corpus moved to another folder
or bucket is read once under its new URIs, and every unit whose input bytes are the same is reused.

Two builds that update the same digest object at once may lose one's entries: a lost entry costs one more read of
that input, never a wrong digest (an entry is a fact about one version of one object).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, BinaryIO

import xxhash

from pipeline.ingest.config import InputFile
from pipeline.storage import ObjectStore, S3Options, open_store, split_uri

log = logging.getLogger(__name__)

DIGESTS_PREFIX = "cache/digests"
ALGO = "xxh3-128"
BLOCK = 8 << 20  # bytes per read: large enough that the hash, not the call, is the cost
HASH_THREADS = 8  # objects hashed at once (S3 GETs in flight; local reads overlap)


def hash_stream(f: BinaryIO) -> str:
    """``xxh3-128:<hex>`` of a stream's bytes."""
    h = xxhash.xxh3_128()
    while block := f.read(BLOCK):
        h.update(block)
    return f"{ALGO}:{h.hexdigest()}"


class _Readers:
    """One store per parent URI (S3 clients reused across objects), shared by the hashing threads."""

    def __init__(self, s3: S3Options | None) -> None:
        self.s3, self.stores = s3, dict[str, ObjectStore]()

    def digest(self, uri: str) -> str:
        parent, key = split_uri(uri)
        store = self.stores.get(parent)
        if store is None:
            store = self.stores.setdefault(parent, open_store(parent, s3=self.s3))
        with store.open_read(key) as f:
            return hash_stream(f)


def cache_key(root: str) -> str:
    """Where the digests of the inputs under ``root`` are kept in a build store."""
    return f"{DIGESTS_PREFIX}/{hashlib.sha256(root.encode()).hexdigest()[:24]}.json"


def _known(store: ObjectStore, key: str) -> dict[str, Any]:
    try:
        data = json.loads(store.get_bytes(key))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def with_digests(
    inputs: Sequence[InputFile], store: ObjectStore, root: str, s3: S3Options | None
) -> list[InputFile]:
    """``inputs`` with their content digests: from ``store``'s digest cache when an entry matches the object's
    size and tag, else read and hashed (then cached). Logs what it hashed and how fast."""
    key = cache_key(root)
    known = _known(store, key)

    def cached(i: InputFile) -> str | None:
        entry = known.get(i.uri)
        if not isinstance(entry, dict) or (entry.get("size"), entry.get("etag")) != (i.size, i.etag):
            return None
        return str(entry["digest"])

    todo = [i for i in inputs if cached(i) is None]
    fresh: dict[str, str] = {}
    if todo:
        started, readers = time.perf_counter(), _Readers(s3)
        with ThreadPoolExecutor(max_workers=min(HASH_THREADS, len(todo))) as pool:
            fresh = dict(
                zip((i.uri for i in todo), pool.map(lambda i: readers.digest(i.uri), todo), strict=True)
            )
        seconds, nbytes = time.perf_counter() - started, sum(i.size for i in todo)
        log.info(
            "ingest: hashed %d input object(s), %.1f MB, in %.2f s (%d taken from the digest cache)",
            len(todo),
            nbytes / 1e6,
            seconds,
            len(inputs) - len(todo),
        )
        latest = _known(store, key)  # another build's entries since we read: kept
        latest.update({i.uri: {"size": i.size, "etag": i.etag, "digest": fresh[i.uri]} for i in todo})
        store.put_bytes(key, json.dumps(latest, sort_keys=True).encode())
    return [replace(i, digest=fresh.get(i.uri) or cached(i) or "") for i in inputs]
