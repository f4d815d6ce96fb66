"""A >= 10 MB corpus built to S3 (moto on 127.0.0.1) through the fault proxy at 0%, 10% and 30% random 503s.

Every build must complete with the same dataset id; printed per rate: wall time, requests that reached the proxy,
503s injected, retries made by our per-operation retry loop, and the dataset id.

    .venv/bin/python tests/bench/bench_s3_faults.py [--megabytes 10] [--rates 0,0.1,0.3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
for name, value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}.items():
    os.environ[name] = value
os.environ.pop("AWS_ENDPOINT_URL", None)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.storage.retry import STATS  # noqa: E402
from tests.fixtures.fault_proxy import FaultProxy  # noqa: E402
from tests.fixtures.s3_corpus import FAST_BUILD, upload_corpus, write_corpus  # noqa: E402


def build(inputs: str, output: str, endpoint: str) -> dict:
    from flows.build.flow import build_corpus

    overrides = FAST_BUILD | {
        "ingest.target_part_bytes": 1_000_000,
        "s3.endpoint_url": endpoint,
        "s3.region": "us-east-1",
    }  # the default retry settings: what a user gets
    return build_corpus(inputs=[inputs], output=output, overrides=overrides)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--megabytes", type=float, default=10.0)
    ap.add_argument("--rates", default="0,0.1,0.3")
    args = ap.parse_args()
    from moto.server import ThreadedMotoServer
    from prefect.testing.utilities import prefect_test_harness

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    rows, ids = [], set()
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=180):
        size = write_corpus(Path(tmp) / "raw", megabytes=args.megabytes)
        inputs = upload_corpus(Path(tmp) / "raw", endpoint, "pw-bench")
        print(f"corpus: {size / 1e6:.1f} MB in 4 JSONL files at {inputs}", flush=True)
        for rate in (float(r) for r in args.rates.split(",")):
            proxy = FaultProxy(endpoint, error_rate=rate, seed=7)
            STATS.reset()
            t0 = time.perf_counter()
            try:
                summary = build(inputs, f"s3://pw-bench/out-{int(rate * 100)}", proxy.url)
            finally:
                proxy.close()
            wall = time.perf_counter() - t0
            counts, stats = proxy.counts(), STATS.snapshot()
            ids.add(summary["dataset_id"])
            rows.append(
                (
                    rate,
                    wall,
                    counts.get("requests", 0),
                    counts.get("injected_503", 0),
                    stats["retries"],
                    stats["gave_up"],
                    summary["dataset_id"][:16],
                )
            )
            print(f"rate {rate:.0%}: done in {wall:.1f} s", flush=True)
    server.stop()
    print(
        f"\n{'503 rate':>8} {'wall s':>8} {'requests':>9} {'503s':>6} {'retries':>8} {'gave up':>8}  dataset id"
    )
    for rate, wall, req, inj, retries, gave_up, did in rows:
        print(f"{rate:>8.0%} {wall:>8.1f} {req:>9} {inj:>6} {retries:>8} {gave_up:>8}  {did}")
    same = len(ids) == 1
    print(f"\nsame dataset id at every rate: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
