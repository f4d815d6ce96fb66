"""The terminal display of one command: log lines scroll above one live row (rich), plain lines elsewhere.

``pileworks`` opens the display once per command (:func:`open_display`) when stdout and stderr are terminals:
the root logger then writes through rich's console, so every log line is printed *above* the live row instead of
leaving stale copies of bars behind. The row is a spinner with the current stage (``dedup``, ``launching 2
ranks``), a bar while the stage's size is known (build units, training steps) and, for training, the loss,
tokens/s and the time left. Flows report through the module-level :data:`display`; without an open display
(not a terminal, a Dask worker, a deployment run, tests) the reports cost nothing, and stage changes still reach
the log as plain lines.

Only the process that runs the flow with the local (thread) task runner shows the row; tasks on Dask workers or
in subprocesses don't report here. The Prefect UI's equivalent is a progress artifact: :class:`RunProgress` below
for the build (the same stage names as the terminal's bars), ``flows/train/live.py`` for training steps.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID

logger = logging.getLogger("pileworks")

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Display:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress: Any = None  # rich.progress.Progress while open
        self._row: Any = None
        self._stage: str | None = None
        self._totals: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._refresher: threading.Thread | None = None
        self._stop_refresh = threading.Event()

    @property
    def live(self) -> bool:
        return self._progress is not None

    def open(self, console: Any) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

        with self._lock:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=30),
                TextColumn("{task.fields[detail]}"),
                TimeRemainingColumn(compact=True, elapsed_when_finished=True),
                console=console,
                transient=True,
                auto_refresh=False,  # refreshed by a thread of ours, which :meth:`paused` can join
            )
            self._row = self._progress.add_task("starting", total=None, detail="")
            self._progress.start()
        self._start_refresher()

    def _start_refresher(self) -> None:
        self._stop_refresh.clear()
        self._refresher = threading.Thread(target=self._refresh, name="pileworks-display", daemon=True)
        self._refresher.start()

    def _refresh(self) -> None:
        """The spinner and the bars move four times a second, as rich's own refresh thread would move them."""
        while not self._stop_refresh.wait(0.25):
            with self._lock:
                if self._progress is not None:
                    self._progress.refresh()

    def _join_refresher(self) -> None:
        self._stop_refresh.set()
        if self._refresher is not None:
            self._refresher.join()
        self._refresher = None

    def close(self) -> None:
        self._join_refresher()
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
            self._progress, self._row, self._stage = None, None, None
            self._totals, self._done = {}, {}

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The live row's refresh thread stopped for the block (joined: no thread of it runs), then started again:
        a process about to fork must run no other thread, whose locks the child would keep. The row stays on
        the screen meanwhile, still."""
        running = self._refresher is not None
        self._join_refresher()
        try:
            yield
        finally:
            if running and self._progress is not None:
                self._start_refresher()

    def stage(self, name: str, total: int | None = None, completed: int = 0, detail: str = "") -> None:
        """A new stage: the spinner shows its name (and a bar when ``total`` is known); logged as a plain line."""
        with self._lock:
            changed = name != self._stage
            self._stage = name
            if self._progress is not None:
                self._progress.reset(
                    self._row, total=total, completed=completed, description=name, detail=detail
                )
        if changed and self._progress is None:
            logger.debug("stage: %s", name)

    def update(self, completed: int, total: int | None = None, detail: str = "") -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.update(self._row, completed=completed, total=total, detail=detail)

    # --- the build's per-part units (flows/build/tasks.py), counted per stage
    def start_units(self, totals: dict[str, int]) -> None:
        with self._lock:
            self._totals, self._done = dict(totals), dict.fromkeys(totals, 0)

    @contextlib.contextmanager
    def step(self, stage: str) -> Iterator[None]:
        yield
        self.advance(stage)

    def advance(self, stage: str, units: int = 1) -> None:
        """``units`` more of ``stage`` done (the flow reports a chunk task's parts as it completes)."""
        with self._lock:
            if stage not in self._totals:
                return
            self._done[stage] += units
            done, total = self._done[stage], self._totals[stage]
        self.stage(stage, total=total, completed=done, detail=f"{done}/{total} parts")

    def __reduce__(self) -> tuple[Any, ...]:
        # build_corpus's globals travel with the flow to Dask workers (the flow function is pickled by value);
        # the live row and its lock belong to the command's process, so a copy elsewhere is that process's own.
        return (_shared_display, ())


display = Display()
stage_progress = display  # the name the build flow and its tasks use


def _shared_display() -> Display:
    return display


def interactive() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


class TerminalFilter(logging.Filter):
    """What the terminal leaves out unless ``-v``: records marked ``extra={"terminal": False}`` (the launcher's
    banner) and Prefect's error records (their tracebacks), as the command ends with the failure in one line.
    Prefect's API log handler still receives them all, so the UI keeps the full story."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "terminal", True) is False:
            return False
        return not (record.name.startswith("prefect") and record.levelno >= logging.ERROR)


def setup_logging(verbose: bool, live: bool) -> Any:
    """Route the root logger to stderr: through rich's console above the live row, else one plain line each.

    Returns the rich console when ``live`` (for :func:`open_display`), else None.
    """
    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    console = None
    if live:
        from rich.console import Console
        from rich.logging import RichHandler

        console = Console(stderr=True)
        handler: logging.Handler = RichHandler(
            console=console, show_path=False, markup=False, rich_tracebacks=False, log_time_format="%H:%M:%S"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    if not verbose:
        handler.addFilter(TerminalFilter())
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "botocore", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    return console


@contextlib.contextmanager
def open_display(console: Any) -> Iterator[Display]:
    """The command's live row, closed (and erased) however the command ends."""
    if console is None:
        yield display
        return
    display.open(console)
    try:
        yield display
    finally:
        display.close()


class RunProgress:
    """A Prefect progress artifact for a long flow: the share of its stages done, and the last one finished.

    The build passes the same stage names as its terminal progress bars, so the UI and the terminal count alike.
    """

    def __init__(self, stages: list[str], key: str) -> None:
        from prefect.artifacts import create_progress_artifact

        self.stages, self.done = stages, 0
        created = create_progress_artifact(0.0, key=key, description=f"0/{len(stages)} stages")
        assert isinstance(created, UUID)  # the synchronous call returns the id
        self.id = created

    def finished(self, *stages: str) -> None:
        from prefect.artifacts import update_progress_artifact

        if not stages:
            return
        self.done = min(len(self.stages), self.done + len(stages))
        update_progress_artifact(
            self.id,
            100.0 * self.done / len(self.stages),
            description=f"{self.done}/{len(self.stages)} stages: {', '.join(stages)} done",
        )
