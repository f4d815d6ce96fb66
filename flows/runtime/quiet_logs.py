"""Logs with signal: drop Prefect's per-task "Finished in state Completed()" line, keep everything else.

A build runs dozens of tasks; that line was about 70% of its log tab. Failures ("Finished in state Failed(...)"),
our stage summaries and warnings stay. The filter sits on the ``prefect.task_runs`` logger itself, so it applies
before any handler (console or the API handler that feeds the UI) and whatever logging config Prefect loads later.
"""

from __future__ import annotations

import logging

TASK_RUN_LOGGER = "prefect.task_runs"


class DropCompletedTaskLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno <= logging.INFO
            and isinstance(record.msg, str)
            and record.msg.startswith("Finished in state Completed(")
        )


def install() -> None:
    """Idempotent: one filter on the task-run logger of this process."""
    logger = logging.getLogger(TASK_RUN_LOGGER)
    if not any(isinstance(f, DropCompletedTaskLines) for f in logger.filters):
        logger.addFilter(DropCompletedTaskLines())
