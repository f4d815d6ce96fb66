"""A finished unit damaged after its marker (a flipped byte, a file truncated to 0) costs a recompute of that unit
on the rerun, with one warning naming the file, and the rerun gives the same dataset id: on disk and on S3."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.build import unchanged
from pipeline.storage import ObjectStore, S3Options, open_store
from tests.fixtures.damage import WarningLines
from tests.flows.tiny_corpus import TINY_OVERRIDES

pytestmark = pytest.mark.slow


def _flip16(data: bytes) -> bytes:
    at = len(data) // 2
    return data[:at] + bytes(b ^ 0xFF for b in data[at : at + 16]) + data[at + 16 :]


# Every kind of intermediate a later step reads: docs parts, tokens, signatures, counts, hashes, drop lists.
DAMAGED: dict[str, Callable[[bytes], bytes]] = {
    "clean/part-00001.parquet": _flip16,
    "tokens/part-00002.parquet": lambda _: b"",
    "near/signatures/part-00003.sig.npz": _flip16,
    "boilerplate/part-00000.npy": lambda _: b"",
    "exact/hash/part-00004.npy": _flip16,
    "exact/drop/part-00005.npy": lambda _: b"",
    "near/clusters/drop/part-00006.npz": _flip16,
}


def _dead_writers_prefix() -> str:
    """The temp-file prefix of a process that ran on this host and has exited."""
    import subprocess

    from pipeline.storage.base import tmp_prefix

    gone = subprocess.Popen(["true"])
    gone.wait()
    return tmp_prefix().replace(f"-{os.getpid()}@", f"-{gone.pid}@")


def _build(tiny_corpus: Path, output: str, s3: S3Options | None = None) -> dict:
    from flows.build.flow import build_corpus
    from flows.runtime.runners import make_task_runner

    extra = {} if s3 is None else {"s3.endpoint_url": s3.endpoint_url, "s3.region": s3.region}
    flow = build_corpus.with_options(task_runner=make_task_runner("threads", 2))  # warnings in this process
    return flow(inputs=[str(tiny_corpus)], output=output, overrides=TINY_OVERRIDES | extra)


def _damage_and_rebuild(store: ObjectStore, build: Callable[[], dict]) -> None:
    first = build()
    (work,) = {i.key.split("/")[1] for i in store.list("work/") if i.key.count("/") > 1}
    keys = {f"work/{work}/{rel}": damage for rel, damage in DAMAGED.items()}
    originals = {key: store.get_bytes(key) for key in keys}
    for key, damage in keys.items():
        store.put_bytes(key, damage(originals[key]))
    leftover = f"work/{work}/clean/{_dead_writers_prefix()}part-00003.parquet"
    store.put_bytes(leftover, b"half a part")  # a temp file of a killed run (S3: just an odd key, kept)
    # Without its published record the rerun takes the full path through every unit (with it, an intact published
    # dataset answers "nothing changed" and no unit is read: flows/build/unchanged.py).
    store.delete(f"work/{work}/{unchanged.RECORD}")
    handler, logger = WarningLines(), logging.getLogger("pipeline.units.protocol")
    logger.addHandler(handler)
    try:
        again = build()
    finally:
        logger.removeHandler(handler)
    assert again["dataset_id"] == first["dataset_id"]
    named = handler.lines
    for key in keys:
        assert sum(store.uri_of(key) in line for line in named) == 1, (key, named)
        assert store.get_bytes(key) == originals[key]  # recomputed, bit for bit
    if store.uri.startswith("file://"):  # the rerun removed the dead run's temp file at its start
        assert not list(Path(store.uri.removeprefix("file://")).rglob(".pw-tmp-*"))


def test_damaged_units_on_disk_are_recomputed_and_named(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "store"), None)
    _damage_and_rebuild(store, lambda: _build(tiny_corpus, str(tmp_path / "store")))


@pytest.mark.s3
def test_damaged_units_on_s3_are_recomputed_and_named(prefect_harness, tiny_corpus: Path, s3_bucket) -> None:
    store = open_store(s3_bucket.uri, s3_bucket.options)
    _damage_and_rebuild(store, lambda: _build(tiny_corpus, s3_bucket.uri, s3_bucket.options))
