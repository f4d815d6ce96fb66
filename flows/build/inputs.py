"""What a build reads and the work folder it gets: the resolved config (its classifier pinned), the listed inputs
packed into parts, and the build key that names ``work/<build_key>/``.

Without Prefect: the flow runs these, and so does ``pileworks build`` before it imports Prefect, to find a rebuild
whose dataset is already published (``flows/build/unchanged.py``); both must compute the same key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from pipeline import unitcache
from pipeline.corpus_config import CorpusConfig, config_from_dict, load_corpus_config
from pipeline.ingest import config as ingest_config
from pipeline.ingest import stage as ingest


def corpus_config(parameters: dict[str, Any]) -> CorpusConfig:
    """The corpus config of the build_corpus flow's ``parameters``, loaded as the flow loads it (for the
    command's work before the flow: the unchanged rebuild, the head start)."""
    return load_corpus_config(
        parameters["config_path"],
        inputs=parameters["inputs"],
        output=parameters["output"],
        name=parameters["name"],
        overrides=parameters["overrides"],
    )


def pin_model(cfg: CorpusConfig) -> CorpusConfig:
    """``cfg`` with its quality classifier's sha256 (loaded and its label checked): part of the unit keys and the
    dataset id, and what every worker checks the model it reads against."""
    if cfg.clean.classifier is None:
        return cfg
    from pipeline.clean.classifier import pin_classifier  # fastText loads only for a build that scores

    return replace(cfg, clean=replace(cfg.clean, classifier=pin_classifier(cfg.clean.classifier, cfg.s3)))


# The listing ``pileworks build`` made before the flow (looking for an unchanged rebuild), handed to the flow it
# then runs in the same process: listing an S3 corpus again (its LISTs and fingerprints) would double the first
# step of every scheduled rebuild that finds something changed. Taken once; the command forgets it when it ends.
_LISTED: dict[str, dict[str, Any]] = {}


def keep_listing(config: dict[str, Any], planned: dict[str, Any]) -> None:
    """Keep ``planned`` (:func:`list_and_plan` of ``config``) for the flow this process runs next."""
    _LISTED.clear()
    _LISTED[json.dumps(config, sort_keys=True)] = planned


def take_listing(config: dict[str, Any]) -> dict[str, Any] | None:
    """The listing kept for exactly this ``config`` (once), else None."""
    return _LISTED.pop(json.dumps(config, sort_keys=True), None)


def forget_listing() -> None:
    _LISTED.clear()


def list_and_plan(config: dict[str, Any]) -> dict[str, Any]:
    """List the raw objects with their fingerprints and pack them into parts of similar byte size:
    ``{"inputs": [...], "plans": [...]}`` (JSON, as the plan-inputs task returns it)."""
    cfg = config_from_dict(config)
    inputs: list[ingest_config.InputFile] = []
    entry_of: dict[str, int] = {}
    for entry, source in enumerate(cfg.resolved_sources()):
        for inp in ingest.list_inputs(list(source.inputs), s3=cfg.s3, extensions=cfg.ingest.extensions):
            if entry_of.setdefault(inp.uri, entry) != entry:
                raise ValueError(f"{inp.uri} is in two sources; each input belongs to one source")
            inputs.append(inp)
    inputs.sort(key=lambda i: i.uri)
    plans = ingest.plan_parts(inputs, cfg.ingest.target_part_bytes, cfg=cfg.ingest, s3=cfg.s3)
    plans = ingest.assign_sources(plans, entry_of)
    return {"inputs": [i.to_json() for i in inputs], "plans": [p.to_json() for p in plans]}


def build_key(cfg: CorpusConfig, inputs: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    """Work folder key: the config fingerprint, every input's fingerprint (size, etag/mtime) and the part plan."""
    h = hashlib.sha256(cfg.fingerprint().encode())
    for i in inputs:
        h.update(json.dumps([i["uri"], i["size"], i["etag"]]).encode())
    h.update(json.dumps(plans, sort_keys=True).encode())
    return h.hexdigest()[:16]


def ingest_keys(cfg: CorpusConfig, plans: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> list[str]:
    """A part's key: its plan plus the fingerprint (size, ETag/mtime) of every object it reads."""
    fp = {i["uri"]: [i["size"], i["etag"]] for i in inputs}
    ing = unitcache.unit_config("ingest", cfg.to_dict())
    return [
        unitcache.unit_key("ingest", p["pieces"], [fp.get(x["uri"]) for x in p["pieces"]], ing) for p in plans
    ]
