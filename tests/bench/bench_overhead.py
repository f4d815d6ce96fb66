"""What a build costs besides its stages: cold build, no-change rebuild and one-file-changed rebuild, at 1 and N
workers, for the bundled sample and a corpus of real text (``bench_scale.py``'s, ~40 MB by default).

Each build runs as its own ``pileworks build --json --workers W`` process against the local Prefect server
(started before the first build). Its CPU is the process tree's, exact (``getrusage`` of the waited children:
the flow process and the worker processes it started, and the workers' fork server, which this process adopts
and waits for); the stage CPU is the build's own profile
(``summary["profile"]["work_cpu_s"]``, measured where each step runs); the fixed cost is the difference (process
start-up, imports, Prefect, the worker processes' start-up, Dask). The Prefect server's CPU during the build is
shown apart. "1st task" is the time from the command's start to the first pass after listing the inputs (its
tasks submitted by the flow, or by the command before it imports Prefect: the head start of 2+ local workers).
Every corpus is copied into a fresh folder per worker count, so each cold build computes everything; the
"changed" build drops the last document of one input file (appends a line to a licence for the sample).

    .venv/bin/python tests/bench/bench_overhead.py [--mb 40] [--workers 2] [--only sample|text] [--keep DIR] [--tty]

``--tty`` runs each build as a person at a terminal does: without ``--json``, on a pseudo-terminal (``script``),
with its live progress row; cold builds only (their summary is read back from the build's published record).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench.bench_scale import corpus_for, cpu_floor  # noqa: E402  (the script runs from anywhere)

SAMPLE = REPO / "pipeline" / "sample_corpus"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants (Linux): the local workers' fork server outlives the
    command by a moment, and its CPU (its workers' too) counts only once it is waited for (:func:`reap`)."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def reap(before: set[int], timeout: float = 10.0) -> None:
    """Wait for the orphans this process adopted since ``before`` (its children then): the build's fork server,
    so that its CPU is in :func:`children_cpu`."""
    deadline = time.monotonic() + timeout
    for child in psutil.Process().children():
        if child.pid not in before:
            with contextlib.suppress(psutil.Error, ChildProcessError):
                child.wait(max(0.1, deadline - time.monotonic()))


def server_pid() -> int | None:
    from flows.runtime.local_server import prefect_home, read_state, resolve_api

    resolve_api(start=True)
    state = read_state(prefect_home())
    return state.pid if state else None


def build(
    corpus: Path, store: Path, name: str, workers: int, server: psutil.Process | None, tty: bool = False
) -> dict[str, Any]:
    """One ``pileworks build`` process: its wall, tree CPU, the server's CPU meanwhile and its summary."""
    cmd = [sys.executable, "-m", "flows.cli", "build", "--input", str(corpus), "--output", str(store)]
    cmd += ["--name", name, "--workers", str(workers)]
    cmd = ["script", "-qec", shlex.join(cmd), "/dev/null"] if tty else [*cmd, "--json"]
    env = os.environ | {"PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server_cpu0 = sum(server.cpu_times()[:2]) if server else 0.0
    before = {p.pid for p in psutil.Process().children()}
    cpu0, t0, started = children_cpu(), time.perf_counter(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
    wall = time.perf_counter() - t0
    reap(before)
    cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"build failed (exit {proc.returncode})")
    summary = published_summary(store) if tty else json.loads(proc.stdout[proc.stdout.index("{") :])
    prof = summary["profile"]
    passes = prof["passes"]
    # the first pass's work: submitted by the flow, or before Prefect by the command's head start (2+ workers)
    head = prof.get("head_start") or {}
    first = (
        min(passes[1]["start"], head.get("start", passes[1]["start"])) - started if len(passes) > 1 else None
    )
    return {
        "wall": wall,
        "cpu": cpu,
        "stage": prof["work_cpu_s"],
        "server": (sum(server.cpu_times()[:2]) - server_cpu0) if server else 0.0,
        "workers_started": prof.get("workers_started", "?"),
        "task_runs": prof["task_runs"],
        "first_task": first,
        "dataset_id": summary["dataset_id"],
        "unchanged": bool(summary.get("nothing_changed")),
    }


def published_summary(store: Path) -> dict[str, Any]:
    """The summary of the build that last published into ``store`` (its work folder's record)."""
    records = sorted(store.glob("work/*/published.json"), key=lambda p: p.stat().st_mtime)
    return dict(json.loads(records[-1].read_text())["summary"])


def copy_sample(dest: Path) -> Path:
    """The bundled sample's data files (no .py/.md), so one of them can change."""
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns("*.py", "*.md", "__pycache__"))
    return dest


