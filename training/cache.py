"""A node-local cache of dataset shards: fetched on demand, verified, size-bounded, shared by every process.

Layout under ``root`` (one namespace per dataset, so two datasets never collide)::

    <namespace>/data/<key>        the shard, exactly as in the store
    <namespace>/meta/<key>.json   sidecar: sha256 and size it was verified against; its mtime is the last use
    <namespace>/locks/<key>.lock  fcntl lock serialising fetch/verify/evict of one key across processes
    .pw-evict.lock                serialises space reservation and eviction

Guarantees and why:

* **One download per node.** Every rank and DataLoader worker of a node calls :meth:`ShardCache.path`; the
  per-key ``flock`` makes the first caller download while the others wait and then find the file.
* **Verified.** A download goes to a temp name, is checked against the manifest's sha256 and only then renamed
  into place. A cached file is checked by size on every open and by sha256 once per process, so a corrupted
  cache entry is detected and fetched again.
* **Bounded, never evicting a file in use.** Before a download the cache frees space in least-recently-used
  order (sidecar mtime). A process using a file holds a shared ``flock`` on it (a *pin*); eviction takes an
  exclusive non-blocking ``flock`` and skips pinned files. The space of a download in flight is reserved by a
  placeholder of its final size, so concurrent fetches do not overshoot the bound together.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.storage import ObjectStore, StorageError, normalize_key, sha256_file

log = logging.getLogger(__name__)

PART_PREFIX = ".pw-part-"
_EVICT_LOCK = ".pw-evict.lock"
_TOUCH_EVERY_S = 5.0  # LRU resolution: at most one sidecar utime per file per process per interval
_FETCH_ATTEMPTS = 2
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class CacheStats:
    """Counters of this process (what a log line or a test needs to see what the cache did)."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    corrupt_refetches: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    over_budget: int = 0
    prefetch_errors: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def default_namespace(store: ObjectStore) -> str:
    """``<last path component>-<hash of the URI>``: the dataset id for a store rooted at a dataset prefix."""
    uri = store.uri.rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", uri.rsplit("/", 1)[-1]).lstrip("._-")[:48] or "store"
    return f"{tail}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


# ------------------------------------------------------------ lock descriptors and fork
# A flock belongs to the open file description, which a fork shares with the child. If a DataLoader worker
# were forked while a prefetch thread holds a key lock, the child's copy would keep that lock held after the
# parent releases it, and the child would then wait for it forever. So every descriptor that holds (or is
# about to hold) a flock is registered, the registry is frozen across fork, and the child closes its copies
# at once (the parent's locks are unaffected: its own descriptors stay open).
_fd_registry_lock = threading.Lock()
_lock_fds: set[int] = set()


def _open_lock_fd(path: Path, flags: int) -> int:
    with _fd_registry_lock:
        fd = os.open(path, flags, 0o644)
        _lock_fds.add(fd)
    return fd


def _close_lock_fd(fd: int) -> None:
    with _fd_registry_lock:
        _lock_fds.discard(fd)
        os.close(fd)  # closing the last descriptor of the description releases its lock


def _after_fork_in_child() -> None:
    for fd in _lock_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()
    _fd_registry_lock.release()


os.register_at_fork(
    before=_fd_registry_lock.acquire,
    after_in_parent=_fd_registry_lock.release,
    after_in_child=_after_fork_in_child,
)


