"""Fixtures for flow tests: one Prefect test server per session and the tiny multi-file corpus."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    from tests.flows.tiny_corpus import write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw", files=4)
    return tmp_path / "raw"
