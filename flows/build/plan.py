"""The build's fan-out arithmetic, pure functions: how many parts a task takes, and how parts are dealt to tasks
and gathered back (tested over grids of sizes in ``tests/flows/build/test_plan.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` dealt round-robin into as few chunks as hold at most ``size`` each: chunk k of C holds items k,
    k + C, k + 2C... Neighbouring parts come from the same inputs and cost alike (a run of repetitive or CJK
    files, say), so dealing them out gives every chunk task a like mix and the workers of a pass finish
    together instead of one waiting on the chunk of costly parts. :func:`unchunk` restores the order."""
    count = -(-len(items) // size)
    return [items[k::count] for k in range(count)]


def unchunk(chunked: list[list[Any]]) -> list[Any]:
    """The items of :func:`chunks` back in their order."""
    out: list[Any] = [None] * sum(map(len, chunked))
    for k, chunk in enumerate(chunked):
        out[k :: len(chunked)] = chunk
    return out


# A task run costs about 0.2 CPU-s in Prefect and Dask whatever it does, and a worker process a few CPU-s to start:
# a task gets at least this much input, so a small build runs one task per pass on one worker.
MIN_TASK_BYTES = 8 * 1024 * 1024

# A heavy pass is dealt as one task per worker until each worker's share passes this many times the least task
# input (:func:`min_task_bytes`: 128 MiB by default), then as up to four per worker (so a slow task leaves the
# others less idle at the end). A task run costs the flow's process and the
# Prefect server about 0.065 CPU-s between them, on the cores the workers use: at 150 MB on 2 workers (2026-12-05,
# bench_scale's corpus, the tokenizer trained) one task per worker built in 14.3-14.5 s, two 14.5-15.0 s, four
# 15.2-16.3 s (63 task runs against 39); at 400 MB the three were within the runs' spread (32.3-35.2 s).
HEAVY_TASK_SHARE = 16


def parts_per_task(
    num_parts: int, workers: int, max_parts: int = 64, per_worker: int = 4, min_parts: int = 1
) -> int:
    """Parts per task: about ``per_worker`` tasks per worker in each pass (four for the heavy passes, so a
    slow task does not leave the others idle at the end), at least ``min_parts`` (:func:`min_parts_per_task`;
    all the parts when fewer) and never more than ``max_parts`` (64 parts of the default 32 MiB), so a 100 GB
    build has a few dozen tasks per pass, not one per part."""
    balanced = -(-num_parts // (per_worker * max(1, workers)))
    return max(1, min(max_parts, max(min(min_parts, num_parts), balanced)))


def min_parts_per_task(part_bytes: list[int], task_bytes: int = MIN_TASK_BYTES) -> int:
    """The fewest parts per task that give a task about ``task_bytes`` of input, from the parts' planned bytes
    (all of them in one task when they hold none)."""
    total = sum(part_bytes)
    if total <= 0:
        return max(1, len(part_bytes))
    return max(1, -(-task_bytes * len(part_bytes) // total))


MIN_TASK_BYTES_ENV = "PILEWORKS_MIN_TASK_BYTES"


def min_task_bytes() -> int:
    """The least planned input a chunk task gets: ``$PILEWORKS_MIN_TASK_BYTES``, else :data:`MIN_TASK_BYTES`
    (how the work is dealt to tasks, never what it computes)."""
    text = os.environ.get(MIN_TASK_BYTES_ENV, "").strip()
    if not text:
        return MIN_TASK_BYTES
    if not text.isdigit():
        raise ValueError(f"{MIN_TASK_BYTES_ENV} must be a whole number of bytes, got {text!r}")
    return int(text)


def sizing(
    plans: list[dict[str, Any]], workers: int, fit: Callable[[int], int] | None = None
) -> tuple[int, int, int]:
    """``(workers, size, light)`` of a build over the part ``plans`` on at most ``workers``: no more workers than
    its widest pass has task chunks, each of at least :func:`min_task_bytes` of input (a small build: one chunk
    per pass, on one worker), and the parts per task of its heavy and light passes. ``fit`` (the flow's: it
    tells the task runner) turns the chunk count into the workers used; by default the smaller of the two.
    ``pileworks build`` computes it before Prefect (the head start) as the flow does after."""
    n = len(plans)
    part_bytes = [sum(p["weight"] for p in plan["pieces"]) for plan in plans]
    task_bytes = min_task_bytes()
    least = min_parts_per_task(part_bytes, task_bytes)
    widest = len(chunks(list(range(n)), parts_per_task(n, workers, min_parts=least)))
    used = fit(widest) if fit is not None else max(1, min(workers, widest))
    # up to four heavy tasks per worker so none idles at the end, in as many whole rounds as tasks of the least
    # size fill (a small build: one round, not a second of tasks near the least size, each ~0.1 s of the pass's
    # wall on two cores) and as each worker's share allows (:data:`HEAVY_TASK_SHARE`); one worker has nothing to
    # balance, and each task run costs the flow's process ~25 ms of CPU and the Prefect server as much again
    rounds = min(
        4, n // (used * max(1, min(least, n))), sum(part_bytes) // (used * HEAVY_TASK_SHARE * task_bytes)
    )
    heavy = max(1, rounds) if used > 1 else 1
    size, light = (parts_per_task(n, used, per_worker=k, min_parts=least) for k in (heavy, 1))
    return used, size, light
