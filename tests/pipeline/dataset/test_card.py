"""The data card from stage stats: the tally and its examples merge deterministically, the waterfall follows the
stages' rules in order, removed tokens are estimated per source and language, two cards diff per rule and source."""

from __future__ import annotations

import itertools
import json

from pipeline.dataset.card import build_card, card_bytes, ordered_rules
from pipeline.dataset.card_markdown import diff_cards, render_card, render_diff
from pipeline.records import Record
from pipeline.sources import tally_document
from pipeline.units.protocol import KEPT, StageStats


def _rec(i: int, source: str = "web", lang: str = "") -> Record:
    meta = {"source_name": source} | ({"language": lang} if lang else {})
    return Record(
        f"file:///in/{source}.jsonl#B{i:04d}",
        f"text  of\n document {i}",
        f"file:///in/{source}.jsonl",
        json.dumps(meta),
    )


def _dropped(reason: str, ids: list[int]) -> StageStats:
    st = StageStats(stage="clean")
    for i in ids:
        rec = _rec(i)
        st.drop(reason)
        tally_document(st, reason, rec.id, rec.text, rec.source, rec.meta, 10)
    return st


def test_examples_are_the_first_three_by_id_whatever_the_merge_order() -> None:
    parts = [_dropped("too_few_words", ids) for ids in ([9, 4], [7], [1, 8, 3])]
    seen = set()
    for order in itertools.permutations(parts):
        total = StageStats(stage="clean")
        for part in order:
            total.merge(StageStats.from_json(part.to_json()))
        seen.add(json.dumps(total.to_json(), sort_keys=True))
        assert [e["id"][-5:] for e in total.examples["too_few_words"]] == ["B0001", "B0003", "B0004"]
        assert (
            total.examples["too_few_words"][0]["text"] == "text of document 1"
        )  # one line, spaces collapsed
        assert total.tally == {("too_few_words", "web", "und"): [6, 60, 0]}
    assert len(seen) == 1


def test_stats_written_before_the_tally_still_read_and_write_as_they_were() -> None:
    old = {
        "stage": "clean",
        "docs_in": 3,
        "docs_out": 2,
        "bytes_in": 30,
        "bytes_out": 20,
        "dropped": {"too_short_chars": 1},
        "extra": {"chars_removed": 0},
    }
    st = StageStats.from_json(old)
    assert st.tally == {} and st.examples == {} and st.to_json() == old
    card = build_card("x", "0" * 20, {"clean": old}, {})
    assert card["per_group_note"] and card["waterfall"][0]["docs_removed"] == 1
    assert card["waterfall"][0]["bytes_removed"] is None  # not recorded: shown as unknown, never as 0


def _clean_stats() -> dict[str, dict]:
    clean = StageStats(stage="clean", docs_in=5, docs_out=3, bytes_in=500, bytes_out=280)
    for reason, lang, nbytes in (("too_few_words", "en", 100), ("language_not_allowed", "fr", 100)):
        clean.drop(reason)
        clean.count_doc(reason, "web", lang, nbytes)
    for _ in range(2):  # two kept English documents, 20 bytes trimmed
        clean.count_doc(KEPT, "web", "en", 100, 90)
    clean.count_doc(KEPT, "code", "en", 100, 100)
    clean.extra = {"pii.email": 2, "pii.email.web": 2, "c4.lines_removed.javascript": 4}
    exact = StageStats(stage="exact_dedup", docs_in=3, docs_out=2, bytes_in=280, bytes_out=190)
    exact.drop("exact_duplicate")
    exact.count_doc("exact_duplicate", "web", "en", 90)
    tokenize = StageStats(
        stage="tokenize", docs_in=2, docs_out=2, bytes_in=190, bytes_out=4 * 95, extra={"tokens": 95}
    )
    return {s.stage: s.to_json() for s in (clean, exact, tokenize)}


MIXTURE = {
    "sources": {
        "web": {"train": {"tokens": 45, "docs": 1}, "languages": {"train": {"en": 45}}},
        "code": {"train": {"tokens": 50, "docs": 1}, "languages": {"train": {"en": 50}}},
    }
}


