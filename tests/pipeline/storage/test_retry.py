"""Our per-operation retry loop: what is retried, for how long, and what fails at once."""

from __future__ import annotations

import errno
import random

import botocore.exceptions
import pytest

from pipeline.errors import ConfigError
from pipeline.storage import S3Options, StorageError
from pipeline.storage.retry import (
    PermanentStorageError,
    backoff_s,
    call_with_retries,
    is_permanent,
    transient_reason,
)


def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "PutObject")  # type: ignore[arg-type]


TRANSIENT = [
    client_error("SlowDown", 503),
    client_error("InternalError", 500),
    client_error("ServiceUnavailable", 503),
    client_error("", 502),
    client_error("TooManyRequestsException", 429),
    botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
    botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
    botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
]
PERMANENT = [
    client_error("NoSuchKey", 404),
    client_error("AccessDenied", 403),
    client_error("NoSuchBucket", 404),
    client_error("InvalidAccessKeyId", 403),
    client_error("PreconditionFailed", 412),
    botocore.exceptions.NoCredentialsError(),
    OSError(errno.ENOSPC, "No space left on device"),
    FileNotFoundError("s3://b/missing"),
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__ + str(getattr(e, "response", "")))
def test_transient_errors_are_retried_until_success(exc: Exception) -> None:
    assert transient_reason(exc) is not None
    calls, clock = [], FakeClock()

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 6:
            raise exc
        return "ok"

    assert call_with_retries(flaky, S3Options(), "op", sleep=clock.sleep, clock=clock) == "ok"
    assert len(calls) == 6 and len(clock.sleeps) == 5


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__ + str(getattr(e, "response", "")))
def test_what_cannot_succeed_is_raised_at_the_first_try(exc: Exception) -> None:
    assert transient_reason(exc) is None
    calls, clock = [], FakeClock()

    def broken() -> None:
        calls.append(1)
        raise exc

    with pytest.raises(type(exc)):
        call_with_retries(broken, S3Options(), "op", sleep=clock.sleep, clock=clock)
    assert len(calls) == 1 and not clock.sleeps


def test_sustained_throttling_is_retried_for_the_whole_budget_then_named() -> None:
    """No quota to drain: 1000 throttled calls in a row are each retried while the budget lasts."""
    clock = FakeClock()
    opts = S3Options(retry_budget_s=60.0, max_attempts=10_000)
    calls = []

    def throttled() -> None:
        calls.append(1)
        raise client_error("SlowDown", 503)

    with pytest.raises(StorageError, match=r"op failed after \d+ tries.*retry_budget_s=60"):
        call_with_retries(throttled, opts, "op", sleep=clock.sleep, clock=clock)
    assert clock.now <= 60.0 and clock.now > 60.0 - opts.retry_cap_s  # used the budget, not more
    assert len(calls) > 12  # capped backoff keeps trying: ~2.5 s per try on average at the 5 s cap


def test_backoff_is_full_jitter_under_a_capped_exponential() -> None:
    opts, rng = S3Options(retry_base_s=0.1, retry_cap_s=5.0), random.Random(1)
    for retry in range(12):
        ceiling = min(5.0, 0.1 * 2**retry)
        draws = [backoff_s(retry, opts, rng) for _ in range(300)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > 0.8 * ceiling and min(draws) < 0.2 * ceiling  # spread over the whole range


def test_is_permanent_follows_the_wrapped_cause() -> None:
    def wrapped(inner: BaseException) -> RuntimeError:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise RuntimeError("stage 'ingest' part 3 failed") from exc
        except RuntimeError as outer:
            return outer

    for exc in (
        FileNotFoundError("x"),
        PermissionError("x"),
        ConfigError("x"),
        OSError(errno.ENOSPC, "full"),
        PermanentStorageError("no credentials"),
        botocore.exceptions.NoCredentialsError(),
    ):
        assert is_permanent(exc) and is_permanent(wrapped(exc)), exc
    for exc in (
        StorageError("gave up after 30 tries"),
        TimeoutError("t"),
        OSError(errno.ECONNRESET, "reset"),
    ):
        assert not is_permanent(exc) and not is_permanent(wrapped(exc)), exc


def test_botocore_itself_makes_one_attempt() -> None:
    from pipeline.storage.s3 import build_client

    client = build_client(S3Options(endpoint_url="http://127.0.0.1:9", region="us-east-1"))
    assert client.meta.config.retries["total_max_attempts"] == 1
