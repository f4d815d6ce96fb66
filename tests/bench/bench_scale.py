"""Scaling benchmark: one corpus built with 1 worker and with N workers, back to back.

The corpus is real text found on this machine (the bundled sample, /usr/share/doc, the licences and docs
shipped in the virtual environment), cut into documents of a few KB. Past the size of that pool it repeats
as *perturbed copies*: copy k maps every word to another word of the pool's own vocabulary of about the same
frequency (a random permutation within each band of 32 frequency ranks, fixed by k). Each copy is a distinct
text (its word 5-grams and lines are new, so exact and near dedup and the boilerplate count do not simply
delete it) that keeps what the pipeline's costs depend on: line and document lengths, the word-frequency
curve, stop words, and a vocabulary that does not grow with the corpus, as a real corpus's barely does. (An
earlier letter cipher gave every copy a vocabulary of its own: at 4 GB the tokenizer's training sample held
ten times the distinct words of 400 MB, which no real corpus does.)

Each build runs as its own ``pileworks build --json --workers W`` process; a sampler polls the process tree
(the flow process, its Prefect server, the Dask workers) every 0.2 s for CPU time and RSS. The build's own
profile (``summary["profile"]``: CPU per step, measured where the step runs) separates stage work from
orchestration: orchestration = tree CPU - stage CPU (task-run bookkeeping, the Prefect server, process
start-up, Dask). The server runs whether or not a build does; its idle rate is measured for 30 s before the
builds, and the share of orchestration is printed with and without the server's CPU. Printed per pass (each
fan-out or global step): wall, tree CPU, stage CPU, orchestration CPU, task runs, parallel efficiency (wall at 1
/ (N x wall at N)); per step: CPU, MB/s per core, peak RSS of the process that ran it; per process and for the
tree: peak RSS. With both builds, the least wall ratio this machine's cores allow (:func:`cpu_floor`).

    .venv/bin/python tests/bench/bench_scale.py --mb 40 [--workers 2] [--only N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

MB = 1_000_000
FILE_BYTES = 32 * MB
DOC_CHARS = (1500, 8000)
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the corpus


def _sample_texts() -> Iterator[str]:
    import zstandard

    for path in sorted((REPO / "pipeline" / "sample_corpus").glob("*.jsonl.zst")):
        with path.open("rb") as fh:
            data = zstandard.ZstdDecompressor().stream_reader(fh).read()
        for line in data.splitlines():
            yield json.loads(line)["text"]


def _machine_texts() -> Iterator[str]:
    roots = [Path("/usr/share/doc"), Path("/usr/share/common-licenses"), Path(sys.prefix) / "lib"]
    names = ("copyright", "README", "NEWS", "LICENSE", "AUTHORS", "CHANGES", "changelog")
    for root in roots:
        for path in sorted(root.rglob("*")):
            low = path.name.lower()
            text_like = low.endswith((".txt", ".md", ".rst", ".txt.gz", ".md.gz")) or path.name.startswith(
                names
            )
            if not text_like or not path.is_file() or path.stat().st_size > 4 * MB:
                continue
            try:
                raw = path.read_bytes()
                raw = gzip.decompress(raw) if low.endswith(".gz") else raw
                yield raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, gzip.BadGzipFile, EOFError):
                continue


def _documents(text: str, rng: random.Random) -> Iterator[str]:
    """Cut a long text at paragraph breaks into documents of a few KB (short texts stay whole)."""
    paragraphs, doc, size, target = text.split("\n\n"), [], 0, rng.randint(*DOC_CHARS)
    for p in paragraphs:
        doc.append(p)
        size += len(p) + 2
        if size >= target:
            yield "\n\n".join(doc)
            doc, size, target = [], 0, rng.randint(*DOC_CHARS)
    if doc and size > 200:
        yield "\n\n".join(doc)


def base_pool() -> list[str]:
    rng = random.Random(0)
    docs = list(_sample_texts())
    for text in _machine_texts():
        docs.extend(_documents(text, rng))
    return [d for d in docs if d.strip()]


WORD = re.compile(r"([^\W\d_]+)")  # runs of letters (any script); what lies between them stays as it is
BAND = 32  # words are swapped only with words of nearby frequency rank


def _vocabulary(split_pool: list[list[str]]) -> list[str]:
    counts: dict[str, int] = {}
    for pieces in split_pool:
        for w in pieces[1::2]:
            counts[w] = counts.get(w, 0) + 1
    return sorted(counts, key=lambda w: (-counts[w], w))


def _word_map(vocab: list[str], copy: int) -> dict[str, str]:
    """Copy ``copy``'s bijection of the vocabulary: a random permutation within each band of frequency ranks."""
    rng, out = random.Random(1000 + copy), {}
    for start in range(0, len(vocab), BAND):
        band = vocab[start : start + BAND]
        shuffled = band[:]
        rng.shuffle(shuffled)
        out.update(zip(band, shuffled, strict=True))
    return out


