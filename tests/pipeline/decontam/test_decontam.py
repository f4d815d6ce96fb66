"""Decontamination on planted data: every document holding a 13-unit window of an evaluation text goes, every
clean one stays (including near misses of 12 units), per set; CJK by characters; cut mode; S3 and parquet."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.decontam import (
    DecontamConfig,
    EvalIndex,
    EvalSet,
    UnitHasher,
    build_eval_index,
    cut_spans,
    decontam_batch,
    index_texts,
    merge_reports,
    run_decontam_part,
    unit_keys,
    units,
    window_hashes,
)
from pipeline.records import Record, read_part, write_part
from pipeline.storage import FileStore, open_store
from pipeline.units.protocol import StageStats, read_part_stats

VOCAB = [f"w{i}" for i in range(5000)]
CJK_CHARS = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


def words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(VOCAB) for _ in range(n)]


def make_eval(rng: random.Random, n_texts: int, length: int = 40) -> list[str]:
    return [" ".join(words(rng, length)) for _ in range(n_texts)]


def planted_corpus(seed: int, evals: dict[str, list[str]]) -> tuple[list[Record], set[str], dict[str, int]]:
    """Clean docs, docs holding a 13-word window of an eval text (with case/punctuation changed), and near
    misses holding only 12 consecutive words of one: returns (records, contaminated ids, docs per set)."""
    rng = random.Random(seed)
    records, dirty, per_set = [], set(), dict.fromkeys(evals, 0)
    for i in range(300):
        body = words(rng, 200)
        kind = i % 3
        if kind:
            name = rng.choice(sorted(evals))
            source = rng.choice(evals[name]).split()
            take = 13 if kind == 1 else 12
            start = rng.randrange(len(source) - take + 1)
            window = source[start : start + take]
            window = [w.upper() if rng.random() < 0.3 else w for w in window]  # case does not hide it
            at = rng.randrange(len(body))
            body[at:at] = [", ".join(window[:3]), *window[3:]]  # neither does punctuation
            if kind == 1:
                dirty.add(f"d{i}")
                per_set[name] += 1
        records.append(Record(f"d{i}", " ".join(body), "src"))
    return records, dirty, per_set


def test_window_hashes_match_a_reference() -> None:
    h = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.uint64)
    got = window_hashes(h, 3)
    p = 1099511628211
    ref = [((int(h[i]) * p + int(h[i + 1])) * p + int(h[i + 2])) % 2**64 for i in range(6)]
    assert got.tolist() == ref
    assert len(window_hashes(h, 9)) == 0


def test_units_are_words_and_cjk_characters() -> None:
    assert units("Hello, World! naïve ＡＢＣ 中文字 かな カナ 한국어") == [
        "hello",
        "world",
        "naïve",
        "abc",
        "中",
        "文",
        "字",
        "か",
        "な",
        "カ",
        "ナ",
        "한국어",
    ]


def test_every_planted_document_is_removed_and_every_clean_one_kept() -> None:
    rng = random.Random(1)
    evals = {"quiz": make_eval(rng, 50), "exam": make_eval(rng, 50)}
    records, dirty, per_set = planted_corpus(2, evals)
    index = index_texts(evals, 13)
    matches: Counter[str] = Counter()
    out, stats = decontam_batch(records, index, DecontamConfig(eval_sets=()), UnitHasher(), matches)
    assert {r.id for r in out} == {r.id for r in records} - dirty
    assert stats.dropped["contaminated"] == len(dirty) == 100
    assert stats.extra["contaminated.quiz"] == per_set["quiz"]
    assert stats.extra["contaminated.exam"] == per_set["exam"]
    assert sum(matches.values()) >= len(dirty)
    some = next(iter(matches)).split("\t")
    assert some[0] in ("quiz", "exam") and len(some[1].split()) == 13
    assert any(some[1] in text.lower() for text in evals[some[0]])  # the report shows the matched words


def test_cjk_is_matched_by_characters() -> None:
    rng = random.Random(3)
    evals = {"zh": ["".join(rng.choice(CJK_CHARS) for _ in range(60)) for _ in range(20)]}
    index = index_texts(evals, 13)
    base = "".join(rng.choice(CJK_CHARS) for _ in range(300))
    dirty = Record("dirty", base[:100] + evals["zh"][5][10:23] + base[100:], "src")
    near = Record("near", base[:100] + evals["zh"][5][10:22] + base[100:], "src")
    out, stats = decontam_batch([dirty, near], index, DecontamConfig(), UnitHasher(), Counter())
    assert [r.id for r in out] == ["near"] and stats.extra["contaminated.zh"] == 1


def test_cut_mode_removes_only_the_overlapping_spans() -> None:
    rng = random.Random(4)
    evals = {"quiz": make_eval(rng, 5)}
    eval_words = evals["quiz"][0].split()
    before, after = words(rng, 100), words(rng, 100)
    text = " ".join([*before, *eval_words[:20], *after])
    index = index_texts(evals, 13)
    cfg = DecontamConfig(mode="cut", min_kept_chars=10)
    out, stats = decontam_batch([Record("a", text, "src")], index, cfg, UnitHasher(), Counter())
    assert out[0].text.split() == [*before, *after]
    assert stats.extra["spans_cut"] == 1 and stats.docs_out == 1
    cut, n = cut_spans("x " * 3 + "y " * 3, np.array([1]), 2)
    assert (cut, n) == ("x  y y y ", 1)


def test_stage_over_files_parquet_and_reports(tmp_path: Path) -> None:
    rng = random.Random(5)
    evals = {"quiz": make_eval(rng, 30), "exam": make_eval(rng, 30)}
    (tmp_path / "evals").mkdir()
    with open(tmp_path / "evals" / "quiz.jsonl", "w") as f:
        for text in evals["quiz"]:
            f.write(json.dumps({"question": text}) + "\n")
    pq.write_table(pa.table({"text": evals["exam"]}), tmp_path / "evals" / "exam.parquet")
    cfg = DecontamConfig(
        eval_sets=(
            EvalSet(name="quiz", inputs=(str(tmp_path / "evals" / "quiz.jsonl"),), text_field="question"),
            EvalSet(name="exam", inputs=(f"file://{tmp_path}/evals/exam.parquet",)),
        )
    )
    store = FileStore(tmp_path / "store")
    index = build_eval_index(store, "work/decontam/index.npz", cfg)
    assert index.texts == {"quiz": 30, "exam": 30} and len(index.hashes) == 60 * (40 - 12)
    records, dirty, _ = planted_corpus(6, evals)
    write_part(store, "work/in", 0, records[:150], _stats())
    write_part(store, "work/in", 1, records[150:], _stats())
    kept = []
    for i in range(2):
        stats = run_decontam_part(store, "work/in", "work/out", i, "work/decontam/index.npz", cfg)
        kept += read_part(store, "work/out", i)
        assert read_part_stats(store, "work/out", i).to_json() == stats.to_json()
    assert {r.id for r in kept} == {r.id for r in records} - dirty
    report = merge_reports(store, "work/out", 2, "work/decontam/index.npz", "work/decontam/report.json")
    assert report["eval_sets"] == {
        "quiz": {"texts": 30, "too_short": 0},
        "exam": {"texts": 30, "too_short": 0},
    }
    assert sum(m["docs"] for m in report["matched_ngrams"]) >= len(dirty)
    assert EvalIndex.from_bytes(store.get_bytes("work/decontam/index.npz")).names == ("quiz", "exam")


def test_an_eval_set_on_each_cloud_store(cloud_bucket) -> None:
    rng = random.Random(7)
    texts = make_eval(rng, 10)
    store = open_store(cloud_bucket.uri, s3=cloud_bucket.options)
    store.put_bytes("evals/quiz.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    cfg = DecontamConfig(eval_sets=(EvalSet(name="quiz", inputs=(f"{cloud_bucket.uri}/evals",)),))
    index = build_eval_index(store, "index.npz", cfg, s3=cloud_bucket.options)
    assert index.texts == {"quiz": 10}
    doc = Record("x", " ".join(words(rng, 50) + texts[3].split()[5:20]), "src")
    out, _ = decontam_batch([doc], index, cfg, UnitHasher(), Counter())
    assert out == []


def test_config_validation() -> None:
    with pytest.raises(ValueError, match=r"decontam\.mode"):
        DecontamConfig(mode="drop")
    with pytest.raises(ValueError, match=r"decontam\.ngram"):
        DecontamConfig(ngram=0)
    with pytest.raises(ValueError, match="unique"):
        DecontamConfig(eval_sets=(EvalSet(name="a", inputs=("x",)), EvalSet(name="a", inputs=("y",))))


def _stats() -> StageStats:
    return StageStats(stage="clean")


def test_ascii_fast_path_gives_the_reference_units() -> None:
    rng = random.Random(8)
    alphabet = "abcXYZ019_ .,;:!?'\"()[]{}-+*/\\\t\n@#$%^&~`|<>="
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(80)))
        assert [u.decode() for u in unit_keys(text)] == units(text), text  # type: ignore[union-attr]
    assert UnitHasher()([b"word"]).tolist() == UnitHasher()(["word"]).tolist()
