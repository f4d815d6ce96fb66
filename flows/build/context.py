"""What every build task shares: the :class:`BuildContext` it receives (the store, the work folder, the resolved
config), the retry policy of I/O tasks, the failure that names the stage and the part, and :func:`run_unit`, the
per-part unit runner that reuses a unit from an earlier build when its key matches (``pipeline/units/cache.py``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from flows.runtime import profile, shutdown
from flows.runtime.heartbeat import beat_also, current_flow_run_id
from flows.runtime.pool import WorkerDied
from pipeline.corpus_config import CorpusConfig, config_from_dict
from pipeline.errors import StageFailed, UnitNotDone
from pipeline.storage import ObjectStore, open_store
from pipeline.storage.janitor import abort_recorded_uploads
from pipeline.storage.options import S3Options
from pipeline.storage.retry import is_permanent
from pipeline.storage.uploads import UploadJournal, hold_lease, release_lease
from pipeline.units import cache as unitcache
from pipeline.units.protocol import WRITER, StageStats, intact_marker, part_unit

log = logging.getLogger(__name__)


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: a whole-unit retry for transient trouble only; a missing input, missing
    credentials, access denied, a missing bucket, a bad config or a full disk fail the run at once, and so does
    a task whose worker died on every fresh pool it was given (``flows/runtime/workers.py``)."""
    exc = state.result(raise_on_failure=False)
    return not (is_permanent(exc) or isinstance(exc, WorkerDied))


# Each S3 call already retries its own transient errors (pipeline.storage.retry); these are for whole units.
IO_RETRIES: dict[str, Any] = dict(
    retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=_worth_retrying
)


@dataclass(frozen=True)
class BuildContext:
    """What every task needs to find its inputs: the store, the work folder and the resolved config."""

    store_uri: str
    work: str
    config: dict[str, Any]
    parts: int = 0  # how many parts the build has (task run names say "parts 1-8/12")
    lease: str = ""  # the build's run id, which its upload records carry (take_build_lease)

    @property
    def cfg(self) -> CorpusConfig:
        return _parsed_config(json.dumps(self.config, sort_keys=True))

    def store(self) -> ObjectStore:
        store = open_store(self.store_uri, self.cfg.s3)
        store.uploads = UploadJournal(store, run=self.lease)  # multipart uploads recorded until they end
        return store

    def folder(self, name: str) -> str:
        return f"{self.work}/{name}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=8)
def _parsed_config(config_json: str) -> CorpusConfig:
    """Each process parses a build's config once (about 15 ms), not once per task and step."""
    return config_from_dict(json.loads(config_json))


def build_context(data: dict[str, Any]) -> BuildContext:
    return BuildContext(**data)


# ---------------------------------------------------------------- failures name the stage and the part


@contextlib.contextmanager
def stage_errors(stage: str, part: int | None = None) -> Iterator[None]:
    try:
        yield
    except StageFailed:
        raise
    except Exception as exc:
        where = f"stage {stage!r}" + (f" part {part}" if part is not None else "")
        raise StageFailed(f"{where} failed: {type(exc).__name__}: {exc}") from exc


DAMAGE_ROUNDS = 3  # runs of a build's steps: a unit read as damaged is recomputed by the next one


def unit_not_done(exc: BaseException | None) -> UnitNotDone | None:
    """The :class:`UnitNotDone` behind a failed step, if any: a unit whose reader found its bytes damaged (and
    dropped its marker: :class:`UnitDamaged`), or one another task's reader just dropped. Running the steps
    again recomputes it."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, UnitNotDone):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


# ---------------------------------------------------------------- per-part units (cached across builds)


def run_unit(store: ObjectStore, stage: str, key: str, folder: str, index: int, run: Any) -> dict[str, Any]:
    """Restore the unit from an earlier build when its key matches, else run it; then register it. ``reused``:
    the unit was not computed by this build run (restored, or done by an earlier run of the work folder) and its
    outputs checked intact; a restored unit found damaged is named, recomputed and not counted, and so is one this
    run computed before its steps ran again (its marker names the run: the store's upload journal's)."""
    run_id = store.uploads.run  # the build's run id (BuildContext.store), which its markers record
    with stage_errors(stage, index):
        records: list[dict[str, Any]] = []
        with profile.measure(stage, records):
            unitcache.restore(store, stage, key, folder, index)
            done = intact_marker(store, part_unit(folder, index))
            if done is None:
                token = WRITER.set(run_id)
                try:
                    stats = run(store)
                finally:
                    WRITER.reset(token)
            else:
                stats = StageStats.from_json(done["stats"])
            unitcache.record(store, stage, key, folder, index)
    reused = done is not None and not (run_id and done.get("run") == run_id)
    return {"stats": stats.to_json(), "key": key, "reused": reused, "profile": records}


# ---------------------------------------------------------------- the build's lease on its store


def take_build_lease(store: ObjectStore, s3: S3Options | None, run: str | None = None) -> str:
    """Hold this build's lease on ``store`` (refreshed by the flow's heartbeat), then clear what dead runs
    left: their temp files and the uploads they recorded (a live build's are left alone, whatever their age).
    Returns the run id the build's upload records carry: ``run`` (the lease the head start took before the
    flow, ``flows/build/head_start.py``), else the flow run's id."""
    shutdown.reclaim_signals()  # the first thing a build's flow run does on its main thread
    run = run or current_flow_run_id() or uuid.uuid4().hex
    hold_lease(store, run)
    beat_also(functools.partial(refresh_lease, store, run))
    shutdown.at_stop(f"lease {store.uri} {run}", functools.partial(release_on_stop, store, run))
    removed = store.remove_dead_temp_files()
    aborted, journal = 0, UploadJournal(store)
    # a cloud SDK (boto3: 0.1-0.2 CPU-s) loads only where a dead run recorded an upload, never for a local build
    if s3 is not None and journal.records():
        aborted = abort_recorded_uploads(journal, s3)
    if removed or aborted:
        log.info(
            "removed %d temp file(s) and %d upload(s) of dead runs under %s", removed, aborted, store.uri
        )
    return run


_LEASE_LOCK = threading.Lock()  # a heartbeat's refresh never lands after the stop's release


def refresh_lease(store: ObjectStore, run: str) -> None:
    """The heartbeat's refresh of the build's lease, unless the command is stopping (it releases the lease)."""
    with _LEASE_LOCK:
        if not shutdown.STOPPING.is_set():
            hold_lease(store, run)


def release_on_stop(store: ObjectStore, run: str) -> None:
    """Release the lease of a build whose command stops (Ctrl-C, SIGTERM): a janitor or another build need not
    wait for its expiry, and its temp files and uploads are known to be a dead run's."""
    with _LEASE_LOCK:
        release_lease(store, run)
