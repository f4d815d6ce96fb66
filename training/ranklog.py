"""Rank-prefixed logging: every line a rank writes starts ``[Rank N]``, its own and its libraries'.

Named ``ranklog`` (not ``logging``) so it never shadows the standard library. The prefix is added by a
``logging.Formatter`` on the root handler, so DeepSpeed's, torch's and ``warnings``' records get it too, and
multi-line messages (tracebacks) are prefixed line by line so a merged log of N ranks can be split with grep.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Set to "0" by a parent that timestamps the lines itself (the Prefect train flow logs every rank line).
LOG_TIME_ENV = "PILEWORKS_RANK_LOG_TIME"
FORMAT_NO_TIME = "%(levelname)s %(name)s: %(message)s"  # under a flow, whose log line carries the time
# Loggers whose INFO records are noise on every rank: distutils' compiler (DeepSpeed's op builders probe gcc for
# libaio and CPU features at import, although no op is built in the training path).
QUIET_LOGGERS = ("compilers", "distutils", "setuptools", "DeepSpeed")
# Deprecations raised inside DeepSpeed's own torch calls (not ours); nothing a user can act on.
THIRD_PARTY_DEPRECATIONS = (
    r".*all_gather_into_tensor.* is deprecated",
    r".*reduce_scatter_tensor.* is deprecated",
)


class RankFormatter(logging.Formatter):
    """Prefix every line of a formatted record, traceback included, with ``[Rank N]``."""

    def __init__(self, rank: int, fmt: str = FORMAT) -> None:
        super().__init__(fmt)
        self.prefix = f"[Rank {rank}] "

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return "\n".join(self.prefix + line for line in text.splitlines() or [""])


class PrefixedStream:
    """A text stream that prefixes each line written to it: catches libraries' bare ``print`` calls (DeepSpeed's
    op-builder messages) and uncaught tracebacks, which never pass through ``logging``."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream = stream
        self.prefix = prefix
        self._at_line_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start and not piece.startswith(self.prefix):
                out.append(self.prefix)
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def setup_rank_logging(rank: int, level: int = logging.INFO, *, timestamps: bool | None = None) -> None:
    """Route the root logger, DeepSpeed's own logger, ``warnings`` and bare prints through ``[Rank N]``.

    DeepSpeed installs its own ``StreamHandler`` on the ``DeepSpeed`` logger with ``propagate=False``; we remove
    it so its records reach our handler and carry the prefix as well.
    """
    if timestamps is None:
        timestamps = os.environ.get(LOG_TIME_ENV, "1") != "0"
    prefix = f"[Rank {rank}] "
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, PrefixedStream):
            stream.prefix = prefix  # called again once the rank is known for sure
        else:
            setattr(sys, name, PrefixedStream(stream, prefix))
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(RankFormatter(rank, FORMAT if timestamps else FORMAT_NO_TIME))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("DeepSpeed", "deepspeed", "torch.distributed", "torch.distributed.elastic"):
        lib = logging.getLogger(name)
        for old in list(lib.handlers):
            lib.removeHandler(old)
        lib.propagate = True
    # DeepSpeed logs each engine detail at INFO; keep warnings and up from it (and the gcc probes), ours at INFO.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)
    warnings.filterwarnings("once", category=FutureWarning)
    for pattern in THIRD_PARTY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
