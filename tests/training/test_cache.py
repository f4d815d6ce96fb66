"""ShardCache: verified fetch, corruption detected and refetched, one download per node, bounded LRU."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
import threading
from pathlib import Path

import pytest

from pipeline.storage import FileStore, StorageError, sha256_bytes
from training.cache import ShardCache


class Ticks:
    """A clock that moves one second per reading: each use of the cache is later than the one before."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class CountingStore(FileStore):
    """A FileStore that appends one line per ``get_file`` to a file (counts across processes) and is slow:
    ``started`` is set when a download begins, which then waits up to ``delay_s`` for ``finish``."""

    def __init__(self, root: Path, count_file: Path, delay_s: float = 0.0):
        super().__init__(root)
        self.count_file, self.delay_s = Path(count_file), delay_s
        self.started, self.finish = threading.Event(), threading.Event()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("started", "finish")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.started, self.finish = threading.Event(), threading.Event()

    def get_file(self, key, path):
        with open(self.count_file, "a") as f:
            f.write(f"{os.getpid()} {key}\n")
        self.started.set()
        if self.delay_s:
            self.finish.wait(self.delay_s)
        super().get_file(key, path)

    def downloads(self) -> list[str]:
        return self.count_file.read_text().split("\n")[:-1] if self.count_file.exists() else []


def make_objects(tmp_path: Path, count: int, size: int, delay_s: float = 0.0):
    store = CountingStore(tmp_path / "store" / "datasets" / "x" / "abc123", tmp_path / "count.txt", delay_s)
    objects = {}
    for i in range(count):
        data = hashlib.sha256(str(i).encode()).digest() * (size // 32) + bytes(size % 32)
        key = f"train/shard-{i:05d}.bin"
        store.put_bytes(key, data)
        objects[key] = (sha256_bytes(data), len(data), data)
    return store, objects


def fetch(cache: ShardCache, objects, key: str) -> bytes:
    sha, size, _ = objects[key]
    return cache.path(key, sha, size).read_bytes()


def test_fetch_places_a_verified_copy_under_the_dataset_namespace(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 2, 1000)
    cache = ShardCache(store, tmp_path / "cache", 10_000)
    key = "train/shard-00000.bin"
    assert fetch(cache, objects, key) == objects[key][2]
    assert fetch(cache, objects, key) == objects[key][2]
    path = cache.cached_path(key)
    assert path.is_relative_to(tmp_path / "cache") and cache.namespace.startswith("abc123-")
    assert len(store.downloads()) == 1 and cache.stats.downloads == 1 and cache.stats.hits == 1
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".pw-")]  # no temp left behind


def test_corrupted_cached_file_is_detected_and_fetched_again(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 1, 4096)
    key = "train/shard-00000.bin"
    first = ShardCache(store, tmp_path / "cache", 100_000)
    fetch(first, objects, key)
    first.close()
    path = first.cached_path(key)
    flipped = bytearray(path.read_bytes())
    flipped[1234] ^= 0xFF
    path.write_bytes(bytes(flipped))  # same size: only the sha256 can tell
    later = ShardCache(store, tmp_path / "cache", 100_000)  # a new process verifies by sha256 once
    assert fetch(later, objects, key) == objects[key][2]
    assert later.stats.corrupt_refetches == 1 and len(store.downloads()) == 2
    # a truncated file is caught by the size check even by a process that already verified it
    path.write_bytes(objects[key][2][:100])
    assert fetch(later, objects, key) == objects[key][2]
    assert later.stats.corrupt_refetches == 2 and len(store.downloads()) == 3


def test_a_corrupt_object_in_the_store_raises_and_leaves_nothing(tmp_path: Path) -> None:
    store, _ = make_objects(tmp_path, 1, 512)
    key = "train/shard-00000.bin"
    cache = ShardCache(store, tmp_path / "cache", 100_000)
    with pytest.raises(StorageError, match="does not match the manifest"):
        cache.path(key, "0" * 64, 512)
    assert len(store.downloads()) == 2  # retried once
    assert not any(p.is_file() for p in (tmp_path / "cache" / cache.namespace / "data").rglob("*"))


def _fetch_in_child(cache: ShardCache, key: str, sha: str, size: int, barrier, out) -> None:
    barrier.wait()
    out.put(hashlib.sha256(cache.path(key, sha, size).read_bytes()).hexdigest())


@pytest.mark.distributed
def test_processes_fetching_one_shard_download_it_once(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 1, 1 << 20, delay_s=0.5)
    key = "train/shard-00000.bin"
    sha, size, _ = objects[key]
    cache = ShardCache(store, tmp_path / "cache", 10 << 20)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_fetch_in_child, args=(cache, key, sha, size, barrier, out)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results == [sha] * 3
    assert len(store.downloads()) == 1, store.downloads()


def test_threads_fetching_one_shard_download_it_once(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 1, 1 << 16, delay_s=0.3)
    key = "train/shard-00000.bin"
    cache = ShardCache(store, tmp_path / "cache", 1 << 20)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(fetch(cache, objects, key))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [objects[key][2]] * 6 and len(store.downloads()) == 1


