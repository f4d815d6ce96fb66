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

from pipeline import __version__
from pipeline.corpus_config import CorpusConfig, config_from_dict, load_corpus_config
from pipeline.ingest import config as ingest_config
from pipeline.ingest import digests
from pipeline.ingest import stage as ingest
from pipeline.storage import open_store
from pipeline.units import cache as unitcache


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
    """List the raw objects with their fingerprints and content digests, name them under the build's input root
    and pack them into parts of similar byte size: ``{"root", "inputs": [...], "plans": [...]}`` (JSON, as the
    plan-inputs task returns it). The digests come from the build store's digest cache where an object's size
    and tag match (``pipeline/ingest/digests.py``)."""
    cfg = config_from_dict(config)
    inputs: list[ingest_config.InputFile] = []
    entry_of: dict[str, int] = {}
    roots: list[str] = []
    for entry, source in enumerate(cfg.resolved_sources()):
        roots += [ingest.input_root(spec, cfg.s3) for spec in source.inputs]
        for inp in ingest.list_inputs(list(source.inputs), s3=cfg.s3, extensions=cfg.ingest.extensions):
            if entry_of.setdefault(inp.uri, entry) != entry:
                raise ValueError(f"{inp.uri} is in two sources; each input belongs to one source")
            inputs.append(inp)
    inputs.sort(key=lambda i: i.uri)
    root = ingest.common_root(roots)
    inputs = ingest.named_inputs(inputs, root)
    inputs = digests.with_digests(inputs, open_store(cfg.output, cfg.s3), root, cfg.s3)
    plans = ingest.plan_parts(inputs, cfg.ingest.target_part_bytes, cfg=cfg.ingest, s3=cfg.s3)
    plans = ingest.assign_sources(plans, entry_of)
    return {"root": root, "inputs": [i.to_json() for i in inputs], "plans": [p.to_json() for p in plans]}


def located_config(cfg: CorpusConfig, root: str) -> dict[str, Any]:
    """The config as the dataset id and the build key see it: every input source written relative to the input
    ``root`` (``.``, ``**/*.jsonl``), the store left out. The same config over the same files in another folder,
    machine or bucket reads the same."""
    data = cfg.to_dict() | {"output": None, "s3": None}
    data["inputs"] = [ingest.relative_source(s, root) for s in data.get("inputs", [])]
    for source in data.get("sources", []):
        source["inputs"] = [ingest.relative_source(s, root) for s in source.get("inputs", [])]
    return data


def build_key(cfg: CorpusConfig, planned: dict[str, Any]) -> str:
    """Work folder key: the config (its inputs relative to the input root), the code version, every input's name,
    size and content digest, and the part plan (without URIs). A corpus moved or copied elsewhere, or touched
    without a change, has the same key (its published dataset is found at once: ``flows/build/unchanged.py``)."""
    config = located_config(cfg, planned.get("root", ""))
    h = hashlib.sha256(json.dumps([config, __version__], sort_keys=True, default=str).encode())
    for i in planned["inputs"]:
        h.update(json.dumps([i.get("name") or i["uri"], i["size"], i.get("digest") or i["etag"]]).encode())
    h.update(json.dumps([_located_plan(p) for p in planned["plans"]], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _located_plan(plan: dict[str, Any]) -> dict[str, Any]:
    return plan | {"pieces": [ingest_config.Piece(**p).located_json() for p in plan["pieces"]]}


def ingest_keys(cfg: CorpusConfig, plans: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> list[str]:
    """A part's key: its plan (names, not URIs) plus the content digest of every object it reads (its size and
    ETag/mtime for an input listed without one)."""
    fp = {i["uri"]: [i["size"], i.get("digest") or i["etag"]] for i in inputs}
    ing = unitcache.unit_config("ingest", cfg.to_dict())
    return [
        unitcache.unit_key("ingest", _located_plan(p)["pieces"], [fp.get(x["uri"]) for x in p["pieces"]], ing)
        for p in plans
    ]
