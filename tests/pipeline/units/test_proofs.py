"""Units that prove their bytes (``pipeline.units.proofs``, through ``pipeline.units.protocol``): a done marker records each
output, and a damaged output costs a recompute of its unit (one warning naming the file), never a failed build;
on S3 the check costs no extra round trip."""

from __future__ import annotations

import json
import logging

import pytest

from pipeline.storage import ObjectStore
from pipeline.storage.retry import STATS
from pipeline.units.protocol import (
    StageStats,
    finish_folder,
    finish_unit,
    folder_stats,
    unit_done,
    unit_stats,
)

UNIT = "work/clean/part-00017"
PAYLOAD = bytes(range(256)) * 64  # 16 KiB


def _finished_unit(store: ObjectStore) -> StageStats:
    store.put_bytes(f"{UNIT}.parquet", PAYLOAD)
    store.put_bytes(f"{UNIT}/sub.npy", PAYLOAD[::-1])
    return finish_unit(store, UNIT, StageStats(stage="clean", docs_in=3, docs_out=2))


def _flip16(data: bytes) -> bytes:
    return data[:100] + bytes(b ^ 0xFF for b in data[100:116]) + data[116:]


DAMAGE = {
    "flipped": lambda store, key: store.put_bytes(key, _flip16(store.get_bytes(key))),
    "truncated": lambda store, key: store.put_bytes(key, b""),
    "deleted": lambda store, key: store.delete(key),
}


def test_an_intact_unit_is_skipped_with_its_stats(store: ObjectStore) -> None:
    stats = _finished_unit(store)
    marker = json.loads(store.get_bytes(f"{UNIT}.done"))
    assert sorted(marker["outputs"]) == [".parquet", "/sub.npy"]
    assert marker["outputs"][".parquet"]["size"] == len(PAYLOAD)
    assert unit_stats(store, UNIT) == stats


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("output", [".parquet", "/sub.npy"])
def test_a_damaged_output_is_named_once_and_its_unit_redone(
    store: ObjectStore, damage: str, output: str, caplog: pytest.LogCaptureFixture
) -> None:
    _finished_unit(store)
    DAMAGE[damage](store, UNIT + output)
    with caplog.at_level(logging.WARNING, logger="pipeline.units.protocol"):
        assert unit_stats(store, UNIT) is None
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and store.uri_of(UNIT + output) in lines[0], lines
    assert "recomputing" in lines[0]
    assert not unit_done(store, UNIT)  # the marker went: every reader now sees the unit as not done
    stats = _finished_unit(store)  # the step redoes it
    assert unit_stats(store, UNIT) == stats


def test_the_same_bytes_under_a_new_tag_are_intact_and_the_record_refreshed(store: ObjectStore) -> None:
    stats = _finished_unit(store)
    store.put_bytes(f"{UNIT}.parquet", PAYLOAD)  # rewritten (a copy, a sync): new mtime locally, same bytes
    before = json.loads(store.get_bytes(f"{UNIT}.done"))["outputs"][".parquet"]
    assert unit_stats(store, UNIT) == stats
    after = json.loads(store.get_bytes(f"{UNIT}.done"))["outputs"][".parquet"]
    assert after["digest"] == before["digest"] and after["etag"] == store.stat(f"{UNIT}.parquet").etag


def test_a_marker_written_before_records_is_trusted(store: ObjectStore) -> None:
    stats = _finished_unit(store)
    store.put_bytes(f"{UNIT}.done", b"")  # an older version's empty marker
    store.put_bytes(f"{UNIT}.parquet", b"")
    assert unit_stats(store, UNIT) == stats


@pytest.mark.s3
def test_on_s3_the_check_costs_what_the_old_head_and_read_cost(s3_bucket) -> None:
    from pipeline.storage import open_store

    store = open_store(s3_bucket.uri, s3_bucket.options)
    stats = _finished_unit(store)
    digest = json.loads(store.get_bytes(f"{UNIT}.done"))["outputs"][".parquet"]["digest"]
    assert digest.startswith("md5:")  # S3's own ETag: nothing hashed on the happy path
    before = STATS.snapshot()["attempts"]
    assert unit_stats(store, UNIT) == stats
    assert STATS.snapshot()["attempts"] - before == 2  # one listing and one read (was: one HEAD and one read)


def test_a_global_step_folder_proves_its_outputs(
    store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.put_bytes("work/clusters/drop/part-00003.npz", PAYLOAD)
    stats = finish_folder(store, "work/clusters", StageStats(stage="clusters", docs_in=5))
    assert folder_stats(store, "work/clusters") == stats
    store.put_bytes("work/clusters/drop/part-00003.npz", _flip16(PAYLOAD))
    with caplog.at_level(logging.WARNING, logger="pipeline.units.protocol"):
        assert folder_stats(store, "work/clusters") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and store.uri_of("work/clusters/drop/part-00003.npz") in warnings[0]
    assert not store.exists("work/clusters/_SUCCESS")
