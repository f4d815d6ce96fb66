"""Terminal progress bars per stage (rich), fed by the tasks of the running flow.

Only the process that runs the flow shows bars: it advances them as each chunk task of a pass completes (tasks
in worker processes have no terminal of their own), and whatever the task runner. Prefect progress artifacts are the UI's equivalent (flows/artifacts.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StageProgress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._tasks: dict[str, int] = {}

    def start(self, totals: dict[str, int], enabled: bool | None = None) -> None:
        enabled = sys.stderr.isatty() if enabled is None else enabled
        if not enabled:
            return
        with self._lock:
            self._progress = Progress(
                TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                transient=False,
            )  # fmt: skip
            self._tasks = {name: self._progress.add_task(name, total=total) for name, total in totals.items()}
            self._progress.start()

    @contextlib.contextmanager
    def step(self, stage: str) -> Iterator[None]:
        yield
        self.advance(stage)

    def advance(self, stage: str, units: int = 1) -> None:
        with self._lock:
            if self._progress is not None and stage in self._tasks:
                self._progress.advance(self._tasks[stage], units)

    def __reduce__(self) -> tuple[Any, ...]:
        # build_corpus's globals travel with the flow to Dask workers (the flow function is pickled by value);
        # the bars and their lock belong to the flow's process, so a copy elsewhere is that process's own instance.
        return (_shared_progress, ())

    def stop(self) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
            self._progress = None
            self._tasks = {}


stage_progress = StageProgress()


def _shared_progress() -> StageProgress:
    return stage_progress