def test_lru_eviction_keeps_usage_under_the_bound(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 6, 1000)
    keys = sorted(objects)
    cache = ShardCache(store, tmp_path / "cache", 3500, clock=Ticks())
    for key in keys[:3]:
        fetch(cache, objects, key)
        cache.release(key)
    fetch(cache, objects, keys[0])  # a use makes keys[0] the most recent
    cache.release(keys[0])
    for key in keys[3:]:
        fetch(cache, objects, key)
        cache.release(key)
        assert cache.usage() <= 3500
    present = {k for k in keys if cache.cached_path(k).exists()}
    assert present == {keys[3], keys[4], keys[5]}
    assert cache.stats.evictions == 3 and cache.stats.over_budget == 0
    fetch(cache, objects, keys[1])  # an evicted file is simply fetched again
    assert len(store.downloads()) == 7


def test_a_file_in_use_is_never_evicted(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 4, 1000)
    keys = sorted(objects)
    reader = ShardCache(store, tmp_path / "cache", 2500)
    fetch(reader, objects, keys[0])  # pinned by the reader until released
    other = ShardCache(store, tmp_path / "cache", 2500)  # another process's view of the same cache
    for key in keys[1:]:
        fetch(other, objects, key)
        other.release(key)
    assert reader.cached_path(keys[0]).read_bytes() == objects[keys[0]][2]
    assert other.usage() <= 2500 and not other.cached_path(keys[1]).exists()
    reader.release(keys[0])
    fetch(other, objects, keys[1])
    assert not other.cached_path(keys[0]).exists()


def test_prefetch_downloads_in_the_background_and_reads_then_hit(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 3, 2000, delay_s=0.1)
    cache = ShardCache(store, tmp_path / "cache", 100_000)
    futures = cache.prefetch([(k, sha, size) for k, (sha, size, _) in objects.items()])
    assert len(futures) == 3
    for f in futures:
        f.result(timeout=30)
    for key in objects:
        assert fetch(cache, objects, key) == objects[key][2]
    assert len(store.downloads()) == 3 and cache.stats.prefetch_errors == 0


def test_datasets_do_not_collide_and_keys_cannot_escape(tmp_path: Path) -> None:
    a = FileStore(tmp_path / "store" / "ds" / "id-a")
    b = FileStore(tmp_path / "store" / "ds" / "id-b")
    a.put_bytes("train/shard-00000.bin", b"aaaa")
    b.put_bytes("train/shard-00000.bin", b"bbbbbb")
    ca, cb = ShardCache(a, tmp_path / "cache", 1000), ShardCache(b, tmp_path / "cache", 1000)
    pa = ca.path("train/shard-00000.bin", sha256_bytes(b"aaaa"), 4)
    pb = cb.path("train/shard-00000.bin", sha256_bytes(b"bbbbbb"), 6)
    assert pa != pb and pa.read_bytes() == b"aaaa" and pb.read_bytes() == b"bbbbbb"
    for bad in ("../../etc/passwd", "/etc/passwd", "train/.pw-part-x"):
        with pytest.raises(ValueError):
            ca.path(bad, "0" * 64, 1)
    with pytest.raises(ValueError, match="namespace"):
        ShardCache(a, tmp_path / "cache", 1000, namespace="../up")
    with pytest.raises(ValueError, match="larger than the cache bound"):
        ShardCache(b, tmp_path / "c2", 5).path("train/shard-00000.bin", sha256_bytes(b"bbbbbb"), 6)


def test_pickles_without_its_process_state(tmp_path: Path) -> None:
    store, objects = make_objects(tmp_path, 1, 100)
    cache = ShardCache(store, tmp_path / "cache", 10_000)
    key = next(iter(objects))
    fetch(cache, objects, key)
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.root == cache.root and clone.namespace == cache.namespace and not clone._pins
    assert fetch(clone, objects, key) == objects[key][2] and clone.stats.downloads == 0


def _read_in_forked_child(cache: ShardCache, key: str, sha: str, size: int, out) -> None:
    out.put(hashlib.sha256(cache.path(key, sha, size).read_bytes()).hexdigest())


@pytest.mark.distributed
def test_a_worker_forked_during_a_background_download_does_not_inherit_its_lock(tmp_path: Path) -> None:
    """A DataLoader worker forked while a prefetch thread holds a key lock must not keep that lock held."""
    store, objects = make_objects(tmp_path, 1, 4096, delay_s=1.0)
    key = "train/shard-00000.bin"
    sha, size, _ = objects[key]
    cache = ShardCache(store, tmp_path / "cache", 1 << 20)
    (future,) = cache.prefetch([(key, sha, size)])
    assert store.started.wait(30)  # the prefetch thread now holds the key lock, inside the slow download
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_read_in_forked_child, args=(cache, key, sha, size, out))
    child.start()
    future.result(timeout=30)
    child.join(timeout=20)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, "the forked reader hung on a lock it inherited"
    assert out.get(timeout=5) == sha and len(store.downloads()) == 1
