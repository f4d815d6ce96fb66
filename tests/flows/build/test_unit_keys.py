"""A unit's cache key names exactly the config fields its step reads: change any other field and the unit is
reused (changing the near-dedup threshold must not recompute a single MinHash signature)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pipeline.corpus_config import load_corpus_config
from pipeline.unitcache import unit_config
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