def test_waterfall_rules_in_order_with_trimmed_bytes_and_estimated_tokens() -> None:
    card = build_card("x", "1" * 20, _clean_stats(), MIXTURE)
    rows = [
        (r["stage"], r["rule"], r["docs_in"], r["docs_removed"], r["bytes_in"], r["bytes_removed"])
        for r in card["waterfall"]
    ]
    assert rows == [
        ("clean", "language_not_allowed", 5, 1, 500, 100),  # the language check runs before the quality rules
        ("clean", "too_few_words", 4, 1, 400, 100),
        ("clean", "trimmed_text", 3, 0, 300, 20),
        ("exact_dedup", "exact_duplicate", 3, 1, 280, 90),
    ]
    # web keeps 90 bytes for 45 tokens (0.5 per byte), code 100 bytes for 50: the removed web bytes count at 0.5
    assert card["waterfall"][3]["tokens_removed_est"] == 45
    assert card["waterfall"][0]["tokens_removed_est"] == 50  # French web: no kept French, the source's ratio
    web = {r["rule"]: r for r in card["by_source"]["web"]}
    assert web["exact_duplicate"]["docs_in"] == 2 and "code" not in card["by_source"]
    assert {r["rule"] for r in card["by_language"]["fr"]} == {"language_not_allowed"}
    assert card["pii"] == {"clean": {"email": 2, "email.web": 2}}
    assert card["c4_lines_removed"] == {"clean": {"javascript": 4}}
    text = render_card(card)
    assert "| clean | language_not_allowed | 5 | 1 | 20.00% |" in text and "email.web" in text
    assert card_bytes(card) == card_bytes(build_card("x", "1" * 20, _clean_stats(), MIXTURE))


def test_rules_not_listed_come_after_the_listed_ones_of_their_stage() -> None:
    reasons = ["zeta_rule", "dup_line_fraction", "too_short_chars", "c4_javascript", "language_low_score"]
    assert ordered_rules("clean", reasons) == [
        "c4_javascript",
        "language_low_score",
        "too_short_chars",
        "dup_line_fraction",
        "zeta_rule",
    ]


def test_against_shows_what_moved_per_rule_and_source() -> None:
    old = build_card("x", "1" * 20, _clean_stats(), MIXTURE)
    stats = _clean_stats()
    stats["exact_dedup"]["dropped"] = {}
    stats["exact_dedup"].pop("tally")
    stats["exact_dedup"]["docs_out"], stats["exact_dedup"]["bytes_out"] = 3, 280
    new = build_card("x", "2" * 20, stats, MIXTURE)
    diff = diff_cards(new, old)
    assert [(r["rule"], r["docs_removed"], r["docs_delta"]) for r in diff["rules"]] == [
        ("exact_dedup:exact_duplicate", [1, 0], -1)
    ]
    assert [r["rule"] for r in diff["by_source"]["web"]] == ["exact_dedup:exact_duplicate"]
    text = render_diff(diff)
    assert "exact_dedup:exact_duplicate | 1 -> 0 | -1 |" in text and "## Source `web`" in text
    assert "the same documents" in render_diff(diff_cards(old, old))


def test_a_stage_that_drops_every_document_still_has_a_card() -> None:
    """Clean drops all (no kept tally at all) and exact dedup sees nothing: every row enters with what was there."""
    clean = _dropped("stop_words", [1, 2, 3])
    clean.docs_in, clean.bytes_in = 3, 30
    exact = StageStats(stage="exact")
    card = build_card("x", "0" * 20, {"clean": clean.to_json(), "exact": exact.to_json()}, {})
    [row] = [r for r in card["waterfall"] if r["rule"] == "stop_words"]
    assert row["docs_in"] == 3 and row["docs_removed"] == 3
    assert card["by_source"]["web"][0]["docs_in"] == 3 and card["by_source"]["web"][0]["docs_removed"] == 3
