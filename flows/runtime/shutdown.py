"""The command is stopping (Ctrl-C, SIGTERM): what every part of the runtime checks before it starts more work."""

from __future__ import annotations

import threading

STOPPING = threading.Event()  # set when the command was told to stop
