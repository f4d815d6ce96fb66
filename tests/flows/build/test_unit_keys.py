"""A unit's cache key names exactly the config fields its step reads: change any other field and the unit is
reused (changing the near-dedup threshold must not recompute a single MinHash signature)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pipeline.corpus_config import load_corpus_config
from pipeline.units.cache import unit_config
from tests.flows.tiny_corpus import TINY_OVERRIDES

# stage -> (a field the step does not read, a field it does), as dotted config paths with a new value
CASES: dict[str, tuple[tuple[str, Any], tuple[str, Any]]] = {
    "ingest": (("clean.quality.enabled", False), ("clean.normalization", "NFKC")),
    "boilerplate": (("clean.boilerplate.min_docs", 99), ("clean.boilerplate.min_line_chars", 7)),
    "clean": (("clean.normalization", "NFKC"), ("clean.quality.enabled", False)),
    "signatures": (("dedup.near.threshold", 0.5), ("dedup.near.num_perm", 64)),
    "tokenize": (("shard.target_bytes", 1 << 22), ("tokenize.eos_token", "<|pad|>")),
    "decontam": (("dedup.near.threshold", 0.5), ("decontam.ngram", 8)),
    "exact-hash": (("clean.normalization", "NFKC"), None),
    "near-filter": (("dedup.near.threshold", 0.5), None),
    "split-count": (("shard.target_bytes", 1 << 22), ("shard.valid_fraction", 0.2)),
}
READS_THE_SPLIT_RULE = {"split-count"}  # which documents are valid: counted per part for the shard plan
IGNORED_EVERYWHERE = [
    ("shard.valid_fraction", 0.2),
    ("tokenize.vocab_size", 4096),
    ("dedup.near.verify", False),
]


def _with(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    assert leaf in node, f"{dotted} is not a config field"
    assert node[leaf] != value, f"{dotted} already is {value!r}"
    node[leaf] = value
    return out


@pytest.mark.parametrize("stage", sorted(CASES))
def test_a_unit_key_changes_only_with_a_field_its_step_reads(stage: str) -> None:
    base = load_corpus_config().to_dict()
    unread, read = CASES[stage]
    assert unit_config(stage, _with(base, *unread)) == unit_config(stage, base)
    for dotted, value in IGNORED_EVERYWHERE:
        if stage in READS_THE_SPLIT_RULE and dotted == "shard.valid_fraction":
            continue
        assert unit_config(stage, _with(base, dotted, value)) == unit_config(stage, base), dotted
    if read is not None:
        assert unit_config(stage, _with(base, *read)) != unit_config(stage, base)


@pytest.mark.parametrize("stage", ["ingest", "clean"])
def test_named_sources_are_in_the_ingest_and_clean_keys(stage: str) -> None:
    """A source's overrides change what ingest and clean make of its documents, so its units are redone."""
    base = load_corpus_config().to_dict()
    named = _with(base, "sources", [{"name": "books", "inputs": ["/data/books"]}])
    assert unit_config(stage, named) != unit_config(stage, base)
    assert unit_config("signatures", named) == unit_config("signatures", base)


@pytest.mark.parametrize(
    ("dotted", "value"),
    [("clean.c4.enabled", True), ("clean.pii.enabled", True), ("clean.quality.min_stop_words", 3)],
)
def test_clean_rules_are_in_the_clean_key_and_not_in_ingests(dotted: str, value: Any) -> None:
    """C4, PII and the quality rules run in clean: changing one redoes clean's units and reuses ingest's."""
    base = load_corpus_config().to_dict()
    changed = _with(base, dotted, value)
    assert unit_config("clean", changed) != unit_config("clean", base)
    assert unit_config("ingest", changed) == unit_config("ingest", base)


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="no unit config"):
        unit_config("frobnicate", load_corpus_config().to_dict())


