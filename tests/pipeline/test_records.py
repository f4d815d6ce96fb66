"""``pipeline.records``: the document schema and part files every stage reads and writes."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.errors import UnitNotDone
from pipeline.records import (
    QUARANTINE_SAMPLE_BYTES,
    SCHEMA,
    PartWriter,
    Quarantined,
    Record,
    iter_part_batches,
    read_part,
    read_quarantine,
    records_to_table,
    table_to_records,
    text_bytes,
    write_part,
)
from pipeline.storage import FileStore
from pipeline.units.protocol import StageStats, part_done, read_part_stats

MIXED = [
    Record("a.jsonl#L1", "Grüße aus Köln", "file:///a.jsonl", '{"lang": "de"}'),
    Record("b.txt#B0", "東京の天気は晴れ。\n\n改行も残る", "file:///b.txt"),
    Record("c#row3", "emoji 😀 and NUL \x00 inside", "s3://bucket/c.parquet", '["not", "a", "dict"]'),
]


def test_schema_round_trip_keeps_every_field() -> None:
    table = records_to_table(MIXED)
    assert table.schema.equals(SCHEMA) and table.num_rows == 3
    assert table_to_records(table) == MIXED
    assert MIXED[0].meta_dict() == {"lang": "de"} and MIXED[1].meta_dict() == {}
    assert MIXED[2].meta_dict() == {"value": ["not", "a", "dict"]}  # meta that is no object is wrapped
    assert text_bytes(MIXED) == sum(len(r.text.encode("utf-8")) for r in MIXED)


def test_write_then_read_a_part(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    stats = StageStats(stage="ingest", docs_in=3, docs_out=3)
    bad = Quarantined(
        "file:///b.txt", "B99", "undecodable", "no codec fits", b"\xff" * (QUARANTINE_SAMPLE_BYTES + 10)
    )
    write_part(store, "ingest", 0, MIXED, stats, [bad])
    assert part_done(store, "ingest", 0) and read_part_stats(store, "ingest", 0) == stats
    assert read_part(store, "ingest", 0) == MIXED
    assert [len(b) for b in iter_part_batches(store, "ingest", 0, batch_size=2)] == [2, 1]
    (stored,) = read_quarantine(store, "ingest")
    assert (stored.reason, stored.location) == ("undecodable", "B99")
    assert stored.sample == b"\xff" * QUARANTINE_SAMPLE_BYTES  # samples are capped, never the whole object


def test_a_part_without_its_marker_is_never_read(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    write_part(store, "x", 0, MIXED, StageStats(stage="x"))
    store.delete("x/part-00000.done")  # as if the process died between the stats and the marker
    with pytest.raises(UnitNotDone, match="part-00000"):
        read_part(store, "x", 0)
    with pytest.raises(UnitNotDone, match="part-00000"):
        next(iter_part_batches(store, "x", 0))


def test_part_writer_streams_row_groups_and_leaves_nothing_when_abandoned(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    many = [Record(f"d#{i}", f"text {i}", "src") for i in range(25)]
    with PartWriter(store, "big", 0, row_group_size=10) as writer:
        writer.write(many)
        writer.finish(StageStats(stage="ingest", docs_in=25, docs_out=25))
    assert writer.rows == 25 and writer.text_bytes == text_bytes(many)
    assert pq.ParquetFile(io.BytesIO(store.get_bytes("big/part-00000.parquet"))).num_row_groups == 3
    assert read_part(store, "big", 0) == many
    temp_files = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(RuntimeError, match="boom"), PartWriter(store, "big", 1) as writer:
        writer.write(many)
        raise RuntimeError("boom")
    assert not part_done(store, "big", 1) and not store.exists("big/part-00001.parquet")
    assert not any(n.startswith("pw-part-") for n in set(os.listdir(tempfile.gettempdir())) - temp_files)