def write_corpus(folder: Path, target_mb: float) -> tuple[int, int]:
    """JSONL files of ``FILE_BYTES`` under ``folder`` until ``target_mb``; returns (documents, bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    pool, target = base_pool(), int(target_mb * MB)
    split_pool = [WORD.split(text) for text in pool]  # [gap, word, gap, word, ..., gap]
    vocab = _vocabulary(split_pool)
    written, docs, copy, file_no = 0, 0, 0, 0
    sink = io.StringIO()
    while written < target:
        words = _word_map(vocab, copy) if copy else None
        for i, (text, pieces) in enumerate(zip(pool, split_pool, strict=True)):
            if words is not None:
                pieces = pieces[:]
                pieces[1::2] = [words[w] for w in pieces[1::2]]
                text = "".join(pieces)
            line = json.dumps({"text": text, "meta": {"copy": copy, "i": i}})
            sink.write(line + "\n")
            written += len(line.encode("utf-8")) + 1
            docs += 1
            if sink.tell() >= FILE_BYTES or written >= target:
                (folder / f"corpus-{file_no:04d}.jsonl").write_text(sink.getvalue(), encoding="utf-8")
                sink, file_no = io.StringIO(), file_no + 1
            if written >= target:
                break
        copy += 1
    if sink.tell():
        (folder / f"corpus-{file_no:04d}.jsonl").write_text(sink.getvalue(), encoding="utf-8")
    return docs, written


def corpus_for(cache: Path, mb: float) -> tuple[Path, int]:
    folder = cache / f"words-{mb:g}MB"  # "corpus-*": the letter-cipher copies of earlier versions
    done = folder / ".done"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        docs, size = write_corpus(folder, mb)
        done.write_text(json.dumps({"docs": docs, "bytes": size}))
        print(
            f"corpus: {docs:,} documents, {size / MB:.1f} MB in {time.perf_counter() - t0:.0f} s -> {folder}"
        )
    return folder, json.loads(done.read_text())["bytes"]


# ---------------------------------------------------------------- measuring one build


class TreeSampler(threading.Thread):
    """Polls a process and its descendants: CPU seconds per pid (last seen), peak RSS per pid and for the tree."""

    def __init__(self, pid: int, every: float = 0.2, extra: tuple[int, ...] = ()) -> None:
        super().__init__(daemon=True)
        self.root, self.every = psutil.Process(pid), every
        self.extra = [psutil.Process(p) for p in extra]  # the long-running local Prefect server
        self.cpu0 = {p.pid: sum(p.cpu_times()[:2]) for p in self.extra}  # its CPU before this build
        self.cpu: dict[int, float] = {}
        self.rss: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.tree_rss, self.series = 0.0, []  # series: (time, tree CPU so far)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True), *self.extra]
        except psutil.NoSuchProcess:
            return
        total_rss = 0.0
        for p in procs:
            try:
                with p.oneshot():
                    t, rss = p.cpu_times(), p.memory_info().rss / MB
                    if p.pid not in self.names:
                        self.names[p.pid] = " ".join(p.cmdline()[:4])[-70:]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.cpu[p.pid] = t.user + t.system - self.cpu0.get(p.pid, 0.0)
            self.rss[p.pid] = max(self.rss.get(p.pid, 0.0), rss)
            total_rss += rss
        self.tree_rss = max(self.tree_rss, total_rss)
        self.series.append((time.time(), sum(self.cpu.values())))

    def cpu_between(self, start: float, end: float) -> float:
        def at(t: float) -> float:
            before = [c for s, c in self.series if s <= t]
            return before[-1] if before else 0.0

        return max(0.0, at(end) - at(start))


def server_pids() -> tuple[int, ...]:
    """The local Prefect server the builds report to (``pileworks`` keeps one running per PREFECT_HOME): its CPU
    during a build is orchestration, so it is sampled with the build's tree."""
    from flows.runtime.local_server import prefect_home, read_state, resolve_api

    resolve_api(start=True)  # started before the first build, so both builds pay the same (nothing)
    state = read_state(prefect_home())
    return (state.pid,) if state else ()


