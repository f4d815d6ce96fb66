"""``pileworks build``: the summary table of a real build of a tiny corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MIN_TASK = {"PILEWORKS_MIN_TASK_BYTES": "1"}


def test_cli_build_prints_the_summary(
    prefect_harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = [
        "build",
        "--input",
        str(tmp_path / "raw"),
        "--output",
        str(tmp_path / "store"),
        "--name",
        "tiny",
        *sets,
    ]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    for label in (
        "documents in",
        "exact duplicates removed",
        "near duplicates removed",
        "tokens",
        "published dataset tiny",
        "  manifest  file://",
        "next:",
    ):
        assert label in out
    assert "ingest" in out and "tokenize" in out
    manifest = next(line for line in out.splitlines() if line.startswith("  manifest  "))

    assert main(argv) == 0  # again, nothing changed: the same dataset, said so
    again = capsys.readouterr().out
    assert "nothing changed: dataset tiny" in again and manifest in again.splitlines()


@pytest.fixture(scope="module")
def published(server_home: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict]:
    """A tiny corpus built once by ``pileworks build --json``: its folder, the command and the summary."""
    from tests.flows.cli.conftest import cli_env, run_cli
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    root = tmp_path_factory.mktemp("published")
    write_tiny_corpus(root / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = ["build", "--input", str(root / "raw"), "--output", str(root / "store"), "--name", "tiny", *sets]
    argv += ["--json", "--workers", "1"]
    cold = run_cli(argv, cli_env(server_home), root)
    assert cold.code == 0, cold.err[-3000:]
    return root, argv, json.loads(cold.out)


def _prefect_modules(importtime_trace: str) -> list[str]:
    """Modules of the ``prefect`` package in a ``-X importtime`` trace."""
    names = [
        line.rsplit("|", 1)[-1].strip() for line in importtime_trace.splitlines() if "import time:" in line
    ]
    return [n for n in names if n == "prefect" or n.startswith("prefect.")]


def test_a_rebuild_with_nothing_changed_starts_no_flow_engine_and_records_a_completed_run(
    server_home: Path, published: tuple[Path, list[str], dict]
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.runtime.local_server import read_state
    from tests.flows.cli.conftest import cli_env, run_cli

    root, argv, cold = published
    again = run_cli(argv, cli_env(server_home, PYTHONPROFILEIMPORTTIME="1"), root)
    assert again.code == 0, again.err[-3000:]
    imported = _prefect_modules(again.err)
    assert "prefect.client.orchestration" in imported  # recorded through Prefect's own client
    assert "prefect.flow_engine" not in imported and "prefect.task_engine" not in imported
    summary = json.loads(again.out)
    assert summary["dataset_id"] == cold["dataset_id"] and summary["manifest_uri"] == cold["manifest_uri"]
    assert summary["nothing_changed"] == {"published_by": cold["lineage"]["prefect_flow_run_id"]}
    assert summary["profile"]["workers_started"] == 0 and summary["profile"]["task_runs"] == 0
    assert set(summary) == set(cold) | {"nothing_changed"}
    latest = json.loads((root / "store" / "datasets" / "tiny" / "latest.json").read_text())
    assert latest["dataset_id"] == cold["dataset_id"]

    run_id = summary["lineage"]["prefect_flow_run_id"]
    state = read_state(server_home)
    assert state is not None and summary["flow_run_url"] == f"{state.url}/runs/flow-run/{run_id}"
    with temporary_settings(updates={PREFECT_API_URL: state.api_url}), get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        flow = client.read_flow(run.flow_id)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    assert run.state is not None and run.state.is_completed()
    assert flow.name == "build_corpus" and run.name == f"build tiny {cold['dataset_id'][:8]} (unchanged)"
    assert run.parameters["inputs"] == [str(root / "raw")] and run.parameters["name"] == "tiny"
    note = next(a for a in artifacts if a.key == "nothing-changed")
    assert cold["dataset_id"] in str(note.data) and str(root / "store") in str(note.data)
    assert {a.key for a in artifacts} == {"nothing-changed", "stage-stats"}


def test_a_rebuild_the_api_cannot_record_runs_the_flow_and_credentials_do_not_stop_the_record(
    server_home: Path, published: tuple[Path, list[str], dict]
) -> None:
    from flows.build.unchanged import find_published
    from flows.cli.build import flow_parameters, unchanged_before_flow
    from flows.cli.main import build_parser
    from flows.runtime.local_server import Api
    from flows.runtime.profile import BuildProfile
    from tests.flows.cli.conftest import cli_env, run_cli
    from tests.flows.prefect_server import free_port

    root, argv, cold = published
    latest = root / "store" / "datasets" / "tiny" / "latest.json"
    before = latest.read_text()
    parameters = flow_parameters(build_parser().parse_args(argv))
    assert find_published(parameters, BuildProfile()) is not None  # published: only the API is missing
    dead = Api(url=f"http://127.0.0.1:{free_port()}/api", ui_url=None, source="PREFECT_API_URL")
    assert unchanged_before_flow(dead, parameters) is None  # the API is down: run the flow
    assert latest.read_text() == before  # and nothing was written meanwhile

    # credentials: Prefect's client sends them, so the run is still recorded without the flow engine
    env = cli_env(server_home, PREFECT_API_AUTH_STRING="user:secret", PYTHONPROFILEIMPORTTIME="1")
    again = run_cli(argv, env, root)
    assert again.code == 0, again.err[-3000:]
    assert "prefect.flow_engine" not in _prefect_modules(again.err)
    summary = json.loads(again.out)
    assert summary["nothing_changed"] == {"published_by": cold["lineage"]["prefect_flow_run_id"]}
    assert set(summary) == set(cold) | {"nothing_changed"} and summary["dataset_id"] == cold["dataset_id"]


def test_a_rebuild_after_a_change_lists_its_inputs_once(
    prefect_harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command lists the inputs before Prefect (to find an unchanged rebuild); when something changed the flow's
    plan-inputs step starts from that listing instead of listing the corpus again."""
    from flows.build import inputs, steps
    from flows.build.unchanged import find_published
    from flows.cli.build import flow_parameters
    from flows.cli.main import build_parser, main
    from flows.runtime.profile import BuildProfile
    from pipeline.ingest import stage as ingest
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    paths = write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = ["build", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "store"), "--name", "tiny"]
    argv += [*sets, "--json", "--workers", "1"]
    assert main(argv) == 0
    capsys.readouterr()
    assert not inputs._LISTED  # the command ended: nothing kept

    extra = write_tiny_corpus(tmp_path / "extra", files=1, docs_per_file=1, seed=99)
    with open(paths[0], "a", encoding="utf-8") as fh:  # one more document in one file
        fh.write(Path(extra[0]).read_text(encoding="utf-8"))
    listed: list[list[str]] = []
    real = ingest.list_inputs

    def counted(uris: list[str], **kwargs):  # our own listing, counted (what it lists are real files)
        listed.append(list(uris))
        return real(uris, **kwargs)

    monkeypatch.setattr(ingest, "list_inputs", counted)
    parameters = flow_parameters(build_parser().parse_args(argv))
    assert find_published(parameters, BuildProfile()) is None  # changed: the flow runs
    before = len(listed)
    assert before >= 1
    config = next(iter(inputs._LISTED))  # kept for the flow, under its config
    planned = steps.plan_inputs(json.loads(config))
    assert len(listed) == before  # the flow's step took the listing: no second listing
    assert any(i["size"] == Path(paths[0]).stat().st_size for i in planned["inputs"])  # the fresh one
    assert steps.plan_inputs(json.loads(config)) == planned and len(listed) == 2 * before  # taken once only


