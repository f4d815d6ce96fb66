"""Write and read MB/s and requests per part of each client against each cloud's emulator, beside S3 (moto).

Clients: ours (the official SDKs through ``pipeline.storage``), fsspec (s3fs is not installed here: gcsfs,
adlfs) and obstore (one Rust library for all three). Each writes one object of ``--mib`` MiB in parts of
``--part-mib`` (S3 multipart parts, GCS resumable chunks, Azure blocks) and reads it back in one stream. A
counting proxy (tests/fixtures/fault_proxy.py, no faults) in front of each server counts the requests.
Emulators and moto are in-memory Python/Node servers on 127.0.0.1: the figures compare clients against the same
server, not the clouds. Paste the table into tests/bench/README.md.

    python tests/bench/bench_clouds.py --mib 64 --part-mib 16
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.storage import S3Options, open_store
from tests.fixtures.emulators import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    azurite,
    azurite_connection_string,
    create_azure_container,
    create_gcs_bucket,
    gcs_emulator,
)
from tests.fixtures.fault_proxy import FaultProxy

MiB = 1 << 20


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _ours(kind: str, url: str, bucket: str, part: int) -> tuple[Callable, Callable]:
    options = S3Options(multipart_threshold=part, multipart_chunk=part, region="us-east-1")
    field = {"s3": "endpoint_url", "gcs": "gcs_endpoint_url", "azure": "azure_endpoint_url"}[kind]
    scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[kind]
    store = open_store(f"{scheme}://{bucket}", S3Options(**{**options.to_dict(), field: url}))
    return (lambda path, key: store.put_file(key, path)), (lambda key, out: store.get_file(key, out))


def _fsspec(kind: str, url: str, bucket: str, part: int) -> tuple[Callable, Callable]:
    if kind == "gcs":
        import gcsfs

        fs: Any = gcsfs.GCSFileSystem(endpoint_url=url, token="anon", block_size=part)
    elif kind == "azure":
        import adlfs

        fs = adlfs.AzureBlobFileSystem(
            account_name=AZURITE_ACCOUNT,
            account_key=AZURITE_KEY,
            connection_string=azurite_connection_string(url),
        )
    else:
        import s3fs  # not installed here: reported as such

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url})

    def put(path: Path, key: str) -> None:
        with open(path, "rb") as src, fs.open(f"{bucket}/{key}", "wb", block_size=part) as dst:
            while block := src.read(part):
                dst.write(block)

    def get(key: str, out: Path) -> None:
        with fs.open(f"{bucket}/{key}", "rb", block_size=part) as src, open(out, "wb") as dst:
            while block := src.read(part):
                dst.write(block)

    return put, get


def _obstore(kind: str, url: str, bucket: str, part: int) -> tuple[Callable, Callable]:
    import obstore
    from obstore.store import AzureStore, GCSStore, S3Store

    client = {"allow_http": True}
    if kind == "s3":
        store: Any = S3Store(
            bucket,
            endpoint=url,
            region="us-east-1",
            client_options=client,
            access_key_id="bench",
            secret_access_key="bench-secret",
        )
    elif kind == "gcs":
        # With this config obstore still asked 169.254.169.254 for a token: never run it where that could leave
        raise RuntimeError(
            "skipped: obstore's GCS client asks the metadata server (169.254.169.254) for a token"
        )
        store = GCSStore(bucket, client_options=client, config={"base_url": url, "skip_signature": True})
    else:
        store = AzureStore(
            bucket,
            client_options=client,
            config={
                "use_emulator": True,
                "endpoint": url,
                "account_name": AZURITE_ACCOUNT,
                "access_key": AZURITE_KEY,
            },
        )

    def put(path: Path, key: str) -> None:
        with open(path, "rb") as src:
            obstore.put(store, key, src, chunk_size=part, max_concurrency=4)

    def get(key: str, out: Path) -> None:
        with open(out, "wb") as dst:
            for chunk in obstore.get(store, key).stream(min_chunk_size=part):
                dst.write(chunk)

    return put, get


CLIENTS = {"ours (official SDK)": _ours, "fsspec": _fsspec, "obstore": _obstore}


def measure(kind: str, server: str, bucket: str, path: Path, part: int) -> list[dict[str, Any]]:
    size, rows = path.stat().st_size, []
    parts = -(-size // part)
    for name, make in CLIENTS.items():
        proxy = FaultProxy(server.split("/devstoreaccount1")[0], flavour=kind)
        url = proxy.url + ("/devstoreaccount1" if kind == "azure" else "")
        try:
            put, get = make(kind, url, bucket, part)
            key = f"bench/{uuid.uuid4().hex[:8]}.bin"
            started = time.perf_counter()
            put(path, key)
            write_s, write_requests = time.perf_counter() - started, proxy.counts().get("requests", 0)
            proxy.reset_counts()
            out = path.with_suffix(".out")
            started = time.perf_counter()
            get(key, out)
            read_s, read_requests = time.perf_counter() - started, proxy.counts().get("requests", 0)
            assert out.read_bytes() == path.read_bytes(), "the object read back differs"
            rows.append(
                {
                    "store": kind,
                    "client": name,
                    "write_MBps": size / 1e6 / write_s,
                    "read_MBps": size / 1e6 / read_s,
                    "write_req_per_part": write_requests / parts,
                    "read_req_per_part": read_requests / parts,
                }
            )
        except Exception as e:  # a client that cannot reach this emulator is a result too
            rows.append(
                {"store": kind, "client": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}
            )
        finally:
            proxy.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--part-mib", type=int, default=16)
    args = ap.parse_args()
    part = args.part_mib * MiB
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-clouds-") as tmp:
        path = Path(tmp) / "object.bin"
        path.write_bytes(os.urandom(args.mib * MiB))
        with moto_server() as s3:
            import boto3

            boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket="bench")
            rows += measure("s3", s3, "bench", path, part)
        with gcs_emulator(Path(tmp)) as gcs:
            create_gcs_bucket(gcs, "bench")
            rows += measure("gcs", gcs, "bench", path, part)
        with azurite(Path(tmp)) as az:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite_connection_string(az)
            create_azure_container(az, "bench")
            rows += measure("azure", az, "bench", path, part)
    print(
        f"| store | client | write MB/s | read MB/s | write requests/part | read requests/part |  ({args.mib} MiB, {args.part_mib} MiB parts)"
    )
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['store']} | {r['client']} | – | – | – | – ({r['error']}) |")
        else:
            print(
                f"| {r['store']} | {r['client']} | {r['write_MBps']:.0f} | {r['read_MBps']:.0f} | "
                f"{r['write_req_per_part']:.2f} | {r['read_req_per_part']:.2f} |"
            )


if __name__ == "__main__":
    main()