def change_one_file(corpus: Path) -> None:
    jsonl = sorted(corpus.glob("*.jsonl"))
    if jsonl:  # the real-text corpus: one document fewer in its last file
        lines = jsonl[-1].read_text(encoding="utf-8").splitlines()
        jsonl[-1].write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
        return
    licence = corpus / "licenses" / "BSD.txt"  # the sample: one more paragraph in one licence
    licence.write_text(licence.read_text() + "\nThis paragraph was added by bench_overhead.py.\n")


def series(
    label: str, source: Path, name: str, workers: int, root: Path, server: psutil.Process | None, tty: bool
):
    folder = root / f"{label}-{workers}w"
    shutil.rmtree(folder, ignore_errors=True)
    corpus = copy_sample(folder / "in") if label == "sample" else Path(shutil.copytree(source, folder / "in"))
    store = folder / "store"
    rows = {"cold": build(corpus, store, name, workers, server, tty)}
    if tty:  # a terminal's build prints no summary: the cold one's is read from its published record
        return rows
    rows["no change"] = build(corpus, store, name, workers, server)
    change_one_file(corpus)
    rows["one file changed"] = build(corpus, store, name, workers, server)
    return rows


def print_table(results: dict[tuple[str, int], dict[str, dict[str, Any]]]) -> None:
    head = f"{'corpus':<8}{'W':>3} {'build':<17}{'wall s':>8}{'CPU s':>8}{'stage':>8}{'fixed':>8}"
    print("\n" + head + f"{'server':>8}{'1st task':>9}{'started':>8}{'runs':>6}  dataset")
    for (label, workers), rows in results.items():
        for kind, r in rows.items():
            first = f"{r['first_task']:.2f}" if r["first_task"] is not None else "-"
            print(
                f"{label:<8}{workers:>3} {kind:<17}{r['wall']:8.2f}{r['cpu']:8.2f}{r['stage']:8.2f}"
                f"{r['cpu'] - r['stage']:8.2f}{r['server']:8.2f}{first:>9}{r['workers_started']!s:>8}"
                f"{r['task_runs']:6d}  {r['dataset_id'][:12]}{' (unchanged)' if r['unchanged'] else ''}"
            )
    print()
    for (label, workers), rows in results.items():
        if "no change" not in rows:
            continue
        cold = rows["cold"]["wall"]
        print(
            f"{label} W={workers}: no-change / cold = {rows['no change']['wall'] / cold:.3f}; "
            f"changed / cold = {rows['one file changed']['wall'] / cold:.2f}"
        )
    for label in sorted({k[0] for k in results}):
        counts = sorted(w for lab, w in results if lab == label)
        if len(counts) > 1:
            one, many = results[label, counts[0]]["cold"], results[label, counts[-1]]["cold"]
            print(f"{label}: cold wall at W={counts[-1]} / W={counts[0]} = {many['wall'] / one['wall']:.2f}")
            cpu = [r["cpu"] + r["server"] for r in (one, many)]
            print(f"{label}: cold, {cpu_floor(one['wall'], cpu[0], cpu[1], counts[-1])}")
        fixed = ", ".join(
            f"W={w}: {results[label, w]['cold']['cpu'] - results[label, w]['cold']['stage']:.2f}"
            for w in counts
        )
        print(f"{label}: fixed cost of the cold build (CPU s - stage CPU s): {fixed}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=40.0, help="size of the real-text corpus")
    parser.add_argument("--workers", type=int, default=2, help="N, the second worker count (the first is 1)")
    parser.add_argument("--only", choices=("sample", "text"), help="one corpus only")
    parser.add_argument("--keep", help="folder for the corpora and stores (default: a temporary one)")
    parser.add_argument("--tty", action="store_true", help="cold builds on a pseudo-terminal, without --json")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-overhead-"))
    root.mkdir(parents=True, exist_ok=True)
    adopt_orphans()
    pid = server_pid()
    server = psutil.Process(pid) if pid else None
    print(
        f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; Prefect server pid {pid}"
    )
    results: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    corpora = []
    if args.only != "text":
        corpora.append(("sample", SAMPLE, "sample"))
    if args.only != "sample":
        text, size = corpus_for(root / "cache", args.mb)
        print(f"real-text corpus: {size / 1e6:.1f} MB in {text}")
        corpora.append(("text", text, "bench"))
    for label, source, name in corpora:
        for workers in (1, args.workers):
            results[label, workers] = series(label, source, name, workers, root, server, args.tty)
            print_table({(label, workers): results[label, workers]})
    print_table(results)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
