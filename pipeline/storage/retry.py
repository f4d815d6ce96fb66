"""Our own retry loop for each store operation (S3, GCS, Azure), and the one test of what may be retried at all.

botocore's standard mode shares a retry quota per client: under sustained throttling the quota runs dry and
then nothing is retried. So botocore makes one attempt and :func:`call_with_retries` retries transient
failures (throttling, 5xx, connection refused/reset, timeouts) with capped exponential backoff and full
jitter until the operation's time budget is spent. Failures that cannot succeed on a second try (missing
object, no credentials, access denied, no such bucket, a full disk) are raised at once, and
:func:`is_permanent` tells task-level retry (Prefect) to leave them alone too.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import botocore.exceptions

from pipeline.errors import PermanentStorageError, RetryBudgetSpent
from pipeline.storage.options import S3Options

log = logging.getLogger(__name__)
T = TypeVar("T")

_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "InternalError",
    "ServiceUnavailable",
    "BandwidthLimitExceeded",
    "EC2ThrottledException",
}
_TRANSIENT_IO = (
    botocore.exceptions.ConnectionError,  # refused, reset, closed, proxy, endpoint connection
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
)
# errno values that no retry can fix: the disk is full, over quota or read-only.
_PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is worth another try (``throttled``, ``server-5xx``, ``connection``), or None if not."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _THROTTLE_CODES or status in (429, 503):
            return "throttled"
        if status >= 500:
            return "server-5xx"
        return None
    if isinstance(exc, _TRANSIENT_IO):
        return "connection"
    return None


def is_permanent(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an exception it wraps) cannot succeed on a retry: Prefect must not retry it.

    Missing objects, access denied, bad values/configs (``ValueError``, ``ConfigError``), no credentials,
    no such bucket and a full disk are permanent; anything else may be transient."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, (PermanentStorageError, FileNotFoundError, PermissionError, ValueError)):
            return True
        if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
            return True
        if isinstance(
            exc, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)
        ):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class RetryStats:
    """Process-wide counters (benchmarks and tests read them): attempts made and retries by reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempts = self.gave_up = 0
        self.retries: Counter[str] = Counter()

    def record(self, *, retry_reason: str | None = None, gave_up: bool = False) -> None:
        with self._lock:
            if retry_reason:
                self.retries[retry_reason] += 1
            elif gave_up:
                self.gave_up += 1
            else:
                self.attempts += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "attempts": self.attempts,
                "retries": sum(self.retries.values()),
                "gave_up": self.gave_up,
                **{f"retries_{k}": v for k, v in sorted(self.retries.items())},
            }

    def reset(self) -> None:
        with self._lock:
            self.attempts = self.gave_up = 0
            self.retries.clear()


STATS = RetryStats()


def backoff_s(retry: int, options: S3Options, rng: random.Random | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**retry)] (AWS Architecture Blog, "Exponential Backoff
    And Jitter"): spreads many clients' retries instead of synchronising them."""
    ceiling = min(options.retry_cap_s, options.retry_base_s * (2 ** min(retry, 30)))
    return (rng or random).uniform(0.0, ceiling)


def call_with_retries(
    fn: Callable[[], T],
    options: S3Options,
    what: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    classify: Callable[[BaseException], str | None] = transient_reason,
) -> T:
    """``fn()``, retried on transient failures within ``options.retry_budget_s`` and ``max_attempts``.

    ``classify`` says why a failure is worth another try, or None: :func:`transient_reason` for S3; the
    ``gs://`` and ``az://`` stores pass their SDK's (``pipeline.storage.gcs``, ``pipeline.storage.azure``)."""
    start = clock()
    for attempt in range(options.max_attempts):
        STATS.record()
        try:
            return fn()
        except Exception as exc:
            reason = classify(exc)
            if reason is None:
                raise
            pause = backoff_s(attempt, options)
            spent = clock() - start
            if attempt + 1 >= options.max_attempts or spent + pause > options.retry_budget_s:
                STATS.record(gave_up=True)
                raise RetryBudgetSpent(
                    f"{what} failed after {attempt + 1} tries in {spent:.1f} s ({reason}: {exc}); the store "
                    f"kept failing for the whole retry budget (s3.retry_budget_s={options.retry_budget_s:g})",
                    reason=reason,
                ) from exc
            STATS.record(retry_reason=reason)
            log.debug("%s: %s (%s), retry %d in %.2f s", what, reason, exc, attempt + 1, pause)
            sleep(pause)
    raise AssertionError("unreachable: the loop returns or raises")
