"""A build to S3 (moto on 127.0.0.1) through a proxy that delays every request, as a remote store's round trip
does: per step, its S3 calls and wall time, so the steps that visit every part one call at a time show.

    .venv/bin/python tests/bench/bench_s3_latency.py --input DIR [--latency-ms 20] [--workers 2]

``--input``: a folder of raw text (e.g. ``/tmp/pileworks-bench-scale/words-400MB``, made by ``bench_scale.py``;
a few of its files are enough). The store is ``s3://pw-latency/root`` on a moto server started here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.fixtures.fault_proxy import FaultProxy  # noqa: E402

AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--part-mb", type=float, default=None, help="ingest.target_part_bytes, in MB (more parts)"
    )
    args = ap.parse_args()
    os.environ.update(AWS)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(
        Bucket="pw-latency"
    )
    proxy = FaultProxy(f"http://{host}:{port}", latency_s=args.latency_ms / 1000)
    cmd = [
        str(Path(sys.executable).with_name("pileworks")),
        "build",
        "--input",
        args.input,
        "--output",
        "s3://pw-latency/root",
        "--s3-endpoint-url",
        proxy.url,
        "--s3-region",
        "us-east-1",
        "--name",
        "latency",
        "--json",
        "--workers",
        str(args.workers),
    ]
    if args.part_mb:
        cmd += ["--set", f"ingest.target_part_bytes={int(args.part_mb * 1e6)}"]
    env = os.environ | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=3 * 3600)
    Path(os.environ.get("PW_BENCH_SUMMARY", "/dev/null")).write_text(done.stdout)
    wall = time.perf_counter() - t0
    proxy.close()
    server.stop()
    if done.returncode:
        sys.exit(f"build failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    prof = summary["profile"]
    print(
        f"{prof['parts']} parts, {args.workers} worker(s), {args.latency_ms:g} ms per request: {wall:.1f} s wall,"
        f" {prof['storage'].get('attempts', 0)} S3 calls; dataset {summary['dataset_id']}"
    )
    # The flow's own process (the head node of a cluster): its CPU after start-up and its S3 calls.
    flow_cpu, work = prof.get("flow_cpu_s", 0.0), prof["work_cpu_s"]
    flow_calls = prof.get("flow_storage", {}).get("attempts", 0)
    print(
        f"flow process: {flow_cpu:.2f} CPU-s = {flow_cpu / max(flow_cpu + work, 1e-9):.1%} of flow + stage CPU"
        f" ({work:.1f} s of stage work); {flow_calls} S3 calls = {flow_calls / prof['parts']:.2f} per part"
    )
    print(f"{'step':<20}{'units':>6}{'S3 calls':>10}{'wall s':>9}")
    for name, step in prof["steps"].items():
        print(f"{name:<20}{step['units']:>6}{step.get('s3_calls', 0):>10}{step['wall_s']:>9.2f}")
    for p in prof["passes"]:
        if p["task_runs"] == 1:  # the steps in the flow process, between the passes
            print(f"  serial {p['name']:<18} {p['end'] - p['start']:7.2f} s")


if __name__ == "__main__":
    main()
