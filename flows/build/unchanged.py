"""A rebuild that finds its dataset already published does almost nothing.

The work folder's name (``build_key``) hashes the config (its inputs relative to the input root), the code
version, every input's name, size and content digest and the part plan (without URIs), so a moved, copied or
touched corpus has the same key: a rebuild with the same key reads the same bytes with the same rules, so it would publish
the same dataset id. A published build leaves ``work/<build_key>/published.json`` (the summary it returned and
a digest of the few files its config names besides the inputs: blocklists, bad words, a given tokenizer); a
later build with the same key, the same digest and the dataset's manifest still in place returns that summary
at once, before any worker process starts (``flows/build/flow.py``). Configs that read data we cannot
fingerprint cheaply (decontamination eval sets, a dedup index of an earlier dataset) always take the full path,
where every unit is still reused.

``pileworks build`` looks first, before it starts the flow engine (:func:`find_published`, the same listing and
key as the flow's), and when the dataset is published records the run through Prefect's client
(:func:`record_unchanged`, ``flows/runtime/recorded_run.py``): the same completed run, artifacts, summary and
``latest.json`` as the flow would leave, for about one CPU-second (Prefect's import) instead of three.

A build whose inputs changed but whose dataset id (a content hash) is already published, say a new document the
build drops, reuses that dataset as it is (:func:`reused_dataset`): its summary, card and artifacts report the
published manifest, ``reused`` says so, and its record makes the next rebuild of the same inputs a no-change one.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from flows.build.inputs import build_key, corpus_config, keep_listing, list_and_plan, pin_model, take_listing
from flows.runtime import profile
from flows.runtime.profile import BuildProfile
from flows.ui import build_artifacts, run_names
from pipeline.corpus_config import CorpusConfig
from pipeline.dataset.manifest import LATEST_KEY, MANIFEST_KEY, dataset_prefix, load_manifest, point_latest
from pipeline.storage import ObjectStore, join_key, open_store, read_object
from pipeline.units.protocol import StageStats

RECORD = "published.json"


def config_files(cfg: CorpusConfig) -> list[tuple[str, str]] | None:
    """The small files the config names besides the inputs, as ``(field, uri)``; None when it reads data that
    only a full build checks (eval sets, an earlier dataset's dedup index)."""
    if cfg.decontam.enabled or cfg.dedup.near.index_uri:
        return None
    files = [("clean.url.blocklist", uri) for uri in cfg.clean.url.blocklist] if cfg.clean.url.enabled else []
    if cfg.clean.c4.enabled and cfg.clean.c4.bad_words_file:
        files.append(("clean.c4.bad_words_file", cfg.clean.c4.bad_words_file))
    if cfg.tokenize.tokenizer:
        files.append(("tokenize.tokenizer", cfg.tokenize.tokenizer))
    return files


def files_digest(cfg: CorpusConfig) -> str | None:
    """sha256 of the contents of :func:`config_files` (None: no shortcut for this config)."""
    files = config_files(cfg)
    if files is None:
        return None
    h = hashlib.sha256()
    for field, uri in files:
        h.update(hashlib.sha256(read_object(uri, cfg.s3, field)).digest())
    return h.hexdigest()[:24]


def published_record(store: ObjectStore, work: str, cfg: CorpusConfig) -> dict[str, Any] | None:
    """The record of the build that published this work folder's dataset, when nothing it read has changed
    and its manifest is still in place; else None (build as usual)."""
    key = f"{work}/{RECORD}"
    if not store.exists(key):
        return None
    record = json.loads(store.get_bytes(key))
    digest = files_digest(cfg)
    if digest is None or record.get("files_digest") != digest:
        return None
    summary = record["summary"]
    if not store.exists(f"{dataset_prefix(summary['name'], summary['dataset_id'])}/{MANIFEST_KEY}"):
        return None  # the dataset was deleted since: build it again (its units are reused)
    return dict(record)


def record_published(store: ObjectStore, work: str, cfg: CorpusConfig, summary: dict[str, Any]) -> None:
    """Leave the record a later build with the same inputs and config returns at once (nothing for configs
    :func:`config_files` cannot fingerprint)."""
    digest = files_digest(cfg)
    if digest is not None:
        record = {"files_digest": digest, "summary": summary}
        store.put_bytes(f"{work}/{RECORD}", json.dumps(record).encode())


def unchanged_summary(
    record: dict[str, Any], flow_run_id: str | None, build_key: str, seconds: float, input_root: str = ""
) -> dict[str, Any]:
    """The published build's summary as this run's: every unit reused, this run's lineage and time, and
    ``nothing_changed`` with the run that published it."""
    summary = dict(record["summary"])
    reused = summary.get("reused_units", {})
    summary["reused_units"] = {step: [counts[1], counts[1]] for step, counts in reused.items()}
    # a recorded build that reused a published dataset did not publish it: the run that did is named
    publisher = summary.pop("reused", {}).get("published_by")
    by = publisher or summary.get("lineage", {}).get("prefect_flow_run_id")
    summary["nothing_changed"] = {"published_by": by}
    summary["lineage"] = {"prefect_flow_run_id": flow_run_id, "build_key": build_key}
    if input_root:  # where this run found the inputs (a moved corpus: not where the dataset was built from)
        summary["lineage"]["input_root"] = input_root
    summary["seconds"] = round(seconds, 2)
    return summary


@dataclass(frozen=True, kw_only=True)
class Published:
    """A build whose dataset is published from the same inputs and config: its config, store, work folder and
    :data:`RECORD`."""

    cfg: CorpusConfig
    store: ObjectStore
    work: str
    record: dict[str, Any]
    input_root: str = ""  # where this build's inputs lie (the dataset's lineage may name another place)

    def __post_init__(self) -> None:
        if not self.work.startswith("work/"):
            raise ValueError(f"work: {self.work!r} is not a work folder (work/<build_key>)")


def republished(
    found: Published, build_profile: BuildProfile, started: float, run_id: str | None, workers_started: int
) -> dict[str, Any]:
    """This run's summary (:func:`unchanged_summary`, with its profile) once the published dataset is
    ``latest`` again."""
    summary = unchanged_summary(
        found.record, run_id, found.work.split("/")[-1], time.perf_counter() - started, found.input_root
    )
    point_latest(found.store, found.cfg.name, summary["dataset_id"])
    summary["profile"] = build_profile.to_json() | {
        "parts": summary["profile"]["parts"],
        "parts_per_task": 0,
        "workers": 0,
        "workers_started": workers_started,
    }
    return summary


def reused_dataset(
    manifest_uri: str, cfg: CorpusConfig, stats: dict[str, StageStats], reused: dict[str, Any]
) -> tuple[dict[str, StageStats], dict[str, Any]]:
    """A build whose inputs changed but whose shards came out as a published dataset's (``reused``: what the
    commit step found differs). Returns the published dataset's stats, which the summary, card and artifacts
    then report (its manifest lists them, not this run's), and the summary's ``reused`` note: the fields that
    differ, the flow run that published the dataset and the documents this run read."""
    manifest, _ = load_manifest(manifest_uri, cfg.s3)
    published = {k: StageStats.from_json(manifest.stats[k]) for k in stats if k in manifest.stats}
    note = reused | {
        "published_by": manifest.lineage.get("prefect_flow_run_id"),
        "docs_in_this_run": stats["ingest"].docs_in if "ingest" in stats else None,
    }
    return published, note


def reused_line(summary: dict[str, Any]) -> str:
    reused = summary["reused"]
    return (
        f"inputs changed but the dataset's content did not: reusing dataset {summary['dataset_id']} published "
        f"at {summary['manifest_uri']} (by flow run {reused['published_by']}), unchanged; this build's "
        f"{', '.join(reused['fields_differ']) or 'metadata'} differ from its manifest's"
    )


def nothing_changed_line(summary: dict[str, Any]) -> str:
    return (
        f"nothing changed: dataset {summary['dataset_id']} is published at {summary['manifest_uri']} "
        f"(by flow run {summary['nothing_changed']['published_by']})"
    )


def find_published(parameters: dict[str, Any], build_profile: BuildProfile) -> Published | None:
    """Before the flow runs: the build of the flow's ``parameters`` when its dataset is published from the same
    inputs and config (listed and keyed as the flow does), else None (run the flow)."""
    cfg = corpus_config(parameters)
    if config_files(cfg) is None:  # no record is ever written for it
        return None
    store = open_store(cfg.output, cfg.s3)
    if not store.exists(join_key("datasets", cfg.name, LATEST_KEY)):  # nothing of this name published here:
        return None  # a cold build lists its inputs once, in the flow
    cfg = pin_model(cfg)
    with build_profile.run_pass("plan-inputs") as entry, profile.measure("plan-inputs"):
        entry["task_runs"] = 0  # listed here, not in a task run
        planned = take_listing(cfg.to_dict()) or list_and_plan(cfg.to_dict())  # the head start's, if any
    work = f"work/{build_key(cfg, planned)}"
    record = published_record(store, work, cfg)
    if record is None:  # the flow runs next, in this process: it starts from this listing
        keep_listing(cfg.to_dict(), planned)
        return None
    return Published(cfg=cfg, store=store, work=work, record=record, input_root=planned.get("root", ""))


def record_unchanged(
    api_url: str,
    parameters: dict[str, Any],
    found: Published,
    build_profile: BuildProfile,
    started: float,
) -> dict[str, Any]:
    """The flow run of a rebuild that found ``found``, recorded through Prefect's client as the flow would
    leave it (its name, parameters, artifacts and log line, Completed); returns the run's summary. Raises
    :class:`~flows.runtime.recorded_run.RunNotRecorded` when the API does not take it."""
    from flows.runtime.recorded_run import completed_run  # Prefect's client: not imported by the head start

    name = run_names.unchanged_run_name(found.cfg.name, found.record["summary"]["dataset_id"])
    with completed_run(api_url, run_names.BUILD_FLOW, name, parameters) as run:
        summary = republished(found, build_profile, started, run.id, workers_started=0)
        for artifact in build_artifacts.unchanged_artifacts(summary, found.cfg):
            run.artifact(**artifact)
        run.log(nothing_changed_line(summary))
    return summary
