"""The cost of the checksums a unit's done marker records (``pipeline/units/proofs.py``), per MB of output.

Hashes a buffer of random bytes with xxh64 (what local outputs record), sha256 and md5 (what S3's single-part
ETag is, so on S3 the digest is reused, not computed), in CPU ms per MB; then the whole protocol on a local
store: writing a unit of ``--unit-mb`` MB with its record (``finish_unit``: one listing, the outputs read back
and hashed) against the old empty marker, and a rerun's check (``unit_stats``) when the tag matches (the happy
path: no byte read) and when only the tag changed (bytes read and hashed).

    .venv/bin/python tests/bench/bench_checksums.py [--mb 256] [--unit-mb 64]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable

import xxhash

from pipeline.storage import FileStore
from pipeline.units.protocol import StageStats, finish_unit, stats_bytes, unit_stats


def cpu_ms_per_mb(fn: Callable[[], object], mb: float, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return 1000 * best / mb


def hash_costs(mb: int) -> dict[str, float]:
    data = os.urandom(mb << 20)
    view = memoryview(data)

    def chunked(h: object) -> Callable[[], object]:
        def run() -> object:
            for at in range(0, len(data), 1 << 20):
                h.update(view[at : at + (1 << 20)])  # type: ignore[attr-defined]
            return h

        return run

    return {
        "xxh64": cpu_ms_per_mb(lambda: chunked(xxhash.xxh64())(), mb),
        "sha256": cpu_ms_per_mb(lambda: chunked(hashlib.sha256())(), mb),
        "md5": cpu_ms_per_mb(lambda: chunked(hashlib.md5(usedforsecurity=False))(), mb),
    }


def protocol_costs(unit_mb: int) -> dict[str, float]:
    stats = StageStats(stage="bench", docs_in=1, docs_out=1)
    payload = os.urandom(unit_mb << 20)
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(tmp)
        store.put_bytes("u/part-00000.parquet", payload)

        def old_marker() -> None:  # what finish_unit wrote before: stats, then an empty marker
            store.put_bytes("u/part-00000.stats.json", stats_bytes(stats))
            store.put_bytes("u/part-00000.done", b"")

        old = cpu_ms_per_mb(old_marker, unit_mb)
        new = cpu_ms_per_mb(lambda: finish_unit(store, "u/part-00000", stats), unit_mb)
        happy = cpu_ms_per_mb(lambda: unit_stats(store, "u/part-00000"), unit_mb)

        def touched() -> None:
            os.utime(
                os.path.join(tmp, "u/part-00000.parquet")
            )  # same bytes, new tag: hashed, record refreshed
            unit_stats(store, "u/part-00000")

        moved = cpu_ms_per_mb(touched, unit_mb)
    return {
        "finish_unit, empty marker (before)": old,
        "finish_unit, recorded marker": new,
        "rerun check, tag matches": happy,
        "rerun check, tag changed (hash)": moved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=256, help="MB hashed per algorithm")
    parser.add_argument("--unit-mb", type=int, default=64, help="size of the unit written and checked")
    args = parser.parse_args()
    for name, ms in hash_costs(args.mb).items():
        print(f"{name:>8}: {ms:6.3f} CPU ms per MB ({1000 / ms:7.0f} MB/s per core)")
    print("md5 from S3's ETag (the happy path on S3): no bytes hashed, 0 ms per MB")
    for name, ms in protocol_costs(args.unit_mb).items():
        print(f"{name:>36}: {ms:6.3f} CPU ms per MB of unit output")


if __name__ == "__main__":
    main()
