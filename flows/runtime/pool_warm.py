"""Imported before the local workers fork (one of :data:`flows.runtime.pool.PRELOAD`): what each worker would
otherwise load on its first call, loaded once here and shared by every fork.

pyarrow imports pandas, when it is installed, the first time a process converts a Python list (``pa.array``,
``pa.table``: the first part a worker writes). That is 0.23 CPU-s per process on the 2-core machine, paid by
each of N workers at once while the command imports Prefect beside them, and by the command again when it reads
the dedup audit's texts at the end (the figures: tests/bench/README.md, bench_overhead, issue 46)."""

from __future__ import annotations

import pyarrow as pa

pa.array([""])  # pyarrow's own check for pandas input, through its public API