@pytest.mark.slow
@pytest.mark.timeout(900)  # two builds on a loaded 2-core machine
def test_a_new_threshold_reuses_every_signature(prefect_harness, tiny_corpus: Path, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus

    def build(**extra: Any) -> dict[str, Any]:
        return build_corpus(
            inputs=[str(tiny_corpus)], output=str(tmp_path / "store"), overrides=TINY_OVERRIDES | extra
        )

    cold = build()
    warm = build(**{"dedup.near.threshold": 0.6, "clean.boilerplate.min_docs": 4})
    parts = cold["reused_units"]["signatures"][1]
    assert warm["reused_units"]["ingest"] == [parts, parts]
    assert warm["reused_units"]["boilerplate"] == [parts, parts]  # the count does not read min_docs
    assert warm["reused_units"]["signatures"] == [parts, parts]  # nor do signatures read the threshold


# ---------------------------------------------------------------- keys and ids by content, not location (issue 43)


def _listed(folder: Path, sources: bool = False) -> tuple[Any, dict[str, Any]]:
    from flows.build.inputs import list_and_plan

    overrides = dict(TINY_OVERRIDES, output=str(folder.parent / "store"))
    if sources:
        overrides["sources"] = [{"name": "web", "inputs": [f"{folder}/*.jsonl"]}]
        cfg = load_corpus_config(None, overrides=overrides)
    else:
        cfg = load_corpus_config(None, inputs=[str(folder)], overrides=overrides)
    return cfg, list_and_plan(cfg.to_dict())


@pytest.mark.parametrize("sources", [False, True], ids=["input", "named-source"])
def test_the_same_files_elsewhere_have_the_same_keys_and_id_config(tmp_path: Path, sources: bool) -> None:
    from flows.build.inputs import build_key, ingest_keys, located_config
    from tests.flows.tiny_corpus import write_tiny_corpus

    here, there = tmp_path / "a" / "raw", tmp_path / "b" / "other" / "place"
    write_tiny_corpus(here, files=3)
    write_tiny_corpus(there, files=3)
    (cfg_a, a), (cfg_b, b) = _listed(here, sources), _listed(there, sources)
    assert a["root"] == f"file://{here}" and b["root"] == f"file://{there}"
    assert [i["name"] for i in a["inputs"]] == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    assert [i["digest"] for i in a["inputs"]] == [i["digest"] for i in b["inputs"]]
    assert build_key(cfg_a, a) == build_key(cfg_b, b)
    assert ingest_keys(cfg_a, a["plans"], a["inputs"]) == ingest_keys(cfg_b, b["plans"], b["inputs"])
    assert located_config(cfg_a, a["root"]) == located_config(cfg_b, b["root"])
    inputs = (
        located_config(cfg_a, a["root"])["sources"][0]["inputs"] if sources else cfg_a.to_dict()["inputs"]
    )
    assert str(tmp_path) not in str(located_config(cfg_a, a["root"]))  # no location in what the id hashes
    assert inputs  # the config still says what was read


def test_a_touched_file_keeps_its_keys_and_an_edited_one_changes_only_its_parts(tmp_path: Path) -> None:
    import os

    from flows.build.inputs import build_key, ingest_keys
    from pipeline.ingest.digests import cache_key
    from tests.flows.tiny_corpus import write_tiny_corpus

    raw = tmp_path / "raw"
    write_tiny_corpus(raw, files=3)
    cfg, first = _listed(raw)
    keys = ingest_keys(cfg, first["plans"], first["inputs"])
    assert (tmp_path / "store" / cache_key(first["root"])).is_file()  # the digests, kept for the next listing
    for path in raw.iterdir():
        os.utime(path, (path.stat().st_atime + 60, path.stat().st_mtime + 60))
    _, touched = _listed(raw)
    assert [i["etag"] for i in touched["inputs"]] != [i["etag"] for i in first["inputs"]]
    assert build_key(cfg, touched) == build_key(cfg, first)
    edited = raw / "part-1.jsonl"
    edited.write_text(edited.read_text().replace("The ", "the ", 1))  # same size, other bytes
    _, after = _listed(raw)
    changed = [
        i
        for i, (x, y) in enumerate(zip(keys, ingest_keys(cfg, after["plans"], after["inputs"]), strict=True))
        if x != y
    ]
    reads_it = [i for i, p in enumerate(after["plans"]) if any(x["name"] == edited.name for x in p["pieces"])]
    assert changed == reads_it and 0 < len(changed) < len(keys)


def test_the_golden_id_config_of_the_default_build_is_pinned(tmp_path: Path) -> None:
    """The config the dataset id hashes for ``--input <folder>`` with the embedded defaults, wherever the folder
    is: pinned, so a change to what the id hashes is a decision (the CHANGELOG says which ids change)."""
    import hashlib
    import json

    from flows.build.inputs import located_config
    from pipeline.dataset.manifest import _strip_volatile

    for folder in (tmp_path / "x", tmp_path / "y" / "z"):
        folder.mkdir(parents=True)
        cfg = load_corpus_config(None, inputs=[str(folder)], overrides={"name": "golden"})
        config = located_config(cfg, f"file://{folder}")
        assert config["inputs"] == ["."] and config["output"] is None
        hashed = _strip_volatile(config)  # what the id hashes: not where or how the build ran
        digest = hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:16]
        assert digest == GOLDEN_CONFIG_DIGEST, digest


# issue 43: inputs relative to their root (issue 46's tokenize.trainer says how, not what: not hashed)
GOLDEN_CONFIG_DIGEST = "043e427961bbfa3f"