def idle_server_rate(seconds: float = 30.0) -> float:
    """CPU seconds per second the local Prefect server spends with no build running (its own loops)."""
    procs = [psutil.Process(p) for p in server_pids()]
    time.sleep(20.0)  # past a fresh server's start-up work (its first service loops)
    cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
    time.sleep(seconds)
    return (sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0) / seconds


def run_build(
    corpus: Path, store: Path, workers: int, extra: list[str]
) -> tuple[dict[str, Any], TreeSampler, float]:
    cmd = [
        str(Path(sys.executable).with_name("pileworks")),
        "build",
        "--input",
        str(corpus),
        "--output",
        str(store),
        "--name",
        "bench",
        "--json",
        "--workers",
        str(workers),
        *extra,
    ]
    env = os.environ | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO)
        sampler = TreeSampler(proc.pid, extra=server_pids())
        sampler.start()
        rc = proc.wait(timeout=6 * 3600)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        if rc != 0:
            sys.stderr.write(err.read().decode()[-4000:])
            raise SystemExit(f"build with {workers} worker(s) failed (exit {rc})")
        text = out.read().decode()
    summary = json.loads(text[text.index("{") :])
    return summary, sampler, wall


# ---------------------------------------------------------------- reporting


def report(
    label: str, mb: float, summary: dict[str, Any], tree: TreeSampler, wall: float, idle_rate: float
) -> dict[str, Any]:
    prof = summary["profile"]
    tree_cpu = sum(tree.cpu.values())
    work = prof["work_cpu_s"]
    print(
        f"\n== {label}: {mb:.1f} MB in {wall:.1f} s wall; dataset {summary['dataset_id']}; "
        f"{prof['task_runs']} task runs"
    )
    print(f"{'pass':<20}{'wall s':>8}{'tree cpu':>10}{'stage cpu':>10}{'orch cpu':>10}{'runs':>6}")
    rows = {}
    for p in prof["passes"]:
        pw = p["end"] - p["start"]
        tc = tree.cpu_between(p["start"], p["end"])
        rows[p["name"]] = {"wall": pw, "tree": tc, "work": p["work_cpu_s"], "runs": p["task_runs"]}
        print(
            f"{p['name']:<20}{pw:8.2f}{tc:10.2f}{p['work_cpu_s']:10.2f}{max(0.0, tc - p['work_cpu_s']):10.2f}"
            f"{p['task_runs']:6d}"
        )
    print(f"{'step':<20}{'cpu s':>8}{'MB/s/core':>11}{'units':>7}{'peak RSS MB':>13}")
    for name, s in prof["steps"].items():
        rate = mb / s["cpu_s"] if s["cpu_s"] else 0.0
        print(f"{name:<20}{s['cpu_s']:8.2f}{rate:11.1f}{int(s['units']):7d}{s['rss_mb']:13.0f}")
    orch = tree_cpu - work
    print(
        f"tree CPU {tree_cpu:.1f} s = stage work {work:.1f} s + orchestration {orch:.1f} s "
        f"({orch / tree_cpu:.1%}); {tree_cpu / mb:.3f} CPU-s/MB, stages alone {work / mb:.3f} CPU-s/MB "
        f"(whole build / stages = {tree_cpu / work:.2f}x)"
    )
    if "flow_cpu_s" in prof:  # the head node's own share (issue 31): the flow process after start-up
        print(
            f"flow process after start-up: {prof['flow_cpu_s']:.1f} CPU-s, {prof['flow_cpu_s'] / tree_cpu:.2%} of the "
            f"build's CPU; its own storage calls: {prof.get('flow_storage', {})}"
        )
    print(f"peak RSS: tree {tree.tree_rss:.0f} MB; per process:")
    for pid, rss in sorted(tree.rss.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {rss:8.0f} MB  cpu {tree.cpu.get(pid, 0):7.1f} s  {tree.names.get(pid, '')}")
    print(
        f"Prefect server processes sampled (the local server, started before the builds): {len(tree.extra)}"
    )
    server = sum(tree.cpu.get(p.pid, 0.0) for p in tree.extra)
    print(
        f"of the orchestration, {server:.1f} CPU-s is the Prefect server ({server / wall:.1%} of a core during the "
        f"build; {idle_rate:.1%} idle before the builds): without the server, orchestration is "
        f"{orch - server:.1f} CPU-s, {(orch - server) / (tree_cpu - server):.1%} of the build's CPU"
    )
    return {
        "wall": wall,
        "passes": rows,
        "dataset_id": summary["dataset_id"],
        "tree_cpu": tree_cpu,
        "work": work,
        "peak_rss": max(tree.rss.values()),
        "tree_rss": tree.tree_rss,
    }


def compare(one: dict[str, Any], many: dict[str, Any], n: int) -> None:
    print(f"\n== 1 worker vs {n} workers")
    print(f"{'pass':<20}{'wall 1':>8}{f'wall {n}':>8}{'efficiency':>12}")
    for name, r1 in one["passes"].items():
        rn = many["passes"].get(name)
        if rn and rn["wall"] > 0:
            print(f"{name:<20}{r1['wall']:8.2f}{rn['wall']:8.2f}{r1['wall'] / (n * rn['wall']):12.0%}")
    print(
        f"{'whole build':<20}{one['wall']:8.1f}{many['wall']:8.1f}{one['wall'] / (n * many['wall']):12.0%}"
        f"   wall ratio {many['wall'] / one['wall']:.2f}"
    )
    print(cpu_floor(one["wall"], one["tree_cpu"], many["tree_cpu"], n))
    same = one["dataset_id"] == many["dataset_id"]
    print(f"dataset id: {one['dataset_id']} / {many['dataset_id']} ({'same' if same else 'DIFFERENT'})")


def cpu_floor(one_wall: float, one_cpu: float, many_cpu: float, n: int) -> str:
    """The least wall ratio (N workers / 1) this machine's cores allow, from the CPU the builds used (their
    process trees and the Prefect server): the N-worker build's CPU spread evenly over every core, and the
    1-worker build's own (a second worker that cost nothing). A 1-worker build already runs the flow's process
    and the server beside its worker, so on 2 cores its wall is often below its CPU, and the floor above 0.5."""
    cores = len(os.sched_getaffinity(0))
    return (
        f"floor on {cores} core(s): the {n}-worker build's {many_cpu:.1f} CPU-s need >= {many_cpu / cores:.2f} s "
        f"(wall ratio >= {many_cpu / cores / one_wall:.2f}); the 1-worker build's {one_cpu:.1f} CPU-s >= "
        f"{one_cpu / cores:.2f} s (>= {one_cpu / cores / one_wall:.2f})"
    )


def warm(folder: Path) -> None:
    """Read every file under ``folder`` once (into the page cache): a corpus read cold from the disk made the
    first build of a pair (one worker) wait on reads that the second did not (ingest 12.8 s wall for 5.5 CPU-s
    at 150 MB)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                while fh.read(1 << 20):
                    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=40.0, help="corpus size in MB of JSONL")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="N for the N-worker build")
    ap.add_argument("--only", type=int, help="run only the build with this many workers")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "pileworks-bench-scale"))
    ap.add_argument("--keep", help="keep the stores under this folder (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], help="config override passed to the build")
    args = ap.parse_args()
    corpus, size = corpus_for(Path(args.cache), args.mb)
    mb = size / MB
    extra = [x for s in args.set for x in ("--set", s)]
    counts = [args.only] if args.only else [1, args.workers]
    idle_rate = idle_server_rate()
    print(f"local Prefect server, idle: {idle_rate:.1%} of a core")
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        results = {}
        for w in counts:
            warm(corpus)  # every build reads its input from the page cache, not the first from the disk
            summary, tree, wall = run_build(corpus, Path(tmp) / f"store-{w}", w, extra)
            results[w] = report(f"{w} worker(s)", mb, summary, tree, wall, idle_rate)
        if len(counts) == 2:
            compare(results[1], results[args.workers], args.workers)


if __name__ == "__main__":
    main()
