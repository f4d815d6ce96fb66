"""A build normalises each document once, at ingest: the boilerplate count and the clean stage read the part as it
is and give exactly what they give when they normalise raw text themselves; the repairs are counted by ingest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.clean import stage as clean_stage
from pipeline.clean.boilerplate import run_boilerplate_count_part
from pipeline.clean.config import BoilerplateConfig, CleanConfig
from pipeline.clean.normalize import line_hash, normalize_text, normalizer
from pipeline.clean.stage import input_normalized, run_clean_part
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.stage import list_inputs, plan_parts, run_ingest_part
from pipeline.records import read_part
from pipeline.storage import open_store
from pipeline.units.hashranges import read_table
from pipeline.units.protocol import get_npy
from tests.pipeline.clean.test_clean import prose

FOOTER = "Copyright 2026 The Example Project. All rights reserved worldwide."
RAW = [
    prose(1) + "\r\n\r\n\r\n\r\n" + FOOTER + "   ",  # CRLF, a run of blank lines, trailing spaces
    "Sch\u00c3\u00b6n " + prose(2) + "\n" + FOOTER,  # mojibake (Schön as Latin-1 read UTF-8)
    "e\u0301t\u00e9 \x00" + prose(3) + "\u00a0\n" + FOOTER,  # NFD accent, NUL, a no-break space
    "\n\n" + prose(4) + "\u200b\n\n" + FOOTER + "\n",  # leading blank lines, a zero-width space
    prose(5),
    "   \n\x00\n",  # nothing left after normalising
]
CFG = CleanConfig(boilerplate=BoilerplateConfig(min_docs=2, min_fraction=0.0))


@pytest.fixture
def ingested(tmp_path: Path):
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "docs.jsonl", "w", encoding="utf-8") as f:
        for text in RAW:
            f.write(json.dumps({"text": text}) + "\n")
    store = open_store(str(tmp_path / "store"), None)
    plan = plan_parts(list_inputs([str(tmp_path / "in")], None), 1 << 20, s3=None)[0]
    raw = run_ingest_part(store, "raw", plan, IngestConfig(), None)
    once = run_ingest_part(store, "once", plan, IngestConfig(), None, normalize=normalizer(CFG))
    return store, raw, once


def test_ingest_writes_normalised_text_and_counts_the_repairs(ingested) -> None:
    store, raw, once = ingested
    counts: Counter[str] = Counter()
    expected = [normalize_text(t, CFG, counts) for t in RAW]
    assert [r.text for r in read_part(store, "once", 0)] == expected
    assert [r.text for r in read_part(store, "raw", 0)] == RAW
    assert once.extra["normalized_parts"] == 1 and "normalized_parts" not in raw.extra
    assert once.extra["mojibake_fixed"] == counts["mojibake_fixed"] == 1
    assert once.extra["nul_removed"] == counts["nul_removed"] == 2
    assert once.extra["normalize_chars_removed"] == sum(map(len, RAW)) - sum(map(len, expected))
    assert once.bytes_out == sum(len(t.encode("utf-8")) for t in expected)
    assert (input_normalized(store, "once", 0), input_normalized(store, "raw", 0)) == (True, False)


def test_count_and_clean_on_normalised_parts_equal_normalising_themselves(
    ingested, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, _ = ingested
    raw_bp = run_boilerplate_count_part(store, "raw", "bp-raw", 0, CFG)
    raw_stats = run_clean_part(store, "raw", "clean-raw", 0, CFG)

    calls = []
    monkeypatch.setattr(clean_stage, "normalize_text", lambda *a: calls.append(a) or a[0])
    monkeypatch.setattr("pipeline.clean.boilerplate.normalize_text", lambda *a: calls.append(a) or a[0])
    once_bp = run_boilerplate_count_part(store, "once", "bp-once", 0, CFG)
    once_stats = run_clean_part(store, "once", "clean-once", 0, CFG)
    assert calls == []  # neither step normalised again

    assert np.array_equal(get_npy(store, "bp-raw/part-00000.npy"), get_npy(store, "bp-once/part-00000.npy"))
    assert (raw_bp.docs_in, raw_bp.extra) == (once_bp.docs_in, once_bp.extra)
    counts = read_table(store, "bp-once/part-00000.npy", lambda old: old.T)  # rows (line hash, documents)
    footer_docs = dict(counts.tolist())[line_hash(FOOTER)]
    assert footer_docs == 4
    assert [(r.id, r.text, r.meta) for r in read_part(store, "clean-once", 0)] == [
        (r.id, r.text, r.meta) for r in read_part(store, "clean-raw", 0)
    ]
    assert once_stats.docs_out == raw_stats.docs_out == 5
    assert once_stats.dropped == raw_stats.dropped == Counter({"empty_after_clean": 1})
    assert "mojibake_fixed" not in once_stats.extra and raw_stats.extra["mojibake_fixed"] == 1


def test_count_from_the_texts_ingest_kept_equals_reading_the_part(ingested) -> None:
    """A build's ingest task hands the texts it just wrote to the line count, which then reads nothing."""
    store, _, _ = ingested
    texts = [r.text for r in read_part(store, "once", 0)]
    from_store = run_boilerplate_count_part(store, "once", "bp-store", 0, CFG)
    in_memory = run_boilerplate_count_part(store, "no/such/folder", "bp-memory", 0, CFG, texts=texts)
    assert np.array_equal(
        get_npy(store, "bp-store/part-00000.npy"), get_npy(store, "bp-memory/part-00000.npy")
    )
    assert (in_memory.docs_in, in_memory.extra) == (from_store.docs_in, from_store.extra)
