"""After tokenizer training the flow's process hands its freed heap back to the system, so the shard step's
allocations do not stack on top of the trainer's (the process's peak stays that of training)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flows import runners

PROBE = textwrap.dedent(
    """
    import psutil
    from flows.runners import release_free_memory
    rss = lambda: psutil.Process().memory_info().rss >> 20
    blocks = [bytes(2000) for _ in range(100_000)]  # ~200 MB on the C heap (over pymalloc's 512 bytes)
    kept = blocks[::50]  # a block every 100 KB stays: the freed space is in holes, glibc does not trim it
    del blocks
    before = rss()
    assert release_free_memory()
    print(before, rss(), len(kept))
    """
)


def test_free_heap_pages_go_back_to_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    before, after, _ = map(int, out.stdout.split())
    assert before - after > 100, (before, after)


def test_without_glibc_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*_a: object) -> None:
        raise OSError("no libc here")

    monkeypatch.setattr(runners.ctypes, "CDLL", no_libc)
    assert runners.release_free_memory() is False