@contextlib.contextmanager
def _flocked(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock_fd(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        _close_lock_fd(fd)


def _try_flock(path: Path, mode: int, create: bool = False) -> int | None:
    """A registered descriptor holding ``mode | LOCK_NB`` on ``path``, or None when held elsewhere or gone."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock_fd(path, os.O_RDWR | os.O_CREAT)
        else:
            fd = _open_lock_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        _close_lock_fd(fd)
        return None
    return fd


class ShardCache:
    """Fetch objects of ``store`` into ``root`` on demand, bounded by ``max_bytes`` (see the module docstring).

    Safe to share between threads, across ``fork`` (DataLoader workers) and to pickle (spawn): the runtime
    state (pins, locks, the prefetch pool) is rebuilt per process.
    """

    def __init__(
        self,
        store: ObjectStore,
        root: str | Path,
        max_bytes: int,
        *,
        namespace: str | None = None,
        prefetch_threads: int = 2,
        clock: Callable[[], float] = time.time,
    ):
        """``clock``: the time of a use, which orders eviction (the wall clock; a test gives its own)."""
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if prefetch_threads < 1:
            raise ValueError(f"prefetch_threads must be >= 1, got {prefetch_threads}")
        namespace = namespace or default_namespace(store)
        if not _NAMESPACE_RE.match(namespace):
            raise ValueError(
                f"namespace {namespace!r} must be 1-128 of [A-Za-z0-9._-], not starting with '.'"
            )
        self.store = store
        self.root = Path(root).expanduser().resolve()
        self.max_bytes = int(max_bytes)
        self.namespace = namespace
        self.prefetch_threads = prefetch_threads
        self.clock = clock
        self.root.mkdir(parents=True, exist_ok=True)
        self._reset_runtime()

    # ------------------------------------------------------------ per-process state

    def _reset_runtime(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._verified: set[tuple[str, str]] = set()  # (key, sha256) checked by this process
        self._pins: dict[str, int] = {}  # key -> fd holding LOCK_SH on the data file
        self._touched: dict[str, float] = {}
        self._pending: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.stats = CacheStats()

    def _runtime(self) -> None:
        if self._pid != os.getpid():
            # A forked child: the parent's threads are gone and its mutex may be held forever; the child's
            # copies of the parent's pin descriptors were already closed at fork (the parent keeps its pins).
            verified = self._verified
            self._reset_runtime()
            self._verified = set(verified)

    def __getstate__(self) -> dict:
        keep = ("store", "root", "max_bytes", "namespace", "prefetch_threads", "clock")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    # ------------------------------------------------------------ paths

    def _paths(self, key: str) -> tuple[Path, Path, Path]:
        norm = normalize_key(key)
        if norm.endswith("/") or Path(norm).name.startswith(PART_PREFIX):
            raise ValueError(f"cache key {key!r} is not a plain object name")
        base = self.root / self.namespace
        paths = (base / "data" / norm, base / "meta" / (norm + ".json"), base / "locks" / (norm + ".lock"))
        for p in paths:
            if base not in p.resolve().parents:
                raise ValueError(f"cache key {key!r} resolves outside the cache root {self.root}")
        return paths

    def cached_path(self, key: str) -> Path:
        """Where ``key`` lives once fetched (no fetching, no checks)."""
        return self._paths(key)[0]

    # ------------------------------------------------------------ the public operations

    def path(self, key: str, sha256: str, size: int) -> Path:
        """The local path of ``key``, fetched and verified if needed, and pinned until :meth:`release`."""
        self._runtime()
        data, meta, lock = self._paths(key)
        with self._mutex:
            fast = key in self._pins and (key, sha256) in self._verified
        if fast and _size_of(data) == size:
            self.stats.hits += 1
            self._touch(key, meta)
            return data
        with _flocked(lock):
            self._ensure_valid(key, sha256, size, data, meta)
            self._pin(key, data)
        return data

    def release(self, key: str) -> None:
        """Unpin ``key`` in this process: it may be evicted again once no other process uses it."""
        self._runtime()
        with self._mutex:
            fd = self._pins.pop(key, None)
        if fd is not None:
            _close_lock_fd(fd)

    def close(self) -> None:
        """Release every pin and stop the prefetch pool (pending downloads finish first)."""
        self._runtime()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        for key in list(self._pins):
            self.release(key)

    def prefetch(self, items: Iterable[tuple[str, str, int]]) -> list[Future]:
        """Fetch ``(key, sha256, size)`` items in background threads (not pinned); errors are logged and counted.

        Returns the futures of the downloads it started, so a caller may wait for them.
        """
        self._runtime()
        started = []
        for key, sha256, size in items:
            with self._mutex:
                if key in self._pending or (key in self._pins and (key, sha256) in self._verified):
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.prefetch_threads, thread_name_prefix="pw-prefetch")
                future = self._pool.submit(self._prefetch_one, key, sha256, size)
                self._pending[key] = future
            started.append(future)
        return started

    def _prefetch_one(self, key: str, sha256: str, size: int) -> None:
        try:
            data, meta, lock = self._paths(key)
            with _flocked(lock):
                self._ensure_valid(key, sha256, size, data, meta)
        except Exception as exc:
            self.stats.prefetch_errors += 1
            log.warning("prefetch of %s failed (the read will retry and raise): %s", key, exc)
        finally:
            with self._mutex:
                self._pending.pop(key, None)

    def usage(self) -> int:
        """Bytes held by cached files and reserved by downloads in flight, over every namespace."""
        return sum(size for _path, size, _used in self._scan())

    # ------------------------------------------------------------ fetch and verify (key lock held)

    def _ensure_valid(self, key: str, sha256: str, size: int, data: Path, meta: Path) -> None:
        if data.exists():
            if self._cached_is_valid(key, sha256, size, data, meta):
                self.stats.hits += 1
                self._touch(key, meta, force=True)
                return
            self.stats.corrupt_refetches += 1
            log.warning("cached %s failed verification (size or sha256): fetching it again", data)
            _unlink(data)
            _unlink(meta)
        self._download(key, sha256, size, data, meta)

    def _cached_is_valid(self, key: str, sha256: str, size: int, data: Path, meta: Path) -> bool:
        if _size_of(data) != size:
            return False
        with self._mutex:
            if (key, sha256) in self._verified:
                return True
        if sha256_file(data) != sha256:
            return False
        self._record_verified(key, sha256, size, meta)
        return True

    def _record_verified(self, key: str, sha256: str, size: int, meta: Path) -> None:
        with self._mutex:
            self._verified.add((key, sha256))
        record = {
            "key": key,
            "sha256": sha256,
            "size": size,
            "store": self.store.uri,
            "verified_at": time.time(),
        }
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_name(f"{PART_PREFIX}{uuid.uuid4().hex}.json")
        tmp.write_text(json.dumps(record))
        now = self.clock()  # the sidecar's mtime is the last use, on the cache's clock
        os.utime(tmp, (now, now))
        os.replace(tmp, meta)

    def _download(self, key: str, sha256: str, size: int, data: Path, meta: Path) -> None:
        for attempt in range(1, _FETCH_ATTEMPTS + 1):
            part = self._reserve(data, size)
            try:
                self.store.get_file(key, part)
                got_size, got_sha = _size_of(part), sha256_file(part)
                if got_size == size and got_sha == sha256:
                    os.replace(part, data)
                    self.stats.downloads += 1
                    self.stats.bytes_downloaded += size
                    self._record_verified(key, sha256, size, meta)
                    return
                log.warning(
                    "download %d of %s: got %d bytes sha256 %s, expected %d bytes %s",
                    attempt,
                    self.store.uri_of(key),
                    got_size,
                    got_sha,
                    size,
                    sha256,
                )
            finally:
                _unlink(part)
        raise StorageError(
            f"{self.store.uri_of(key)} does not match the manifest (size {size}, sha256 "
            f"{sha256}) after {_FETCH_ATTEMPTS} downloads: the dataset in the store is corrupt"
        )

    def _reserve(self, data: Path, size: int) -> Path:
        """Free space for ``size`` bytes and claim it with a placeholder the download then replaces."""
        if size > self.max_bytes:
            raise ValueError(
                f"{data.name} is {size} bytes, larger than the cache bound max_bytes={self.max_bytes}"
            )
        data.parent.mkdir(parents=True, exist_ok=True)
        part = data.with_name(f"{PART_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{data.name}")
        with _flocked(self.root / _EVICT_LOCK):
            self._evict_until(self.max_bytes - size)
            with open(part, "wb") as f:
                f.truncate(size)
        return part

    # ------------------------------------------------------------ LRU eviction (evict lock held)

    def _scan(self) -> list[tuple[Path, int, float]]:
        """(data path, size, last use) of every cached file and placeholder under root."""
        found = []
        for ns in self.root.iterdir() if self.root.is_dir() else ():
            data_root = ns / "data"
            for dirpath, _dirs, files in os.walk(data_root):
                for name in files:
                    path = Path(dirpath) / name
                    with contextlib.suppress(FileNotFoundError):
                        size = path.stat().st_size
                        meta = ns / "meta" / (path.relative_to(data_root).as_posix() + ".json")
                        used = _mtime_of(meta) if not name.startswith(PART_PREFIX) else float("inf")
                        found.append((path, size, used))
        return found

    def _evict_until(self, budget: int) -> None:
        entries = self._scan()
        usage = sum(size for _p, size, _u in entries)
        for path, size, _used in sorted(entries, key=lambda e: e[2]):
            if usage <= budget:
                return
            if not path.name.startswith(PART_PREFIX) and self._evict(path):
                usage -= size
                self.stats.evictions += 1
                self.stats.bytes_evicted += size
        if usage > budget:
            self.stats.over_budget += 1
            log.warning(
                "shard cache %s holds %d bytes in pinned files or downloads; the bound %d is exceeded "
                "until they are released",
                self.root,
                usage,
                self.max_bytes,
            )

    def _evict(self, data: Path) -> bool:
        ns = self.root / data.relative_to(self.root).parts[0]
        rel = data.relative_to(ns / "data").as_posix()
        lock_fd = _try_flock(ns / "locks" / (rel + ".lock"), fcntl.LOCK_EX, create=True)
        if lock_fd is None:
            return False  # being fetched or verified right now
        try:
            data_fd = _try_flock(data, fcntl.LOCK_EX)
            if data_fd is None:
                return False  # pinned by a reader (or already gone)
            try:
                _unlink(data)
                _unlink(ns / "meta" / (rel + ".json"))
            finally:
                _close_lock_fd(data_fd)
            log.debug("evicted %s", data)
            return True
        finally:
            _close_lock_fd(lock_fd)

    # ------------------------------------------------------------ pins and LRU touches

    def _pin(self, key: str, data: Path) -> None:
        with self._mutex:
            if key in self._pins:
                return
        fd = _open_lock_fd(data, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        with self._mutex:
            if key in self._pins:
                _close_lock_fd(fd)
            else:
                self._pins[key] = fd

    def _touch(self, key: str, meta: Path, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._touched.get(key, 0.0) < _TOUCH_EVERY_S:
            return
        self._touched[key] = now
        with contextlib.suppress(FileNotFoundError):
            os.utime(meta, (now, now))


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _mtime_of(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0  # no sidecar: an orphan from a crash, the first to go


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
