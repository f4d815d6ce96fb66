"""Wall time of the commands a new user types first: ``--version``, a config error, a missing input, a no-change
build of the bundled sample corpus, and the same no-change build the old way (a temporary Prefect server inside
the command, which is what Prefect does without an API URL).

Everything runs in a private PREFECT_HOME and a temporary store; the local Prefect server the build starts is
stopped at the end. Run: ``.venv/bin/python tests/bench/bench_cli.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


CPU: dict[str, list[float]] = {}  # CPU seconds (user + sys) of each run and its children, per measurement


def timed(argv: list[str], env: dict[str, str], cwd: Path, expect: int, name: str = "") -> float:
    """Wall seconds of one run; its CPU seconds go to CPU[name] (a figure the machine's load does not inflate)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(name, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != expect:
        raise SystemExit(
            f"{' '.join(argv)} exited {done.returncode}, expected {expect}:\n{done.stderr[-3000:]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median reported)")
    parser.add_argument("--skip-old", action="store_true", help="skip the temporary-server (old) measurement")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "flows.cli"]
    with tempfile.TemporaryDirectory(prefix="pileworks-bench-cli-") as tmp:
        root = Path(tmp)
        home = root / "prefect-home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env |= {
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONPATH": str(REPO),
        }
        bad = root / "typo.yaml"
        bad.write_text("dedup:\n  near:\n    treshold: 0.7\n")
        store = root / "store"
        cases = {
            "--version": ([*cli, "--version"], 0),
            "config error": ([*cli, "build", "--config", str(bad)], 2),
            "missing input": ([*cli, "build", "--input", str(root / "does-not-exist")], 1),
            "dead PREFECT_API_URL": ([*cli, "build", "--output", str(store)], 1),
        }
        figures: dict[str, list[float]] = {}
        try:
            for name, (argv, expect) in cases.items():
                case_env = env | ({"PREFECT_API_URL": "http://127.0.0.1:9/api"} if "PREFECT" in name else {})
                figures[name] = [timed(argv, case_env, root, expect, name) for _ in range(args.repeat)]
            build = [*cli, "build", "--output", str(store)]
            first = "first build (starts the local server)"
            figures[first] = [timed(build, env, root, 0, first)]
            figures["no-change build"] = [
                timed(build, env, root, 0, "no-change build") for _ in range(args.repeat)
            ]
            if not args.skip_old:
                old = [
                    sys.executable,
                    "-c",
                    f"from flows.build.flow import build_corpus; build_corpus(output={str(store)!r})",
                ]
                old_env = {k: v for k, v in env.items() if k != "PREFECT_HOME"} | {
                    "PREFECT_HOME": str(root / "eph"),
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",  # what the old CLI set
                }
                before = "no-change build, temporary server (before)"
                figures[before] = [timed(old, old_env, root, 0, before) for _ in range(args.repeat)]
        finally:
            subprocess.run([*cli, "server", "stop"], env=env, cwd=root, capture_output=True, timeout=120)
    load = os.getloadavg()[0]
    print(f"bench_cli: median of {args.repeat} (load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"  {'':<45} {'wall s':>7} {'cpu s':>7}  wall min-max")
    for name, values in figures.items():
        spread = f"  {min(values):.2f}-{max(values):.2f}" if len(values) > 1 else ""
        cpu = statistics.median(CPU.get(name, [0.0]))
        print(f"  {name:<45} {statistics.median(values):7.2f} {cpu:7.2f}{spread}")


if __name__ == "__main__":
    main()