def test_a_build_on_local_workers_starts_its_first_pass_before_prefect(
    prefect_harness,
    server_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With two workers the command starts the ingest tasks before it imports Prefect; the flow's ingest task runs
    collect exactly those calls (none computed twice), and the dataset is the one a single worker builds. The
    ``pileworks`` command, one thread until it imports Prefect, forks the workers from itself; with one worker
    (a thread of the flow's process) it forks one for the ingest, only where it can fork."""
    from flows.build import head_start
    from flows.cli.main import main
    from flows.runtime import pool
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    monkeypatch.setenv(*next(iter(MIN_TASK.items())))  # the tiny corpus in several tasks per pass
    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    summaries = {}
    for workers in (2, 1):
        argv = ["build", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / f"store{workers}")]
        argv += ["--name", "tiny", *sets, "--json", "--workers", str(workers)]
        assert main(argv) == 0
        summaries[workers] = json.loads(capsys.readouterr().out)
        assert head_start._HEAD is None and pool.early_summary() is None  # nothing kept past the command
    two, one = summaries[2]["profile"], summaries[1]["profile"]
    ingest = next(p for p in two["passes"] if p["name"] == "ingest+count")
    early = two["head_start"]
    assert ingest["task_runs"] >= 2 and early["calls"] == early["claimed"] == ingest["task_runs"]
    assert early["start"] < two["passes"][0]["start"]  # working before the flow's first step
    assert summaries[2]["reused_units"]["ingest"][0] == 0  # each unit computed once, by the head start
    assert (
        two["workers_started"] == 2 and one["head_start"] is None
    )  # one worker in a process of many threads
    assert summaries[2]["dataset_id"] == summaries[1]["dataset_id"]

    from tests.flows.cli.conftest import cli_env, run_cli

    argv = ["build", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "store3"), "--name", "tiny"]
    done = run_cli([*argv, *sets, "--json", "--workers", "2"], cli_env(server_home, **MIN_TASK), tmp_path)
    assert done.code == 0, done.err[-3000:]
    forked = json.loads(done.out)
    assert forked["profile"]["head_start"]["forked"] is True
    training = next(p for p in forked["profile"]["passes"] if p["name"] == "train-tokenizer")
    assert training["threads"] == 2  # the build's workers, not the one thread each worker encodes with
    assert forked["profile"]["head_start"]["claimed"] == ingest["task_runs"]
    assert forked["dataset_id"] == summaries[1]["dataset_id"]
    assert done.err.count("head start: ") == 1

    # one worker: the flow's thread, but its ingest ran before Prefect, in a fork of the command
    argv[argv.index(str(tmp_path / "store3"))] = str(tmp_path / "store4")
    done = run_cli([*argv, *sets, "--json", "--workers", "1"], cli_env(server_home, **MIN_TASK), tmp_path)
    assert done.code == 0, done.err[-3000:]
    alone = json.loads(done.out)
    head, passes = alone["profile"]["head_start"], alone["profile"]["passes"]
    assert head["forked"] is True and head["calls"] == head["claimed"] == 1
    assert head["start"] < passes[0]["start"]  # working before the flow's first step
    assert alone["profile"]["workers_started"] == 0 and alone["profile"]["workers_in_process"] == 1
    assert alone["reused_units"]["ingest"][0] == 0  # each unit computed once, by the head start
    assert alone["dataset_id"] == summaries[1]["dataset_id"]


