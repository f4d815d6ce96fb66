"""The data card of a real build: its waterfall is the stages' stats, its examples trace back to the records, it
is listed in the manifest with a sha256 that verifies, a rebuild gives the same bytes, the flow run holds the
``data-card`` artifact, and ``pileworks inspect card --against`` shows what a config change moved."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pipeline.dataset.card import read_card
from pipeline.dataset.manifest import load_manifest
from pipeline.records import iter_part_batches, read_quarantine
from pipeline.storage import open_store, sha256_bytes
from pipeline.units.protocol import StageStats
from tests.fixtures.prefect_artifacts import artifacts_with_keys
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = pytest.mark.slow

BAD = [
    "this line is not JSON",  # ingest quarantine: malformed_json
    json.dumps({"text": "   "}),  # ingest quarantine: empty_doc
    json.dumps({"text": "Too short to keep."}),  # clean: too_short_chars
]


def _build(raw: Path, out: Path, **extra: object) -> dict:
    from flows.build.flow import build_corpus

    return build_corpus(inputs=[str(raw)], output=str(out), overrides=TINY_OVERRIDES | extra)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from flows.cli.inspect import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["inspect", "card", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def _check_waterfall(card: dict, stats: dict[str, dict]) -> None:
    for stage, data in stats.items():
        st = StageStats.from_json(data)
        rows = [r for r in card["waterfall"] if r["stage"] == stage and r["rule"] != "trimmed_text"]
        assert {r["rule"]: r["docs_removed"] for r in rows} == {k: v for k, v in st.dropped.items() if v}
        if rows:
            assert rows[0]["docs_in"] == st.docs_in
            removed = {o: 0 for o in st.dropped}
            for (outcome, _, _), (_, nbytes, _) in st.tally.items():
                if outcome:
                    removed[outcome] += nbytes
            assert {r["rule"]: r["bytes_removed"] for r in rows} == {
                k: removed[k] for k in removed if st.dropped[k]
            }
    for source, rows in card["by_source"].items():  # per source, the removals add up to the stage's
        assert all(r["docs_removed"] <= r["docs_in"] for r in rows), source


def _check_examples(card: dict, store_uri: str, build_key: str) -> None:
    store = open_store(store_uri, None)
    ingest = f"work/{build_key}/ingest"
    records = {
        r.id: r
        for i in range(64)
        if store.exists(f"{ingest}/part-{i:05d}.done")
        for b in iter_part_batches(store, ingest, i)
        for r in b
    }
    quarantined = {f"{q.source}#{q.location}": q for q in read_quarantine(store, ingest)}
    assert card["examples"]
    for rule, examples in card["examples"].items():
        assert 1 <= len(examples) <= 3 and [e["id"] for e in examples] == sorted(e["id"] for e in examples)
        for e in examples:
            if rule.startswith("ingest:"):
                assert quarantined[e["id"]].reason == rule.split(":", 1)[1]
            else:  # the record it was: the same id, source, and the text it starts with
                rec = records[e["id"]]
                assert rec.source == e["source"] and " ".join(rec.text.split()).startswith(e["text"][:40])


def test_data_card_of_a_build_and_against_another(prefect_harness, tmp_path: Path, capsys) -> None:
    from prefect import get_client

    write_tiny_corpus(tmp_path / "raw", files=3)
    (tmp_path / "raw" / "bad.jsonl").write_text("\n".join(BAD) + "\n")
    first = _build(tmp_path / "raw", tmp_path / "a")
    manifest, dstore = load_manifest(first["manifest_uri"], None)

    # listed in the manifest, published beside it, its sha256 verifies
    assert manifest.card["key"] == "card.json"
    data = dstore.get_bytes("card.json")
    assert sha256_bytes(data) == manifest.card["sha256"] and len(data) == manifest.card["bytes"]
    card = read_card(manifest, dstore)
    assert (
        card["dataset_id"] == manifest.dataset_id
        and card["docs_out"] == manifest.stats["tokenize"]["docs_out"]
    )
    _check_waterfall(card, manifest.stats)
    rules = {f"{r['stage']}:{r['rule']}" for r in card["waterfall"]}
    assert {
        "ingest:malformed_json",
        "ingest:empty_doc",
        "clean:too_short_chars",
        "exact_dedup:exact_duplicate",
        "near_dedup:near_duplicate",
    } <= rules
    _check_examples(card, str(tmp_path / "a"), manifest.lineage["build_key"])
    assert card["mixture"]["train"] and all(r["tokens_removed_est"] is not None for r in card["waterfall"])

    # the same inputs and config in another store: the same card, byte for byte
    again = _build(tmp_path / "raw", tmp_path / "b")
    assert again["dataset_id"] == first["dataset_id"]
    assert load_manifest(again["manifest_uri"], None)[1].get_bytes("card.json") == data

    # the flow run holds the data-card artifact, with its charts
    with get_client(sync_client=True) as client:
        found = artifacts_with_keys(client, "data-card")
    assert (
        found
        and "## Removal waterfall" in str(found[-1].data)
        and "data:image/svg+xml" in str(found[-1].data)
    )

    # pileworks inspect card: markdown, JSON, and what another config moved
    text = _cli(capsys, first["manifest_uri"])
    assert "## Removal waterfall" in text and "clean | too_short_chars" in text
    assert json.loads(_cli(capsys, first["manifest_uri"], "--json")) == card
    stricter = _build(tmp_path / "raw", tmp_path / "a", **{"clean.quality.min_words": 90})
    diff = json.loads(_cli(capsys, stricter["manifest_uri"], "--against", first["manifest_uri"], "--json"))
    moved = {r["rule"]: r for r in diff["rules"]}
    assert moved["clean:too_few_words"]["docs_delta"] > 0
    assert diff["by_source"] and diff["totals"]["docs_out"][1] < diff["totals"]["docs_out"][0]
    text = _cli(capsys, stricter["manifest_uri"], "--against", first["manifest_uri"])
    assert "clean:too_few_words" in text and "## Source `default`" in text
