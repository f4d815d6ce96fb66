"""A Dask worker preload: worker processes ignore Ctrl-C (and a closed terminal's SIGHUP), which the flow's process
handles.

A terminal sends SIGINT to its whole foreground process group, and the local cluster's worker processes are in
it: each would die with a ``KeyboardInterrupt`` traceback (dozens of lines) before the command's one-line
message. The flow's process shuts them down when it stops; until then they finish or drop the task at hand.
Loaded through Dask's public ``preload`` option (``flows/runtime/runners.py``), in each worker process.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any


def _not_a_cancelled_task(record: logging.LogRecord) -> bool:
    """Drop Dask's warning about a task cancelled while it ran: what the flow's shutdown does after Ctrl-C."""
    message = record.getMessage()
    return not (message.startswith("Async instruction for") and "cancelled" in message)


def dask_setup(worker: Any) -> None:
    """Called by Dask in the worker process at start-up, on its main thread (the only one that may set it)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    logging.getLogger("distributed.worker.state_machine").addFilter(_not_a_cancelled_task)
