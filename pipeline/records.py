"""The document schema and the part-file contract every stage shares.

A *part* is one unit of work: ``part-NNNNN.parquet`` (the records), then ``part-NNNNN.stats.json`` (its
counted stats), then ``part-NNNNN.done`` (the completion marker, written last). A stage folder gets
``_SUCCESS`` once every part is done. A rerun redoes only the parts without a marker and never reads a
part whose marker is missing. Quarantined records (bad input, with the reason) go to
``quarantine/part-NNNNN.parquet`` beside the stage's parts.

This module is the only place that spells the schema; stages build ``Record`` objects and call
``write_part`` / ``read_part``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import ObjectStore, local_temp_prefix
from pipeline.units.protocol import StageStats, checked_bytes, finish_unit, part_name, part_unit, require_done

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("meta", pa.string(), nullable=False),
    ]
)
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("location", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("sample", pa.binary(), nullable=False),
    ]
)
QUARANTINE_SAMPLE_BYTES = 4096
# A web document's URL and crawl date in its meta (WARC/WET records, or the ``ingest.url_field`` of a
# jsonl/parquet record): the URL rules of clean read them, and each shard's docs.parquet publishes them.
URL, WARC_DATE = "url", "warc_date"
# A document's score from the quality classifier of clean (``clean.classifier``), published in docs.parquet.
QUALITY_SCORE = "quality_score"


def normalize_url(url: str) -> str:
    """A URL as read from an input, ready to store: surrounding whitespace and the angle brackets of WARC 1.0's
    grammar (``WARC-Target-URI: <https://…>``, what wget >= 1.20 writes) removed; nothing else is changed, so the
    stored URL is still the one the crawler fetched."""
    url = url.strip()
    if url.startswith("<") and url.endswith(">"):
        url = url[1:-1].strip()
    return url


def url_host(url: str) -> str:
    """The host of a URL as the domain column and the URL rules compare it: lower-cased, without its trailing dot
    and with IDNA labels (``xn--…``) decoded to Unicode, so ``XN--BCHER-KVA.example.`` and ``bücher.example`` are
    one host. "" for no URL or a malformed one. A bracketed URL is read as :func:`normalize_url` reads it."""
    url = normalize_url(url)
    if not url:
        return ""
    try:
        host = urlsplit(url if "://" in url else "http://" + url).hostname or ""
    except ValueError:  # bad IPv6 brackets, a port that is no number
        return ""
    return ".".join(_idna_label(label) for label in host.rstrip(".").split("."))


def _idna_label(label: str) -> str:
    if not label.startswith("xn--"):
        return label
    try:
        return label[4:].encode("ascii").decode("punycode")
    except (UnicodeError, ValueError):  # not valid punycode: kept as written
        return label


@dataclass(slots=True)
class Record:
    """One document. ``id`` is stable (source URI + position); ``meta`` is a JSON object string."""

    id: str
    text: str
    source: str
    meta: str = "{}"

    def meta_dict(self) -> dict[str, Any]:
        value = json.loads(self.meta) if self.meta else {}
        return value if isinstance(value, dict) else {"value": value}


@dataclass(slots=True)
class Quarantined:
    """A record or a whole file that could not be used, kept with the reason and where it came from."""

    source: str
    location: str
    reason: str
    detail: str = ""
    sample: bytes = b""


def web_fields(meta_json: str) -> tuple[str, str]:
    """(URL, crawl date) of a document's meta JSON, "" where it has none."""
    meta = json.loads(meta_json) if meta_json else {}
    if not isinstance(meta, dict):
        return "", ""
    url, date = meta.get(URL, ""), meta.get(WARC_DATE, "")
    return (url if isinstance(url, str) else "", date if isinstance(date, str) else "")


def quality_score(meta_json: str) -> float | None:
    """The ``quality_score`` in a document's meta JSON (None: not scored)."""
    meta = json.loads(meta_json) if meta_json else {}
    value = meta.get(QUALITY_SCORE) if isinstance(meta, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def text_bytes(records: Iterable[Record]) -> int:
    return sum(len(r.text.encode("utf-8", "surrogatepass")) for r in records)


# ---------------------------------------------------------------- part files


def records_to_table(records: Iterable[Record]) -> pa.Table:
    ids, texts, sources, metas = [], [], [], []
    for r in records:
        ids.append(r.id)
        texts.append(r.text)
        sources.append(r.source)
        metas.append(r.meta)
    return pa.table({"id": ids, "text": texts, "source": sources, "meta": metas}, schema=SCHEMA)


def table_to_records(table: pa.Table) -> list[Record]:
    cols = [table.column(name).to_pylist() for name in ("id", "text", "source", "meta")]
    return [Record(i, t, s, m) for i, t, s, m in zip(*cols, strict=True)]


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", row_group_size=4096)
    return sink.getvalue()


def write_part(
    store: ObjectStore,
    folder: str,
    index: int,
    records: list[Record],
    stats: StageStats,
    quarantined: list[Quarantined] | None = None,
) -> None:
    """Write one unit: records, quarantine (if any), stats, then the ``.done`` marker, in that order."""
    store.put_bytes(f"{folder}/{part_name(index)}.parquet", _parquet_bytes(records_to_table(records)))
    write_part_metadata(store, folder, index, stats, quarantined)


class PartWriter:
    """Streams one part's records to a local temp parquet file in row groups, so a part larger than memory
    (a 15 GB ``.jsonl.zst``) is written with bounded memory; ``finish`` uploads it, then the quarantine, the
    stats and the ``.done`` marker, in that order. A writer abandoned by an exception leaves nothing behind."""

    def __init__(self, store: ObjectStore, folder: str, index: int, row_group_size: int = 4096):
        self.store, self.folder, self.index = store, folder, index
        self.row_group_size = row_group_size
        self._buffer: list[Record] = []
        fd, self._path = tempfile.mkstemp(prefix=local_temp_prefix("pw-part-"), suffix=".parquet")
        os.close(fd)
        self._writer = pq.ParquetWriter(self._path, SCHEMA, compression="zstd")
        self.rows = 0
        self.text_bytes = 0

    def write(self, records: Iterable[Record]) -> None:
        for r in records:
            self._buffer.append(r)
            if len(self._buffer) >= self.row_group_size:
                self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._writer.write_table(records_to_table(self._buffer))
            self.rows += len(self._buffer)
            self.text_bytes += text_bytes(self._buffer)
            self._buffer = []

    def finish(self, stats: StageStats, quarantined: list[Quarantined] | None = None) -> None:
        try:
            self._flush()
            self._writer.close()
            name = part_name(self.index)
            self.store.put_file(f"{self.folder}/{name}.parquet", self._path)
            write_part_metadata(self.store, self.folder, self.index, stats, quarantined)
        finally:
            self.abort()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def write_part_metadata(
    store: ObjectStore, folder: str, index: int, stats: StageStats, quarantined: list[Quarantined] | None
) -> None:
    """The quarantine (if any), the stats, then the marker: what follows a part's records."""
    name = part_name(index)
    if quarantined:
        qtable = pa.table(
            {
                "source": [q.source for q in quarantined],
                "location": [q.location for q in quarantined],
                "reason": [q.reason for q in quarantined],
                "detail": [q.detail for q in quarantined],
                "sample": [q.sample[:QUARANTINE_SAMPLE_BYTES] for q in quarantined],
            },
            schema=QUARANTINE_SCHEMA,
        )
        store.put_bytes(f"{folder}/quarantine/{name}.parquet", _parquet_bytes(qtable))
    finish_unit(store, part_unit(folder, index), stats)


def read_part(store: ObjectStore, folder: str, index: int) -> list[Record]:
    """Read a completed part; refuses a part whose completion marker is missing."""
    require_done(store, part_unit(folder, index))
    data = checked_bytes(store, f"{folder}/{part_name(index)}.parquet")
    return table_to_records(pq.read_table(io.BytesIO(data)))


def iter_part_batches(
    store: ObjectStore, folder: str, index: int, batch_size: int = 2048
) -> Iterator[list[Record]]:
    """Stream a completed part in record batches (bounded memory for large parts)."""
    require_done(store, part_unit(folder, index))
    data = checked_bytes(store, f"{folder}/{part_name(index)}.parquet")
    pf = pq.ParquetFile(io.BytesIO(data))
    for batch in pf.iter_batches(batch_size=batch_size):
        yield table_to_records(pa.Table.from_batches([batch]))


def read_quarantine(store: ObjectStore, folder: str) -> list[Quarantined]:
    out: list[Quarantined] = []
    for info in store.list(f"{folder}/quarantine/"):
        if not info.key.endswith(".parquet"):
            continue
        table = pq.read_table(io.BytesIO(store.get_bytes(info.key)))
        for row in table.to_pylist():
            out.append(Quarantined(**row))
    return out
