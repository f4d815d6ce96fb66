"""build_corpus end to end under Prefect: outputs, determinism, incremental rebuilds, failure and rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.dataset.manifest import load_manifest
from tests.flows.tiny_corpus import TINY_OVERRIDES

pytestmark = pytest.mark.slow


def _build(tiny_corpus: Path, out: Path, **extra):
    from flows.build.flow import build_corpus

    return build_corpus(inputs=[str(tiny_corpus)], output=str(out), overrides=TINY_OVERRIDES | extra)


def _docs_in(folder: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in folder.glob("*.jsonl"))


def test_build_tiny_corpus_publishes_a_consistent_dataset(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    summary = _build(tiny_corpus, tmp_path / "store")
    manifest, _ = load_manifest(summary["manifest_uri"], None)
    assert summary["dataset_id"] == manifest.dataset_id
    assert summary["docs_in"] == _docs_in(tiny_corpus)
    assert summary["exact_duplicates"] == 1
    assert summary["near_duplicates"] == 1
    assert sum(s.docs for s in manifest.shards) == summary["docs_out"]
    assert manifest.stats["ingest"]["docs_out"] == _docs_in(tiny_corpus)
    run_id = manifest.lineage["prefect_flow_run_id"]
    assert run_id
    from prefect.client.orchestration import get_client

    from flows.runtime.heartbeat import Beat

    with get_client(sync_client=True) as client:
        labels = client.read_flow_run(run_id).labels
    assert Beat.from_labels(run_id, labels) is not None, "build_corpus must write heartbeats for the reaper"
    assert (tmp_path / "store" / "indexes" / "tiny" / manifest.dataset_id / "index.json").is_file()
    assert summary["dedup_index_uri"].endswith(f"indexes/tiny/{manifest.dataset_id}")
    latest = json.loads((tmp_path / "store" / "datasets" / "tiny" / "latest.json").read_text())
    assert latest["dataset_id"] == manifest.dataset_id


def test_rebuild_is_incremental(prefect_harness, tiny_corpus: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cold = _build(tiny_corpus, store)
    parts = cold["reused_units"]["ingest"][1]
    assert parts >= 4 and cold["reused_units"]["ingest"][0] == 0

    with ChildProcesses() as during:
        same = _build(tiny_corpus, store)
    assert same["dataset_id"] == cold["dataset_id"]
    assert all(reused == total for reused, total in same["reused_units"].values())
    # Nothing changed: no worker process started (the cold build started its own), one task run (listing the
    # inputs), and the run is recorded, completed, with an artifact linking the published dataset.
    started = cold["profile"]["workers_started"] + cold["profile"]["workers_in_process"]
    assert started >= 1 and "nothing_changed" not in cold
    assert same["nothing_changed"] == {"published_by": cold["lineage"]["prefect_flow_run_id"]}
    assert same["profile"]["workers_started"] == 0 and same["profile"]["task_runs"] == 1
    assert during.started == set(), during.started
    assert same["manifest_uri"] == cold["manifest_uri"] and same["shard_table"] == cold["shard_table"]
    _assert_recorded_unchanged(same)

    changed = tiny_corpus / "part-1.jsonl"
    lines = changed.read_text().splitlines()
    changed.write_text("\n".join(lines[:-1]) + "\n")  # one document fewer in one file
    warm = _build(tiny_corpus, store)
    assert warm["dataset_id"] != cold["dataset_id"] and "nothing_changed" not in warm
    reused, total = warm["reused_units"]["ingest"]
    assert total == parts and reused >= total - 2, warm[
        "reused_units"
    ]  # only the changed file's part(s) redone
    assert warm["reused_units"]["signatures"][0] >= total - 2
    assert warm["docs_in"] == cold["docs_in"] - 1


def test_a_rebuild_whose_new_document_is_dropped_reuses_the_published_dataset(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    """Inputs changed, shards did not (the new document is an exact duplicate): the published dataset is reused as
    it is, becomes ``latest`` again, and everything after publish reports it; the next rebuild is a no-change one."""
    from flows.build.unchanged import find_published
    from flows.runtime.profile import BuildProfile
    from pipeline.dataset.card import read_card

    store, part0, part1 = tmp_path / "store", tiny_corpus / "part-0.jsonl", tiny_corpus / "part-1.jsonl"
    cold = _build(tiny_corpus, store)
    dataset = store / "datasets" / "tiny" / cold["dataset_id"]
    published = {p.name: p.read_bytes() for p in dataset.glob("*.json")}  # manifest, card, tokenizer files
    kept = part1.read_text()
    part1.write_text("".join(kept.splitlines(keepends=True)[:-1]))  # another dataset becomes latest
    assert _build(tiny_corpus, store)["dataset_id"] != cold["dataset_id"]
    part1.write_text(kept)
    part0.write_text(part0.read_text() + part0.read_text().splitlines(keepends=True)[0])

    reused = _build(tiny_corpus, store)
    assert (reused["dataset_id"], reused["manifest_uri"]) == (cold["dataset_id"], cold["manifest_uri"])
    assert reused["reused"]["published_by"] == cold["lineage"]["prefect_flow_run_id"]
    assert {"inputs", "stats"} <= set(reused["reused"]["fields_differ"])
    assert reused["reused"]["docs_in_this_run"] == cold["docs_in"] + 1
    # the summary is the published dataset's, as its manifest and card list it
    assert (reused["docs_in"], reused["stages"], reused["shard_table"]) == (
        cold["docs_in"],
        cold["stages"],
        cold["shard_table"],
    )
    assert {p.name: p.read_bytes() for p in dataset.glob("*.json")} == published  # immutable
    assert read_card(*load_manifest(reused["manifest_uri"], None))["docs_in"] == cold["docs_in"]
    latest = json.loads((store / "datasets" / "tiny" / "latest.json").read_text())
    assert latest["dataset_id"] == cold["dataset_id"]

    parameters = {"config_path": None, "inputs": [str(tiny_corpus)], "output": str(store), "name": None}
    assert find_published(parameters | {"overrides": TINY_OVERRIDES}, BuildProfile()) is not None
    again = _build(tiny_corpus, store)
    assert again["dataset_id"] == cold["dataset_id"] and "reused" not in again
    assert again["nothing_changed"] == {"published_by": cold["lineage"]["prefect_flow_run_id"]}


class ChildProcesses:
    """The child processes this process started while the block ran (sampled every 20 ms)."""

    def __enter__(self) -> ChildProcesses:
        import threading

        import psutil

        self.me, self.started, self.done = psutil.Process(), set(), threading.Event()
        self.before = {p.pid for p in self.me.children(recursive=True)}
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.started |= {p.pid for p in self.me.children(recursive=True)} - self.before

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def _assert_recorded_unchanged(summary: dict) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id = summary["lineage"]["prefect_flow_run_id"]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    assert run.state is not None and run.state.is_completed()
    notes = [a for a in artifacts if a.key == "nothing-changed"]
    assert len(notes) == 1 and summary["dataset_id"] in str(notes[0].data)
    assert "Nothing changed" in str(notes[0].data)


def test_same_inputs_same_dataset_id_in_a_fresh_store(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    a = _build(tiny_corpus, tmp_path / "a")
    b = _build(tiny_corpus, tmp_path / "b")
    assert a["dataset_id"] == b["dataset_id"]
    for sa, sb in zip(a["shard_table"], b["shard_table"], strict=True):
        assert sa["sha256"] == sb["sha256"]


def test_a_failed_build_names_the_stage_and_a_rerun_resumes(
    prefect_harness, tiny_corpus: Path, tmp_path: Path
) -> None:
    from prefect.states import State

    from flows.build.flow import build_corpus

    out = tmp_path / "store"
    state: State = build_corpus(
        inputs=[str(tiny_corpus)],
        output=str(out),
        overrides=TINY_OVERRIDES | {"tokenize.tokenizer": str(tmp_path / "missing-tokenizer.json")},
        return_state=True,
    )
    assert state.is_failed()
    assert "tokenizer" in state.message.lower()
    done_before = sorted(p.name for p in out.rglob("clean/part-*.done"))
    assert done_before, "the stages before the failure must have completed their units"
    summary = _build(tiny_corpus, out)
    assert summary["reused_units"]["clean"][0] == summary["reused_units"]["clean"][1]


def test_the_least_input_per_task_is_a_runtime_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PILEWORKS_MIN_TASK_BYTES`` deals the same parts to more or fewer tasks (ids do not depend on it)."""
    from flows.build.plan import MIN_TASK_BYTES, min_task_bytes

    monkeypatch.delenv("PILEWORKS_MIN_TASK_BYTES", raising=False)
    assert min_task_bytes() == MIN_TASK_BYTES
    monkeypatch.setenv("PILEWORKS_MIN_TASK_BYTES", "1")
    assert min_task_bytes() == 1
    monkeypatch.setenv("PILEWORKS_MIN_TASK_BYTES", "8MB")
    with pytest.raises(ValueError, match="PILEWORKS_MIN_TASK_BYTES"):
        min_task_bytes()
