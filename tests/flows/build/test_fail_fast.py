"""What cannot succeed fails at once, with one line naming the object or path and the fix (no retries)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli.main import main as cli

pytestmark = [pytest.mark.s3]

# The target is 5 s on a quiet machine (tests/bench/bench_cli.py measures it); this bound only has to rule out
# Prefect's whole retry chain (2 + 10 + 30 s), with room for a loaded 2-core CI machine (22 s seen at load 10).
# That no retry happens at all for these errors is asserted directly by test_prefect_retries_only_what_may_succeed.
FAST = 30.0


@pytest.fixture(scope="module")
def warm_prefect(prefect_harness) -> None:
    """Pay Prefect's first-flow-run cost in this process (seconds of imports and API set-up) before the clock
    runs: the tests time how fast a failure surfaces, which before this fix took 2 + 10 + 30 s of retries."""
    from prefect import flow

    import flows.build.flow  # noqa: F401

    @flow(name="warm-up")
    def warm_up() -> int:
        return 1

    assert warm_up() == 1


def _timed(argv: list[str]) -> tuple[int, float]:
    started = time.monotonic()
    code = cli(argv)
    seconds = time.monotonic() - started
    print(f"\n{argv[0]} {argv[2] if len(argv) > 2 else ''}: exit {code} after {seconds:.2f} s")  # -s shows it
    return code, seconds


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("pileworks ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_missing_input_fails_at_once(warm_prefect, tmp_path: Path, capsys) -> None:
    code, seconds = _timed(
        ["build", "--input", str(tmp_path / "no-such-dir"), "--output", str(tmp_path / "out")]
    )
    line = _one_line(capsys.readouterr().err)
    print(line)
    assert code != 0 and seconds < FAST, (code, seconds)
    assert "no-such-dir" in line


def test_a_missing_s3_input_fails_at_once(warm_prefect, s3_bucket, tmp_path: Path, capsys) -> None:
    flags = ["--s3-endpoint-url", s3_bucket.options.endpoint_url, "--s3-region", "us-east-1"]
    code, seconds = _timed(
        ["build", "--input", f"{s3_bucket.uri}/nothing-here/", "--output", str(tmp_path / "out"), *flags]
    )
    line = _one_line(capsys.readouterr().err)
    print(line)
    assert code != 0 and seconds < FAST, (code, seconds)
    assert f"{s3_bucket.uri}/nothing-here/" in line


def test_missing_credentials_fail_at_once(
    warm_prefect, s3_bucket, tmp_path: Path, monkeypatch, capsys
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from pipeline.storage import s3 as s3mod

    monkeypatch.setattr(s3mod, "_clients", {})  # clients built earlier hold the test credentials
    flags = ["--s3-endpoint-url", s3_bucket.options.endpoint_url, "--s3-region", "us-east-1"]
    code, seconds = _timed(["build", "--output", s3_bucket.uri, *flags])
    line = _one_line(capsys.readouterr().err)
    print(line)
    assert code != 0 and seconds < FAST, (code, seconds)
    assert s3_bucket.uri in line and "AWS_ACCESS_KEY_ID" in line


def _userns_tmpfs_usable() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


RUNNER = """
import sys, time
from flows.cli.main import main
import flows.build.flow  # imports first: the clock measures the failure, not Python's start-up
t = time.monotonic()
code = main(sys.argv[1:])
print(f"ELAPSED {time.monotonic() - t:.2f}", file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.skipif(not _userns_tmpfs_usable(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_full_disk_fails_at_once(warm_prefect, tmp_path: Path) -> None:
    """A real ENOSPC: the output folder is a 512 KiB tmpfs (in a private mount namespace)."""
    from prefect.settings import PREFECT_API_URL

    mnt = tmp_path / "small"
    mnt.mkdir()
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    cmd = [
        "unshare",
        "-rm",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=512k tmpfs "{mnt}" && exec "$@"',
        "sh",
        sys.executable,
        "-c",
        RUNNER,
        "build",
        "--output",
        str(mnt / "store"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0, out.stderr[-2000:]
    seconds = float(out.stderr.rsplit("ELAPSED ", 1)[1].split()[0])
    line = _one_line(out.stderr)
    print(f"\nfull disk: exit {out.returncode} after {seconds:.2f} s: {line}")
    assert seconds < FAST, (seconds, line)
    assert "no space left" in line and str(mnt) in line and "free disk space" in line


def test_prefect_retries_only_what_may_succeed() -> None:
    """The retry condition of the I/O tasks: a whole-unit retry for transient trouble, none for the rest."""
    import errno

    from prefect.states import Failed

    from flows.build.context import _worth_retrying
    from pipeline.errors import StageFailed
    from pipeline.storage import StorageError
    from pipeline.storage.retry import PermanentStorageError

    def failed_with(inner: BaseException) -> object:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise StageFailed(f"stage 'ingest' part 0 failed: {exc}") from exc
        except StageFailed as outer:
            return Failed(data=outer)

    for permanent in (
        FileNotFoundError("s3://b/in/x.jsonl does not exist"),
        PermissionError("access denied"),
        ValueError("input source holds no file"),
        OSError(errno.ENOSPC, "no space left writing /x"),
        PermanentStorageError("no credentials"),
    ):
        assert not _worth_retrying(None, None, failed_with(permanent)), permanent
    for transient in (StorageError("S3 put failed after 40 tries in 120 s"), ConnectionResetError("reset")):
        assert _worth_retrying(None, None, failed_with(transient)), transient