def test_the_head_start_is_at_work_before_the_command_imports_prefect(
    server_home: Path, tmp_path: Path
) -> None:
    """The head start's workers ingest while the command imports Prefect (about a second of one core), not after:
    Python's own import log (``PYTHONPROFILEIMPORTTIME``, on the same stderr as the command's log) shows its line
    before the first Prefect module's."""
    import re

    from tests.flows.cli.conftest import cli_env, run_cli
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = ["build", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "store"), "--name", "tiny"]
    env = cli_env(server_home, PYTHONPROFILEIMPORTTIME="1", **MIN_TASK)
    done = run_cli([*argv, *sets, "--json", "--workers", "2"], env, tmp_path)
    assert done.code == 0, done.err[-3000:]
    lines = done.err.splitlines()
    head = [i for i, line in enumerate(lines) if "head start: " in line]
    prefect = [i for i, line in enumerate(lines) if re.match(r"import time:.*\|\s+prefect(\.\S+)?$", line)]
    assert len(head) == 1 and prefect, done.err[-3000:]
    assert head[0] < prefect[0], "\n".join(lines[prefect[0] - 5 : prefect[0] + 1])


def test_a_build_on_local_workers_sets_one_blas_thread_before_numpy_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head start forks its workers from the command, so the command sets ``OMP_NUM_THREADS=1`` before numpy
    loads; never ``RAYON_NUM_THREADS``, which it reads as the user's choice of training threads (a tokenizer
    trained on one thread at two workers). The name is taken out again, also when the precheck fails."""
    import os

    from flows.cli import build
    from flows.cli.main import build_parser
    from flows.runtime import profile
    from tests.flows.tiny_corpus import write_tiny_corpus

    for name in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "PILEWORKS_THREADS"):
        monkeypatch.delenv(name, raising=False)
    write_tiny_corpus(tmp_path / "raw")
    args = build_parser().parse_args(["build", "--input", str(tmp_path / "raw"), "--workers", "2"])
    build.precheck(args)
    assert os.environ.get("OMP_NUM_THREADS") == "1"
    assert "RAYON_NUM_THREADS" not in os.environ and "PILEWORKS_THREADS" not in os.environ
    assert profile.COMMAND_STORAGE0 is not None  # the build's S3 count starts with the command
    build.restore_env()
    assert "OMP_NUM_THREADS" not in os.environ and profile.COMMAND_STORAGE0 is None
    missing = build_parser().parse_args(["build", "--input", str(tmp_path / "none"), "--workers", "2"])
    with pytest.raises(Exception, match="none"):
        build.precheck(missing)
    assert "OMP_NUM_THREADS" not in os.environ and profile.COMMAND_STORAGE0 is None
    one = build_parser().parse_args(["build", "--input", str(tmp_path / "raw"), "--workers", "1"])
    build.precheck(one)
    assert "OMP_NUM_THREADS" not in os.environ  # one worker: a thread of this process, nothing forked


@pytest.mark.s3
@pytest.mark.parametrize("workers", [2, 1])
def test_a_build_s_profile_counts_every_s3_call_but_those_after_it(
    prefect_harness,
    s3_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    workers: int,
) -> None:
    """The build's S3 count (``profile["storage"]``) is what the store saw, through a counting proxy: the calls
    of the command before the flow (its listing, the head start's lease), of the worker processes' task bodies
    outside their steps (contexts, done markers, stats) and inside them; all but the few the flow makes after
    it wrote the profile (its artifacts' reads, the published record, the lease released: six here, one more
    should a lease refresh fall there)."""
    from flows.cli.main import main
    from tests.fixtures.fault_proxy import FaultProxy
    from tests.fixtures.s3_corpus import FAST_BUILD, upload_corpus, write_corpus

    monkeypatch.setenv(*next(iter(MIN_TASK.items())))  # several tasks per pass on two workers
    write_corpus(tmp_path / "raw", megabytes=0.5)
    inputs = upload_corpus(tmp_path / "raw", s3_server, f"pw-count{workers}")
    proxy = FaultProxy(s3_server)
    overrides = FAST_BUILD | {"ingest.target_part_bytes": 100_000, "s3.endpoint_url": proxy.url}
    argv = ["build", "--input", inputs, "--output", f"s3://pw-count{workers}/store", "--json"]
    argv += ["--workers", str(workers), "--set=s3.region=us-east-1"]
    argv += [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    try:
        assert main(argv) == 0
        requests = proxy.counts()["requests"]
    finally:
        proxy.close()
    profile = json.loads(capsys.readouterr().out)["profile"]
    assert profile["workers_started"] == (2 if workers == 2 else 0)  # one worker: in the flow's process
    assert (profile["head_start"] is not None) is (workers == 2)
    assert requests > 1000  # hundreds of parts' reads and writes
    assert 0 <= requests - profile["storage"]["attempts"] <= 7, (requests, profile["storage"])
