"""Each way a new user's first hour went wrong (issue 13's table), replayed: exit code and the one last line.

These fail before any flow starts, so they need no Prefect server (and must not start one).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from flows.runtime.local_server import read_state
from tests.fixtures.emulators import AZURITE_KEY, azurite_connection_string
from tests.fixtures.web_archives import Response, write_warc
from tests.flows.cli.conftest import cli_env, run_cli
from tests.flows.prefect_server import free_port


def assert_one_line_failure(done, code: int, *needles: str) -> None:
    assert done.code == code, done.err
    assert done.last_line.startswith("pileworks "), done.err
    for needle in needles:
        assert needle in done.last_line, done.last_line
    assert "Traceback" not in done.err, done.err


def test_a_missing_input_is_one_line(home: Path, tmp_path: Path) -> None:
    done = run_cli(["build", "--input", "./does-not-exist"], cli_env(home), tmp_path)
    assert_one_line_failure(done, 1, "input './does-not-exist' does not exist", "check the path")
    assert done.err.count("\n") == 1 and not done.out
    assert read_state(home) is None  # no Prefect server was started for it


@pytest.mark.parametrize(("given", "says"), [("empty", "is empty"), ("empty/*.jsonl", "matches nothing")])
def test_an_empty_folder_or_a_glob_matching_nothing_says_so(
    home: Path, tmp_path: Path, given: str, says: str
) -> None:
    (tmp_path / "empty").mkdir()
    done = run_cli(["build", "--input", str(tmp_path / given)], cli_env(home), tmp_path)
    assert_one_line_failure(done, 1, says, "check the path or pattern")


def test_missing_s3_credentials_are_one_line(home: Path, tmp_path: Path) -> None:
    done = run_cli(["build", "--input", "s3://corpus/raw/"], cli_env(home), tmp_path)
    assert_one_line_failure(done, 1, "s3://corpus/raw", "credentials")


def test_an_unreachable_s3_endpoint_is_one_line(home: Path, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = cli_env(home, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing-secret")
    done = run_cli(
        ["build", "--input", "s3://corpus/raw/", "--set", f"s3.endpoint_url={dead}"], env, tmp_path
    )
    assert_one_line_failure(done, 1, f"cannot reach the S3 store at {dead}", "check s3.endpoint_url")
    assert done.seconds < 60  # one attempt, short timeouts: not botocore's retries


@pytest.mark.parametrize(
    ("extractor", "blocked", "fix"),
    [
        ("trafilatura", "trafilatura", "install it with pip install 'pileworks[trafilatura]'"),
        (
            "justext",
            "lxml_html_clean",
            "install it with pip install lxml_html_clean",
        ),  # lxml >= 5.2 without it
    ],
)
def test_a_missing_extractor_package_is_one_line_before_any_work(
    home: Path, tmp_path: Path, extractor: str, blocked: str, fix: str
) -> None:
    # the package made unimportable as if it were not installed: a module of its name, first on the path,
    # that raises what Python raises for a missing one
    shadow = tmp_path / "not-installed"
    shadow.mkdir()
    said = f"No module named '{blocked}'"
    (shadow / f"{blocked}.py").write_text(f"raise ModuleNotFoundError({said!r}, name={blocked!r})\n")
    write_warc(tmp_path / "crawl.warc.gz", [Response("https://example.com/", b"<html><p>a page</p></html>")])
    env = cli_env(home, PYTHONPATH=f"{shadow}:{cli_env(home)['PYTHONPATH']}")
    args = [
        "build",
        "--input",
        str(tmp_path / "crawl.warc.gz"),
        "--set",
        f"ingest.html.extractor={extractor}",
    ]
    done = run_cli([*args, "--output", str(tmp_path / "store")], env, tmp_path)
    assert_one_line_failure(done, 1, f"ingest.html.extractor: {extractor} is not installed", fix)
    assert done.err.count("\n") == 1 and not done.out  # one line, and no flow's progress before it
    assert (
        read_state(home) is None and not (tmp_path / "store").exists()
    )  # no Prefect server, no store written


def test_only_an_input_with_html_needs_the_extractor(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from flows.cli.precheck import _check_extractor
    from pipeline.ingest.config import IngestConfig
    from pipeline.ingest.html import ExtractorMissing, HtmlConfig

    monkeypatch.setitem(sys.modules, "trafilatura", None)
    monkeypatch.setattr("pipeline.ingest.html._BUILT", {})
    cfg = IngestConfig(html=HtmlConfig(extractor="trafilatura"))
    _check_extractor(cfg, ["jsonl", "wet.gz", None])  # text and WET: nothing to extract, nothing to check
    for fmt in ("warc", "arc.gz"):
        with pytest.raises(ExtractorMissing, match=r"pip install 'pileworks\[trafilatura\]'"):
            _check_extractor(cfg, ["jsonl", fmt])


@pytest.mark.parametrize(
    ("kind", "case"),
    [
        pytest.param("gcs", "missing", marks=pytest.mark.gcs),
        pytest.param("gcs", "unreachable", marks=pytest.mark.gcs),
        pytest.param("azure", "missing", marks=pytest.mark.azure),
        pytest.param("azure", "wrong key", marks=pytest.mark.azure),
    ],
)
def test_gs_and_az_stores_that_cannot_work_end_in_one_line_in_seconds(
    home: Path, tmp_path: Path, request: pytest.FixtureRequest, kind: str, case: str
) -> None:
    """The output's first request (before Prefect): a missing bucket or container, a dead endpoint, a key
    Azurite refuses. Each is one line and exit 1 in under 5 s, the command's start included."""
    bucket = request.getfixturevalue("gcs_bucket" if kind == "gcs" else "azure_container")
    scheme, flag = ("gs", "--gcs-endpoint-url") if kind == "gcs" else ("az", "--azure-endpoint-url")
    endpoint, target, env = bucket.server, bucket.bucket, {}
    if case == "missing":
        target = "pw-no-such-bucket"
    elif case == "unreachable":
        endpoint = f"http://127.0.0.1:{free_port()}"
    else:
        wrong = base64.b64encode(b"not the key of devstoreaccount1, wrong on purpose!").decode()
        env["AZURE_STORAGE_CONNECTION_STRING"] = azurite_connection_string(bucket.server).replace(
            AZURITE_KEY, wrong
        )
    args = ["build", "--output", f"{scheme}://{target}/out", flag, endpoint]
    done = run_cli(args, cli_env(home, **env), tmp_path)
    says = {
        "missing": ("'pw-no-such-bucket' does not exist", "create it"),
        "unreachable": (f"cannot reach the GCS store at {endpoint}", "check s3.gcs_endpoint_url"),
        "wrong key": ("access denied", "check the credentials"),
    }[case]
    assert_one_line_failure(done, 1, f"{scheme}://{target}/out", *says)
    assert done.err.count("\n") == 1 and done.seconds < 5.0, (done.seconds, done.err)
    assert read_state(home) is None  # no Prefect server was started for it


