"""A Dask worker preload: worker processes ignore Ctrl-C, which the flow's process handles.

A terminal sends SIGINT to its whole foreground process group, and the local cluster's worker processes are in
it: each would die with a ``KeyboardInterrupt`` traceback (dozens of lines) before the command's one-line
message. The flow's process shuts them down when it stops; until then they finish or drop the task at hand.
Loaded through Dask's public ``preload`` option (``flows/runtime/runners.py``), in each worker process.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    """Called by Dask in the worker process at start-up, on its main thread (the only one that may set it)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
