"""The doctor's object-store probe: write, read back, verify and delete one object, timing each leg.

Only :mod:`pipeline.storage` touches the store (and boto3); errors become a FAIL whose fix is picked from the
error's text (missing credentials, missing bucket, access denied, unreachable endpoint).
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid

from pipeline.storage import open_store
from training.preflight.base import CheckResult, DoctorConfig, Status

_STORE_HINTS = (
    (
        "NoCredentials",
        "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (boto3's credential chain)",
    ),
    ("NoSuchBucket", "create the bucket first (aws s3 mb s3://BUCKET, or the MinIO console)"),
    ("' does not exist", "create the bucket first (aws s3 mb s3://BUCKET, or the MinIO console)"),
    ("AccessDenied", "the credentials lack s3:PutObject/GetObject/DeleteObject on this prefix"),
    (
        "InvalidAccessKeyId",
        "the access key is unknown to this endpoint: check AWS_ACCESS_KEY_ID and --s3-endpoint-url",
    ),
    ("SignatureDoesNotMatch", "the secret key is wrong for this access key"),
    (
        "connect",
        "the endpoint is unreachable: check --s3-endpoint-url (MinIO: http://HOST:9000) and the network",
    ),
)


def _store_fix(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc} {exc.__cause__!r}"
    for needle, fix in _STORE_HINTS:
        if needle.lower() in text.lower():
            return fix
    return "check the store URI, the endpoint and the credentials"


def check_store(cfg: DoctorConfig) -> list[CheckResult]:
    """Write, read back, verify and delete a probe object; report the throughput of each leg."""
    if not cfg.store:
        return []

    payload = os.urandom(int(cfg.store_probe_mib * 2**20))
    key = f"_pileworks_doctor/{uuid.uuid4().hex}.bin"
    try:
        s3 = cfg.s3
        if s3 is not None:  # a probe reports, it does not wait out an outage: retry at most timeout_s
            s3 = dataclasses.replace(s3, retry_budget_s=min(s3.retry_budget_s, cfg.timeout_s))
        store = open_store(cfg.store, s3)
        t0 = time.perf_counter()
        store.put_bytes(key, payload)
        t1 = time.perf_counter()
        back = store.get_bytes(key)
        t2 = time.perf_counter()
        store.delete(key)
        left = store.exists(key)
    except Exception as exc:  # every backend error becomes a FAIL with a hint, never a traceback
        return [
            CheckResult("store", Status.FAIL, f"{cfg.store}: {type(exc).__name__}: {exc}", _store_fix(exc))
        ]
    if back != payload or left:
        what = "read back different bytes" if back != payload else "probe object still exists after delete"
        return [
            CheckResult(
                "store", Status.FAIL, f"{cfg.store}: {what}", "check the store's consistency settings"
            )
        ]
    mib = len(payload) / 2**20
    data = {
        "probe_mib": mib,
        "write_mib_s": round(mib / max(t1 - t0, 1e-9), 1),
        "read_mib_s": round(mib / max(t2 - t1, 1e-9), 1),
    }
    return [
        CheckResult(
            "store",
            Status.PASS,
            f"{cfg.store}: write/read/delete ok, write {data['write_mib_s']} "
            f"MiB/s, read {data['read_mib_s']} MiB/s ({mib:g} MiB probe)",
            data=data,
        )
    ]
