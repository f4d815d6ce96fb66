"""The fastText quality classifier: trained on two real-text sets it separates held-out text; clean scores every
kept document with exactly the model's prediction, drops under ``min_score``, and ``keep_fraction`` keeps that
fraction of each source; bad models, labels and training sets end in one line naming them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.clean.classifier import flatten, load_classifier, pin_classifier
from pipeline.clean.classifier_train import ClassifierTrainConfig, roc_auc, sample_texts, train_classifier
from pipeline.clean.config import ClassifierConfig, CleanConfig, QualityConfig
from pipeline.clean.scores import (
    DROP_REASON,
    histograms,
    keep_count,
    kept_by_cut,
    run_classifier_filter_part,
    source_cuts,
    write_cuts,
)
from pipeline.clean.stage import clean_batch
from pipeline.corpus_config import load_corpus_config
from pipeline.records import Record, quality_score, read_part, write_part
from pipeline.storage import open_store
from pipeline.units import cache as unitcache
from pipeline.units.protocol import StageStats
from tests.fixtures.quality_texts import documentation_texts, license_texts, trained_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_model(tmp_path_factory.mktemp("model") / "quality.bin")


def _cfg(model: Path | str, **kw: object) -> ClassifierConfig:
    return ClassifierConfig(model=str(model), **kw)  # type: ignore[arg-type]


def test_a_classifier_of_two_real_text_sets_separates_held_out_text(tmp_path: Path) -> None:
    out = tmp_path / "m" / "quality.bin"
    metrics = train_classifier(
        documentation_texts(300), license_texts(300), out, ClassifierTrainConfig(bucket=20_000)
    )
    assert metrics["auc"] > 0.9 and metrics["heldout_positive"] > 10 and metrics["heldout_negative"] > 10
    assert metrics["precision"] > 0.8 and metrics["recall"] > 0.8
    assert json.loads(Path(f"{out}.metrics.json").read_text()) == metrics
    assert metrics["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def test_roc_auc_counts_ties_half() -> None:
    assert roc_auc([0.1, 0.9], [False, True]) == 1.0
    assert roc_auc([0.5, 0.5], [False, True]) == 0.5
    assert roc_auc([0.9, 0.1, 0.5], [False, True, True]) == 0.0
    assert roc_auc([0.3], [True]) is None


def test_negative_sample_is_deterministic_and_order_free() -> None:
    texts = [f"text number {i}" for i in range(50)]
    assert sample_texts(texts, 7, 0) == sample_texts(texts[::-1], 7, 0)
    assert sample_texts(texts, 7, 0) != sample_texts(texts, 7, 1)


def test_one_class_or_empty_training_set_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="negative examples hold no text"):
        train_classifier(["some text here"], ["  \n "], tmp_path / "m.bin", ClassifierTrainConfig())
    with pytest.raises(ValueError, match="positive examples hold no text"):
        train_classifier([], ["some text"], tmp_path / "m.bin", ClassifierTrainConfig())


def test_bad_model_file_and_label_name_themselves(tmp_path: Path, model_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match=r"junk\.bin is not a fastText model"):
        load_classifier(_cfg(junk, min_score=0.5), None)
    with pytest.raises(ValueError, match=r"no label '__label__good' \(its labels: __label__"):
        load_classifier(_cfg(model_path, label="good", min_score=0.5), None)
    with pytest.raises(ValueError, match=r"clean.classifier.model: .*missing\.bin is not a file"):
        load_classifier(_cfg(tmp_path / "missing.bin", min_score=0.5), None)


def test_a_model_changed_since_it_was_pinned_is_refused(tmp_path: Path, model_path: Path) -> None:
    copy = tmp_path / "m.bin"
    copy.write_bytes(model_path.read_bytes())
    pinned = pin_classifier(_cfg(copy, min_score=0.5), None)
    assert pinned.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    copy.write_bytes(copy.read_bytes() + b"\0")
    with pytest.raises(ValueError, match=r"m\.bin changed"):
        load_classifier(pinned, None)


def test_a_model_on_each_cloud_store_is_pinned_and_scores_as_the_local_file(
    cloud_bucket, model_path: Path
) -> None:
    open_store(cloud_bucket.uri, cloud_bucket.options).put_bytes(
        "models/quality.bin", model_path.read_bytes()
    )
    uri = f"{cloud_bucket.uri}/models/quality.bin"
    pinned = pin_classifier(_cfg(uri, min_score=0.5), cloud_bucket.options)  # what a build does first
    assert pinned.sha256 == hashlib.sha256(model_path.read_bytes()).hexdigest()
    texts = documentation_texts(3) + license_texts(3)
    local = load_classifier(_cfg(model_path, min_score=0.5), None).score(texts)
    assert load_classifier(pinned, cloud_bucket.options).score(texts) == local


@pytest.mark.parametrize(
    "kw",
    [{}, {"min_score": 0.5, "keep_fraction": 0.5}, {"min_score": 1.5}, {"keep_fraction": 0.0}],
)
def test_config_needs_exactly_one_valid_rule(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"clean\.classifier"):
        ClassifierConfig(model="m.bin", **kw)  # type: ignore[arg-type]


def _records(texts: list[str], source: str = "docs") -> list[Record]:
    meta = json.dumps({"source_name": source})
    return [Record(f"{source}#{i}", t, "x.jsonl", meta) for i, t in enumerate(texts)]


def _clean_cfg(classifier: ClassifierConfig) -> CleanConfig:
    return CleanConfig(quality=QualityConfig(enabled=False, min_stop_words=None), classifier=classifier)


def test_clean_scores_kept_documents_with_the_models_own_prediction(model_path: Path) -> None:
    texts = documentation_texts(20) + license_texts(20)
    texts[0] = texts[0].replace(" ", "\n", 5)  # newlines are flattened the same way in scoring
    cfg = _clean_cfg(_cfg(model_path, min_score=0.5))
    kept, stats = clean_batch(_records(texts), cfg)
    model = load_classifier(cfg.classifier, None)  # type: ignore[arg-type]
    for rec in kept:  # the binding's own prediction for the published text, flattened to one line
        pairs = model.model.f.predict(flatten(rec.text[:1000]) + "\n", -1, 0.0, "strict")
        assert quality_score(rec.meta) == min(1.0, {name: p for p, name in pairs}["__label__hq"])
        assert quality_score(rec.meta) >= 0.5  # type: ignore[operator]
    assert stats.dropped[DROP_REASON] == len(texts) - len(kept) >= 15
    assert len(kept) >= 15
    assert sum(histograms(stats.extra)["docs"]) == len(texts)  # every scored document, kept or not


def test_keep_count_and_cut_keep_the_fraction_exactly_with_ties() -> None:
    scored = {"a": [(0.5, f"a{i}") for i in range(10)], "b": [(i / 7, f"b{i}") for i in range(7)]}
    cuts = source_cuts(scored, 0.3)
    for source, pairs in scored.items():
        kept = [p for p in pairs if kept_by_cut(p[0], p[1], cuts[source])]
        assert len(kept) == keep_count(len(pairs), 0.3)
    assert keep_count(1, 0.01) == 1 and keep_count(0, 0.5) == 0 and keep_count(10, 1.0) == 10


def test_keep_fraction_keeps_that_fraction_of_each_source(tmp_path: Path, model_path: Path) -> None:
    store = open_store(str(tmp_path / "store"), None)
    cfg = _clean_cfg(_cfg(model_path, keep_fraction=0.4))
    parts = [
        _records(documentation_texts(30)[:15] + license_texts(15), "web"),
        _records(documentation_texts(45)[15:] + license_texts(25)[15:], "books"),
    ]
    for index, recs in enumerate(parts):
        kept, stats = clean_batch(recs, cfg)
        assert len(kept) == len(recs)  # keep_fraction drops in its own step, after every part is scored
        write_part(store, "scored", index, kept, stats)
    cuts_key = write_cuts(store, "scored", 2, 0.4, "cuts.json")
    out = [run_classifier_filter_part(store, "scored", "clean", i, cuts_key) for i in range(2)]
    total = StageStats(stage="classifier")
    for s in out:
        total.merge(s)
    by_source: dict[str, int] = {}
    for i in range(2):
        for rec in read_part(store, "clean", i):
            name = json.loads(rec.meta)["source_name"]
            by_source[name] = by_source.get(name, 0) + 1
    assert by_source == {"web": keep_count(30, 0.4), "books": keep_count(40, 0.4)}
    assert total.dropped[DROP_REASON] == 70 - sum(by_source.values())
    kept_scores = [quality_score(r.meta) for i in range(2) for r in read_part(store, "clean", i)]
    dropped = 70 - len(kept_scores)
    assert dropped and min(kept_scores) >= 0.0  # type: ignore[type-var]


def test_the_classifier_stays_out_of_keys_and_ids_unless_set(tmp_path: Path, model_path: Path) -> None:
    plain = load_corpus_config()
    assert "classifier" not in plain.to_dict()["clean"]
    assert "classifier" not in unitcache.unit_config("clean", plain.to_dict())
    one = load_corpus_config(
        overrides={"clean.classifier.model": str(model_path), "clean.classifier.min_score": 0.5}
    )
    a = pin_classifier(one.clean.classifier, None)  # type: ignore[arg-type]
    other = tmp_path / "other.bin"
    train_classifier(
        documentation_texts(50), license_texts(50), other, ClassifierTrainConfig(epoch=2, bucket=5_000)
    )
    b = pin_classifier(ClassifierConfig(model=str(model_path), min_score=0.5, sha256=None), None)
    c = pin_classifier(ClassifierConfig(model=str(other), min_score=0.5), None)
    assert a == b and a.sha256 != c.sha256

    def key(classifier: ClassifierConfig) -> str:
        data = one.to_dict()
        data["clean"]["classifier"]["sha256"] = classifier.sha256
        return unitcache.unit_key("clean", unitcache.unit_config("clean", data))

    assert key(a) != key(c)  # a new model redoes clean (and changes the config, so the dataset id)
    half = load_corpus_config(
        overrides={"clean.classifier.model": str(model_path), "clean.classifier.keep_fraction": 0.5}
    ).to_dict()
    third = json.loads(json.dumps(half))
    third["clean"]["classifier"]["keep_fraction"] = 0.3
    assert unitcache.unit_config("clean", half) == unitcache.unit_config("clean", third)  # scores shared
    assert unitcache.unit_config("classifier-filter", half) != unitcache.unit_config(
        "classifier-filter", third
    )
