"""Shared fixtures: a real S3 server (moto) on 127.0.0.1 and a ``store`` fixture over both backends; the GCS
emulator and Azurite (tests/fixtures/emulators.py) for the ``gs://`` and ``az://`` stores.

No store is mocked in-process: each SDK talks HTTP to a server on 127.0.0.1, so signing, retries, pagination and
error parsing run exactly as against the cloud.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pipeline.storage import ObjectStore, S3Options, open_store
from tests.fixtures.aws_trap import aws_trap  # noqa: F401  (a fixture for every test module)
from tests.fixtures.emulators import (
    azurite,
    azurite_connection_string,
    create_azure_container,
    create_gcs_bucket,
    gcs_emulator,
)
from tests.fixtures.fault_proxy import FaultProxy

# A private Prefect home for the whole session, set before anything imports prefect: a command that starts the
# local background server (flows/runtime/local_server.py) starts it here, and the session stops it and removes the folder.
TEST_PREFECT_HOME = tempfile.mkdtemp(prefix="pileworks-test-prefect-")
os.environ["PREFECT_HOME"] = TEST_PREFECT_HOME
# A private cache (the language-ID tables) for the session, inherited by the processes the tests start.
TEST_CACHE_DIR = tempfile.mkdtemp(prefix="pileworks-test-cache-")
os.environ["PILEWORKS_CACHE_DIR"] = TEST_CACHE_DIR


# Each cloud's credential chain would ask its metadata server (169.254.169.254) when it finds nothing else: point
# those at a closed port of 127.0.0.1 (read at import by google-auth), and read no developer's gcloud config.
CLOUD_TRAPS = {
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:9",
    "CLOUDSDK_CONFIG": tempfile.mkdtemp(prefix="pileworks-test-gcloud-"),
    # google-cloud-storage 3.x fetches each bucket's metadata in the background (its own retries) to label
    # traces: off, so the fault tests count only the requests the store makes
    "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA": "true",
}
os.environ.update(CLOUD_TRAPS)
for _name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING"):
    os.environ.pop(_name, None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from pathlib import Path

    from flows.runtime.local_server import stop_server

    stop_server(Path(TEST_PREFECT_HOME))
    shutil.rmtree(TEST_PREFECT_HOME, ignore_errors=True)
    shutil.rmtree(TEST_CACHE_DIR, ignore_errors=True)
    shutil.rmtree(CLOUD_TRAPS["CLOUDSDK_CONFIG"], ignore_errors=True)


FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-access-key",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    # Never read the developer's real ~/.aws files.
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class S3Bucket:
    uri: str  # s3://bucket/prefix
    bucket: str
    prefix: str
    options: S3Options


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server on 127.0.0.1 (one per test session), with fake credentials set."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for name, value in FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        for name in UNSET_AWS_ENV:
            mp.delenv(name, raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_server: str) -> S3Bucket:
    """A fresh, empty bucket; the store root is a prefix inside it so tests can check nothing leaks out."""
    import boto3

    bucket = f"pw-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    options = S3Options(
        endpoint_url=s3_server, region="us-east-1", max_attempts=3, retry_budget_s=5.0, read_timeout=10.0
    )
    return S3Bucket(uri=f"s3://{bucket}/root", bucket=bucket, prefix="root", options=options)


@dataclass(frozen=True)
class CloudBucket:
    """A fresh bucket/container of one cloud store: ``uri`` is a prefix inside it, ``server`` the emulator's
    own URL (no proxy), ``options`` the store settings the tests open it with."""

    uri: str
    bucket: str
    prefix: str
    options: S3Options
    server: str


def _quick(**endpoints: str) -> S3Options:
    return S3Options(max_attempts=3, retry_budget_s=5.0, read_timeout=10.0, **endpoints)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The GCS emulator behind a front that keeps create-only uploads (the emulator ignores them): its URL."""
    with gcs_emulator(tmp_path_factory.mktemp("gcs")) as url:
        front = FaultProxy(url, flavour="gcs", throttle_status=429, gcs_preconditions=True)
        try:
            yield front.url
        finally:
            front.close()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's account URL; ``AZURE_STORAGE_CONNECTION_STRING`` names it for the session (no flag needed)."""
    with azurite(tmp_path_factory.mktemp("azurite")) as url, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(url))
        yield url


@pytest.fixture
def gcs_bucket(gcs_server: str) -> CloudBucket:
    bucket = f"pw-test-{uuid.uuid4().hex[:12]}"
    create_gcs_bucket(gcs_server, bucket)
    return CloudBucket(f"gs://{bucket}/root", bucket, "root", _quick(gcs_endpoint_url=gcs_server), gcs_server)


@pytest.fixture
def azure_container(azurite_server: str) -> CloudBucket:
    """A fresh container; its options name no endpoint: the connection string in the environment is used."""
    container = f"pw-test-{uuid.uuid4().hex[:12]}"
    create_azure_container(azurite_server, container)
    return CloudBucket(f"az://{container}/root", container, "root", _quick(), azurite_server)


@pytest.fixture(
    params=[
        pytest.param("s3", marks=pytest.mark.s3),
        pytest.param("gcs", marks=pytest.mark.gcs),
        pytest.param("azure", marks=pytest.mark.azure),
    ]
)
def cloud_bucket(request: pytest.FixtureRequest) -> S3Bucket | CloudBucket:
    """A fresh bucket of each cloud store (moto, the GCS emulator, Azurite): its ``uri`` (a prefix inside it)
    and the ``options`` to open it with, for the paths that take any store URI where s3:// was taken."""
    name = {"s3": "s3_bucket", "gcs": "gcs_bucket", "azure": "azure_container"}[request.param]
    return request.getfixturevalue(name)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path) -> ObjectStore:
    """An empty ObjectStore on each backend: a tmp folder, then a fresh moto bucket prefix."""
    if request.param == "file":
        return open_store(str(tmp_path / "store"), None)
    s3: S3Bucket = request.getfixturevalue("s3_bucket")
    return open_store(s3.uri, s3=s3.options)


@pytest.fixture(autouse=True)
def _log_handlers_on_live_streams() -> Iterator[None]:
    """Prefect binds its console log handler to ``sys.stderr`` whenever it sets logging up, which can happen
    inside a test that captures output (``capsys``); that stream is closed when the test ends, and the next flow
    with ``log_prints=True`` then recurses on it. After each test, point such handlers back at a live stream."""
    yield
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            stream = getattr(handler, "stream", None)
            if stream is not None and getattr(stream, "closed", False):
                handler.stream = sys.stderr
                console = getattr(handler, "console", None)  # Prefect's rich console keeps its own reference
                if console is not None:
                    console.file = sys.stderr


@pytest.hookimpl(tryfirst=True)  # before `-m lowest` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.lowest_part import mark_lowest_part

    mark_lowest_part(items)