def test_a_config_typo_names_the_field(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "corpus.yaml"
    bad.write_text("dedup:\n  near:\n    treshold: 0.7\n")
    done = run_cli(["build", "--config", str(bad)], cli_env(home), tmp_path)
    assert_one_line_failure(done, 2, "dedup.near.treshold", "threshold")


def test_train_on_a_missing_dataset_names_it_not_the_launcher(home: Path, tmp_path: Path) -> None:
    done = run_cli(["train", "--manifest", "./nope"], cli_env(home), tmp_path)
    assert_one_line_failure(done, 1, "no dataset at", "nope", "pileworks build")
    assert "Root Cause" not in done.err and "====" not in done.err


def test_a_dead_prefect_api_url_fails_at_once(home: Path, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api"
    done = run_cli(
        ["build", "--output", str(tmp_path / "store")], cli_env(home, PREFECT_API_URL=dead), tmp_path
    )
    assert_one_line_failure(done, 1, dead, "does not answer", "unset PREFECT_API_URL")
    assert done.err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["build", "--set", "dedup"], "--set expects KEY=VALUE"),
        (["run", "--name"], "argument --name: expected one argument"),
        (["reap", "--watch", "0"], "--watch must be > 0"),
    ],
)
def test_usage_errors_exit_2(home: Path, tmp_path: Path, args: list[str], says: str) -> None:
    done = run_cli(args, cli_env(home), tmp_path)
    assert_one_line_failure(done, 2, says)


def test_an_unexpected_failure_keeps_its_traceback(home: Path, tmp_path: Path) -> None:
    # a directory where the manifest file should be: the store cannot read it as JSON (not one of our errors)
    folder = tmp_path / "weird" / "manifest.json"
    folder.mkdir(parents=True)
    done = run_cli(["inspect", "dedup", str(tmp_path / "weird")], cli_env(home), tmp_path)
    assert done.code == 1
    assert "Traceback" in done.err or done.last_line.startswith("pileworks inspect: error:"), done.err


def test_every_option_has_help_text() -> None:
    import argparse

    from flows.cli.main import build_parser

    missing: list[str] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            if not action.help or not action.help.strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    walk("pileworks", build_parser())
    assert not missing, f"options without help text: {missing}"


def test_reap_without_a_server_says_how_to_start_one_and_starts_none(home: Path, tmp_path: Path) -> None:
    done = run_cli(["reap"], cli_env(home), tmp_path)
    assert_one_line_failure(done, 1, "no Prefect server runs", "pileworks server start")
    assert read_state(home) is None
