"""What content ids cost (issue 43): hashing inputs per GB, local and on S3 (moto), and a moved corpus's rebuild.

    PYTHONPATH=. python tests/bench/bench_content_ids.py [--mb 40] [--hash-mb 512] [--s3-mb 128]

1. ``xxh3-128`` of every input, as a build's listing does it (``pipeline/ingest/digests.py``, 8 objects at once),
   over ``--hash-mb`` of local files (read from the page cache: the hash and the reads, not the disk) and over
   ``--s3-mb`` in a moto bucket on 127.0.0.1 (moto's own CPU in this process counts: an upper bound for S3).
   Then the same listing again: every digest from the cache, no byte read.
2. A ``--mb`` corpus (``bench_scale.corpus_for``): its cold ``pileworks build``, then the corpus moved to another
   folder and built again into the same store (its inputs hashed once under their new URIs, the published dataset
   found: no unit computed), then the same with the published record gone (the full flow, every unit found).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.ingest import digests  # noqa: E402
from pipeline.ingest.stage import list_inputs  # noqa: E402
from pipeline.storage import S3Options, open_store  # noqa: E402
from tests.bench.bench_overhead import build  # noqa: E402
from tests.bench.bench_scale import corpus_for  # noqa: E402

MB = 1 << 20


def _files(folder: Path, total_mb: int, each_mb: int = 64) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MB)
    for i in range(max(total_mb // each_mb, 1)):
        with open(folder / f"part-{i:04d}.jsonl", "wb") as f:
            for _ in range(min(each_mb, total_mb)):
                f.write(block)


def _hash_rate(uri: str, store_uri: str, s3: S3Options | None) -> dict[str, float]:
    inputs = list_inputs([uri], s3)
    store = open_store(store_uri, s3)
    nbytes = sum(i.size for i in inputs)
    t0 = time.perf_counter()
    cold = digests.with_digests(inputs, store, uri, s3)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = digests.with_digests(inputs, store, uri, s3)
    cached = time.perf_counter() - t0
    assert [i.digest for i in cold] == [i.digest for i in again]
    return {"gb": nbytes / 1e9, "s_per_gb": first / (nbytes / 1e9), "cached_s": cached}


def hashing(tmp: Path, hash_mb: int, s3_mb: int) -> None:
    local = tmp / "hash-local"
    _files(local, hash_mb)
    for path in local.iterdir():  # into the page cache: the hash and the reads are measured, not the disk
        path.read_bytes()
    got = _hash_rate(str(local), str(tmp / "hash-store"), None)
    print(
        f"local: {got['gb']:.2f} GB hashed at {got['s_per_gb']:.2f} s/GB; again from the cache {got['cached_s']:.3f} s"
    )
    from moto.server import ThreadedMotoServer

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Options(endpoint_url=f"http://{host}:{port}", region="us-east-1")
        import boto3

        boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1").create_bucket(
            Bucket="bench"
        )
        remote = tmp / "hash-s3"
        _files(remote, s3_mb, each_mb=16)
        store = open_store("s3://bench", s3)
        for path in sorted(remote.iterdir()):
            store.put_file(f"corpus/{path.name}", path)
        got = _hash_rate("s3://bench/corpus", "s3://bench/store", s3)
        print(
            f"s3 (moto on 127.0.0.1): {got['gb']:.2f} GB hashed at {got['s_per_gb']:.2f} s/GB; "
            f"again from the cache {got['cached_s']:.3f} s"
        )
    finally:
        server.stop()


def moved_rebuild(tmp: Path, mb: float) -> None:
    cache = Path(os.environ.get("PILEWORKS_BENCH_CACHE", tempfile.gettempdir())) / "pileworks-bench"
    source, size = corpus_for(cache, mb)
    here, there, store = tmp / "corpus", tmp / "moved" / "corpus", tmp / "store"
    shutil.copytree(source, here)
    cold = build(here, store, "moved", 2, None)
    there.parent.mkdir()
    here.rename(there)
    moved = build(there, store, "moved", 2, None)
    (record,) = store.glob("work/*/published.json")  # the moved corpus has the cold build's key
    record.unlink()
    full = build(there, store, "moved", 2, None)
    ids = {r["dataset_id"] for r in (cold, moved, full)}
    assert len(ids) == 1, ids
    print(f"corpus {size / 1e6:.1f} MB, dataset {ids.pop()}")
    for label, r in (("cold build", cold), ("moved, rebuilt", moved), ("moved, no record", full)):
        print(
            f"{label:18} wall {r['wall']:6.1f} s  cpu {r['cpu']:6.1f} s  task runs {r['task_runs']:4}  "
            f"{'nothing changed' if r['unchanged'] else ''}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=40)
    p.add_argument("--hash-mb", type=int, default=512)
    p.add_argument("--s3-mb", type=int, default=128)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pw-bench-ids-") as tmp:
        hashing(Path(tmp), args.hash_mb, args.s3_mb)
        moved_rebuild(Path(tmp), args.mb)


if __name__ == "__main__":
    main()
