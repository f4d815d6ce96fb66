"""The build's fan-out arithmetic (``flows/build/plan.py``) over grids of sizes."""

from __future__ import annotations

import itertools

import pytest

from flows.build.plan import MIN_TASK_BYTES, chunks, min_parts_per_task, parts_per_task, sizing, unchunk


def test_parts_are_dealt_round_robin_and_gathered_back_in_order() -> None:
    """A pass's chunk tasks get every C-th part (neighbouring parts, which cost alike, go to different tasks),
    at most ``size`` each, and their results come back in part order."""
    for n, size in [(0, 4), (1, 4), (7, 3), (100, 13), (12, 12), (5, 1)]:
        items = list(range(n))
        dealt = chunks(items, size)
        assert len(dealt) == -(-n // size) and all(0 < len(c) <= size for c in dealt)
        assert sorted(i for c in dealt for i in c) == items and unchunk(dealt) == items
        assert all(c == items[k :: len(dealt)] for k, c in enumerate(dealt))
    assert chunks(list(range(10)), 4) == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_parts_per_task_keeps_every_worker_busy_and_bounds_the_task() -> None:
    """Over a grid of part and worker counts: between 1 and ``max_parts`` parts per task, every part in some task,
    and (below the cap) the fewest parts per task that keep to ``per_worker`` tasks per worker."""
    for parts, workers, per_worker, max_parts in itertools.product(
        (0, 1, 2, 7, 64, 100, 1000, 100_000), (1, 2, 3, 16, 128), (1, 4), (1, 8, 64)
    ):
        size = parts_per_task(parts, workers, max_parts=max_parts, per_worker=per_worker)
        assert 1 <= size <= max_parts
        tasks = -(-parts // size)
        assert tasks * size >= parts  # every part is in a task
        slots = per_worker * max(1, workers)
        if size < max_parts and parts:
            # not capped: no more than per_worker tasks per worker, and one part less per task would need more
            assert tasks <= slots and (size == 1 or -(-parts // (size - 1)) > slots)
    assert parts_per_task(1000, 2) == 64 and parts_per_task(16, 2) == 2 and parts_per_task(3, 8) == 1
    assert parts_per_task(10, 0) == 3  # no worker count: as if one


def test_a_small_build_runs_one_task_per_pass_and_a_large_one_is_unchanged() -> None:
    """A task gets at least MIN_TASK_BYTES of input (a task run's fixed cost is paid over real work), never more
    than ``max_parts``; at the default 32 MiB parts the floor is one part, the old sizing."""
    mib = 1024 * 1024
    sample = [700_000, 650_000, 720_000]  # the bundled sample: three small parts
    least = min_parts_per_task(sample)
    assert least >= len(sample) and parts_per_task(3, 1, min_parts=least) == 3  # one chunk per pass
    assert len(chunks(list(range(3)), parts_per_task(3, 2, min_parts=least))) == 1  # so one worker, not two
    assert min_parts_per_task([32 * mib] * 100) == 1
    assert parts_per_task(100, 2, min_parts=1) == parts_per_task(100, 2) == 13
    assert min_parts_per_task([4 * mib] * 10) == MIN_TASK_BYTES // (4 * mib)  # 40 MB of 4 MiB parts: 2 a task
    assert parts_per_task(10, 2, min_parts=2) == 2  # five tasks: both workers busy
    assert parts_per_task(1000, 2, max_parts=8, min_parts=100) == 8  # the cap still wins
    assert min_parts_per_task([]) == 1 and min_parts_per_task([0, 0]) == 2  # nothing planned: one task


def _plans(part_bytes: list[int]) -> list[dict]:
    return [{"pieces": [{"weight": b}]} for b in part_bytes]


def test_sizing_gives_one_worker_one_task_per_pass_and_several_workers_several_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At one worker a heavy pass is one task (up to ``max_parts`` parts): there is nothing to balance and every
    task run costs the flow and the server. At two, one task per worker until a worker's share passes
    ``HEAVY_TASK_SHARE`` least tasks' input, then up to four per worker, in whole rounds of tasks of the least size (one round for a
    small build); the flow's ``fit`` decides the workers from the widest pass's chunk count."""
    monkeypatch.delenv("PILEWORKS_MIN_TASK_BYTES", raising=False)
    mib = 1024 * 1024
    plans = _plans([4 * mib] * 10)  # 40 MB: at least two parts a task
    assert sizing(plans, 1) == (1, 10, 10)
    used, size, light = sizing(plans, 2)
    assert used == 2 and light == 5
    # 20 MB a worker: one task each (not four of 3, 3, 2 and 2 parts, whose task runs cost more than they balance)
    assert [len(c) for c in chunks(list(range(10)), size)] == [5, 5]
    assert len(chunks(list(range(38)), sizing(_plans([4 * mib] * 38), 2)[1])) == 2  # 150 MB: still one each
    # a share of twice 16 x 8 MiB: two each; 1.6 GB: four tasks per worker, as many as it gets
    assert len(chunks(list(range(128)), sizing(_plans([4 * mib] * 128), 2)[1])) == 4
    assert len(chunks(list(range(400)), sizing(_plans([4 * mib] * 400), 2)[1])) == 8
    assert [len(c) for c in chunks(list(range(10)), sizing(_plans([3 * mib] * 10), 2)[1])] == [
        5,
        5,
    ]  # one round
    assert sizing(plans, 8, fit=lambda widest: min(8, widest)) == (5, 2, 2)  # five chunks of two parts
    assert sizing(_plans([32 * mib] * 200), 1) == (1, 64, 64)  # the cap: a large build still has many tasks
    assert sizing(_plans([700_000, 650_000, 720_000]), 2) == (1, 3, 3)  # the sample: one worker
