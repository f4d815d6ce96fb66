"""Done-when of the quality classifier in a build: every published document carries the model's own score for
its text in docs.parquet, ``keep_fraction`` keeps that fraction of each source (exactly: ties go by id), the
card holds the score histogram per source, the model's hash changes the dataset id, and a file that is not a
fastText model fails the build before any work, naming it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline.clean.classifier import load_classifier
from pipeline.clean.classifier_train import ClassifierTrainConfig, train_classifier
from pipeline.clean.config import ClassifierConfig
from pipeline.clean.scores import keep_count
from pipeline.dataset.card import read_card
from pipeline.dataset.manifest import load_manifest
from tests.fixtures.quality_texts import documentation_texts, license_texts, trained_model
from tests.flows.tiny_corpus import TINY_OVERRIDES

pytestmark = pytest.mark.slow


def _corpus(folder: Path) -> Path:
    """Two sources of mixed documentation and license text: 24 documents in ``manuals``, 16 in ``legal``."""
    folder.mkdir()
    docs, legal = documentation_texts(500)[300:], license_texts(400)[300:]
    rows = [("manuals", t) for t in docs[:14] + legal[:10]] + [
        ("legal", t) for t in docs[14:20] + legal[10:20]
    ]
    with open(folder / "mixed.jsonl", "w") as f:
        for name, text in rows:
            f.write(json.dumps({"text": text, "meta": {"pile_set_name": name}}) + "\n")
    return folder


def _overrides(model: Path, keep: float) -> dict[str, Any]:
    return TINY_OVERRIDES | {
        "clean.quality.enabled": False,
        "clean.boilerplate.enabled": False,
        "dedup.near.enabled": False,
        "shard.valid_fraction": 0.0,
        "clean.classifier.model": str(model),
        "clean.classifier.keep_fraction": keep,
    }


def _docs(summary: dict[str, Any]) -> tuple[Any, Any, list[dict[str, Any]]]:
    manifest, dstore = load_manifest(summary["manifest_uri"], None)
    rows = []
    for shard in manifest.shards:
        rows += pq.read_table(io.BytesIO(dstore.get_bytes(shard.docs_key))).to_pylist()
    return manifest, dstore, [r for r in rows if r["piece"] == 0]


def test_keep_fraction_build_publishes_scores_and_keeps_each_sources_share(
    prefect_harness, tmp_path: Path
) -> None:
    from flows.build.flow import build_corpus

    model = trained_model(tmp_path / "quality.bin")
    corpus, store = _corpus(tmp_path / "corpus"), tmp_path / "store"
    summary = build_corpus(inputs=[str(corpus)], output=str(store), overrides=_overrides(model, 0.5))
    manifest, dstore, rows = _docs(summary)
    card = read_card(manifest, dstore)
    hist = card["quality_score_histogram"]
    assert {k: sum(v) for k, v in hist.items()} == {"manuals": 24, "legal": 16}
    kept = {name: sum(r["source_name"] == name for r in rows) for name in hist}
    assert kept == {"manuals": keep_count(24, 0.5), "legal": keep_count(16, 0.5)}
    assert manifest.stats["classifier"]["dropped"] == {"classifier_low": 20}
    # the score published for each document is the model's own prediction for its text as published
    texts = {}
    for part in (store / "work").rglob("clean/part-*.parquet"):
        texts |= dict(zip(*pq.read_table(part, columns=["id", "text"]).to_pydict().values(), strict=True))
    scorer = load_classifier(ClassifierConfig(model=str(model), keep_fraction=0.5), None)
    assert [r["quality_score"] for r in rows] == scorer.score([texts[r["doc_id"]] for r in rows], 1000)
    assert json.loads(rows[0]["meta"])["quality_score"] == rows[0]["quality_score"]
    # another model: another dataset id (its sha256 is in the config the id hashes)
    other = tmp_path / "other.bin"
    train_classifier(documentation_texts(200), license_texts(200), other, ClassifierTrainConfig(bucket=5_000))
    again = build_corpus(inputs=[str(corpus)], output=str(store), overrides=_overrides(other, 0.5))
    assert again["dataset_id"] != summary["dataset_id"]


def test_a_file_that_is_not_a_model_fails_the_build_before_any_work(prefect_harness, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus

    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"junk\.bin is not a fastText model"):
        build_corpus(
            inputs=[str(_corpus(tmp_path / "corpus"))],
            output=str(tmp_path / "store"),
            overrides=_overrides(junk, 0.5),
        )
    assert not (tmp_path / "store").exists()
