"""Object-store throughput on both backends: a tmp folder and a moto S3 server on 127.0.0.1.

Run: ``.venv/bin/python tests/bench/bench_storage.py [--mib 64]``. moto keeps objects in memory in this
process, so S3 figures measure our client path (signing, checksums, HTTP, part concurrency), not AWS.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3

from pipeline.storage import ObjectStore, S3Options, open_store, sha256_file

MiB = 1 << 20


def timed(label: str, nbytes: int, fn) -> float:
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    rate = f"{nbytes / MiB / elapsed:8.1f} MiB/s" if nbytes else ""
    print(f"  {label:<34} {elapsed * 1000:9.1f} ms {rate}")
    return elapsed


def stream(store: ObjectStore, key: str) -> None:
    with store.open_read(key) as f:
        while f.read(MiB):
            pass


def bench_store(name: str, store: ObjectStore, src: Path, tmp: Path, n_small: int, n_list: int) -> None:
    size = src.stat().st_size
    print(f"{name}: {store.uri}")
    timed(f"put_file {size // MiB} MiB", size, lambda: store.put_file("big.bin", src))
    timed("get_file", size, lambda: store.get_file("big.bin", tmp / f"{name}.bin"))
    if sha256_file(tmp / f"{name}.bin") != sha256_file(src):
        raise SystemExit(f"{name}: round trip corrupted the file")
    timed("open_read stream (1 MiB reads)", size, lambda: stream(store, "big.bin"))
    timed("verify_sha256", size, lambda: store.verify_sha256("big.bin", sha256_file(src)))
    # moto copies the whole object per ranged GET, so range over a 1 MiB object to time our path, not moto's.
    store.put_bytes("mid.bin", os.urandom(MiB))
    timed(
        "get_range 200 x 4 KiB (1 MiB obj)",
        200 * 4096,
        lambda: [store.get_range("mid.bin", i * 4099, 4096) for i in range(200)],
    )
    elapsed = timed(
        f"put_bytes {n_small} x 1 KiB (8 threads)",
        0,
        lambda: list(
            ThreadPoolExecutor(8).map(
                lambda i: store.put_bytes(f"small/{i:06d}", b"x" * 1024), range(n_small)
            )
        ),
    )
    print(f"  {'':<34} {n_small / elapsed:9.0f} puts/s")
    timed(f"list {n_list} keys", 0, lambda: sum(1 for _ in store.list("small/")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--small", type=int, default=1200)
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        src = tmp / "src.bin"
        src.write_bytes(os.urandom(args.mib * MiB))
        bench_store("file", open_store(str(tmp / "store"), None), src, tmp, args.small, args.small)
        base = S3Options(endpoint_url=endpoint, multipart_threshold=16 * MiB, multipart_chunk=8 * MiB)
        for width in (1, 4):
            opts = dataclasses.replace(base, max_concurrency=width)
            store = open_store(f"s3://{bucket}/c{width}", s3=opts)
            bench_store(f"s3 (moto, {width} part(s) in flight)", store, src, tmp, args.small, args.small)
    server.stop()


if __name__ == "__main__":
    main()
