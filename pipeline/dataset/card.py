"""The data card of a dataset: what each rule of the build removed, with examples, PII counts and the mixture.

``card.json`` is published beside ``manifest.json`` (listed in it with its sha256, ``Manifest.card``) and is a
pure function of the manifest's per-stage stats and mixture (:func:`build_card`), so the same inputs and config
give the same bytes. It holds:

- ``waterfall``: one row per rule in pipeline order (ingest's quarantine reasons, clean's rules, exact and near
  dedup, decontam, tokenize): documents and bytes entering the rule and removed by it, and the tokens of both,
  *estimated* (a removed document was never tokenized). A ``trimmed_text`` row counts the bytes a stage cut from
  documents it kept (boilerplate lines, decontam spans). Inside a stage the rules are exclusive (a document is
  dropped for its first failing rule), so what enters a rule is what the earlier rules of the stage left.
- ``by_source`` / ``by_language``: the same rows per source name and per language (as clean identified it;
  ``und`` for a document dropped before identification, or not identified), from the stages' ``tally``.
- ``examples`` per rule: the first three removed documents by id (id, source, source name, language, the
  start of the text); a dropped document's id is its record id (``<object URI>#<position>``), as ``pileworks
  trace`` prints the documents a step trained on, and quarantined records have the same form.
- ``quality_score_histogram`` (a build with ``clean.classifier`` only): per source, the documents clean scored
  in bins of 0.1 over [0, 1]; ``classifier_low`` drops are clean's rows (``min_score``) or the ``classifier``
  stage's (``keep_fraction``).
- ``pii`` (every ``pii.*`` counter of every stage), ``c4_lines_removed`` (``c4.lines_removed.<reason>``) and
  the ``mixture`` (``pileworks inspect mixture``'s table).

Token estimates: tokens per byte differ several-fold between prose, code and CJK text, so a removed document's
tokens are its bytes times the tokens per byte of the kept documents of the same source and language in this
dataset, else of the same source, else of the whole dataset (``tokens_per_byte`` in the card).
Ingest's quarantined records count the bytes of their kept sample (at most 4 KiB each): a lower bound.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.clean.scores import histograms
from pipeline.dataset.manifest import Manifest
from pipeline.sources import mixture_table
from pipeline.storage import ObjectStore, sha256_bytes
from pipeline.units.protocol import KEPT, StageStats

CARD_KEY = "card.json"
CARD_VERSION = 1
STAGES = ("ingest", "clean", "classifier", "exact_dedup", "near_dedup", "decontam", "tokenize")
TRIMMED = "trimmed_text"
# Clean's rules in the order the stage applies them (patterns; a reason not listed comes after the listed ones,
# by name). The rules of a stage are exclusive, so the order only decides what "enters" each rule.
RULE_ORDER = {
    "clean": (
        "empty_after_clean",
        "c4*",
        "language_*",
        "too_short_chars",
        "too_long_chars",
        "too_few_words",
        "too_many_words",
        "mean_word_length",
        "symbol_ratio",
        "*hash*",
        "*ellips*",
        "*alpha*",
        "bullet_lines",
        "ellipsis_lines",
        "dup_line_fraction",
        "dup_line_char_fraction",
        "dup_para_fraction",
        "dup_para_char_fraction",
        "top_*gram_fraction",
        "dup_*gram_fraction",
        "*stop_word*",
    ),
    "near_dedup": ("near_duplicate_of_index", "near_duplicate"),
}
PII_PREFIX = "pii."
C4_LINES_PREFIX = "c4.lines_removed."


def ordered_rules(stage: str, reasons: Iterable[str]) -> list[str]:
    patterns = RULE_ORDER.get(stage, ())

    def rank(reason: str) -> tuple[int, str]:
        hit = next((i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(reason, p)), len(patterns))
        return hit, reason

    return sorted(set(reasons), key=rank)


# ---------------------------------------------------------------- per-group flows


Group = tuple[str, str]  # (source name, language)


def _tallies(stats: StageStats) -> tuple[dict[Group, list[int]], dict[str, dict[Group, list[int]]]]:
    """A stage's kept (docs, bytes in, bytes out) and removed (docs, bytes) per group and reason."""
    kept: dict[Group, list[int]] = {}
    removed: dict[str, dict[Group, list[int]]] = {}
    for (outcome, source, lang), (docs, b_in, b_out) in stats.tally.items():
        if outcome == KEPT:
            kept[(source, lang)] = [docs, b_in, b_out]
        else:
            removed.setdefault(outcome, {})[(source, lang)] = [docs, b_in]
    return kept, removed


def _complete(stats: StageStats, removed: Mapping[str, Mapping[Group, list[int]]]) -> bool:
    """Whether every drop of the stage is in its tally (not so for stats written before the tally existed)."""
    return all(sum(r[0] for r in removed.get(k, {}).values()) == n for k, n in stats.dropped.items() if n)


def group_flows(stages: Mapping[str, StageStats]) -> dict[str, dict[str, Any]] | None:
    """Per stage: ``in``/``out`` (docs, bytes) per group and ``removed`` per reason and group; None when a stage
    that dropped documents did not tally them (the per-source and per-language tables cannot be built)."""
    flows: dict[str, dict[str, Any]] = {}
    prev_out: dict[Group, list[int]] | None = None
    for name in (s for s in STAGES if s in stages and s not in ("ingest", "tokenize")):
        kept, removed = _tallies(stages[name])
        if not _complete(stages[name], removed):
            return None
        if kept or prev_out is None:
            out = {g: [v[0], v[2]] for g, v in kept.items()}
            entering = {g: [v[0], v[1]] for g, v in kept.items()}
        else:
            entering = {g: list(v) for g, v in prev_out.items()}
            out = {g: list(v) for g, v in prev_out.items()}
            for per_group in removed.values():
                for g, (docs, nbytes) in per_group.items():
                    out.setdefault(g, [0, 0])
                    out[g] = [out[g][0] - docs, out[g][1] - nbytes]
        # a stage that tallies its kept documents (or the first one) enters with what it kept and removed;
        # one that tallies only its drops enters with what the stage before let through
        for per_group in removed.values() if kept or prev_out is None else ():
            for g, (docs, nbytes) in per_group.items():
                row = entering.setdefault(g, [0, 0])
                row[0], row[1] = row[0] + docs, row[1] + nbytes
        flows[name] = {"in": entering, "out": out, "removed": removed}
        prev_out = out
    if "ingest" in stages and flows:
        first = flows[next(iter(flows))]
        _, removed = _tallies(stages["ingest"])
        if not _complete(stages["ingest"], removed):
            return None
        entering = {g: list(v) for g, v in first["in"].items()}
        for per_group in removed.values():
            for g, (docs, nbytes) in per_group.items():
                row = entering.setdefault(g, [0, 0])
                row[0], row[1] = row[0] + docs, row[1] + nbytes
        flows = {"ingest": {"in": entering, "out": first["in"], "removed": removed}, **flows}
    return flows


# ---------------------------------------------------------------- tokens per byte


def tokens_per_byte(
    mixture: Mapping[str, Any], final: Mapping[Group, list[int]], dataset: float
) -> dict[Group | str, float]:
    """Tokens per byte of the kept documents per (source, language) and per source (the dataset's tokens from the
    mixture over its kept bytes); ``"*"``: the whole dataset's."""
    out: dict[Group | str, float] = {"*": dataset}
    by_source: dict[str, list[float]] = {}
    for name, info in mixture.get("sources", {}).items():
        for per_lang in info.get("languages", {}).values():
            for lang, tokens in per_lang.items():
                nbytes = final.get((name, lang), [0, 0])[1]
                if nbytes:
                    out[(name, lang)] = out.get((name, lang), 0.0) + tokens / nbytes
                    acc = by_source.setdefault(name, [0.0, 0.0])
                    acc[0] += tokens
    for (name, _), (_, nbytes) in final.items():
        if name in by_source:
            by_source[name][1] += nbytes
    out.update({name: t / b for name, (t, b) in by_source.items() if b})
    return out


def _estimate(ratios: Mapping[Group | str, float], group: Group, nbytes: int) -> int:
    ratio = ratios.get(group, ratios.get(group[0], ratios["*"]))
    return round(nbytes * ratio)


# ---------------------------------------------------------------- the card


def build_card(
    name: str, dataset_id: str, stats: Mapping[str, Mapping[str, Any]], mixture: Mapping[str, Any]
) -> dict[str, Any]:
    """The data card (JSON-ready, deterministic) from a manifest's per-stage stats and mixture; a build with a
    quality classifier adds ``quality_score_histogram`` (per source, counts in bins of 0.1 over [0, 1])."""
    card = _card(name, dataset_id, stats, mixture)
    clean = stats.get("clean")
    if clean and (
        hist := histograms(clean.get("extra", {}))
    ):  # absent otherwise: other cards stay as they were
        card["quality_score_histogram"] = hist
    return card


def _card(
    name: str, dataset_id: str, stats: Mapping[str, Mapping[str, Any]], mixture: Mapping[str, Any]
) -> dict[str, Any]:
    stages = {k: StageStats.from_json(dict(v)) for k, v in stats.items() if k in STAGES}
    flows = group_flows(stages)
    tok = stages.get("tokenize")
    dataset_ratio = tok.extra.get("tokens", 0) / tok.bytes_in if tok and tok.bytes_in else 0.0
    final = flows[next(reversed(flows))]["out"] if flows else {}
    ratios = tokens_per_byte(mixture, final, dataset_ratio)
    waterfall: list[dict[str, Any]] = []
    by_source: dict[str, list[dict[str, Any]]] = {}
    by_language: dict[str, list[dict[str, Any]]] = {}
    for stage in (s for s in STAGES if s in stages):
        flow = flows.get(stage) if flows else None
        waterfall += _stage_rows(stage, stages[stage], flow, ratios)
        if flow is not None:
            _group_rows(stage, stages[stage], flow, ratios, by_source, by_language)
    last = stages.get("tokenize") or stages[next(reversed(stages))] if stages else StageStats(stage="none")
    return {
        "card_version": CARD_VERSION,
        "name": name,
        "dataset_id": dataset_id,
        "docs_in": stages["ingest"].docs_in if "ingest" in stages else None,
        "docs_out": last.docs_out,
        "tokens": int(tok.extra.get("tokens", 0)) if tok else None,
        "tokens_per_byte": {
            "dataset": round(dataset_ratio, 6),
            "by_source": {
                k: round(v, 6) for k, v in sorted(ratios.items(), key=str) if isinstance(k, str) and k != "*"
            },
        },
        "waterfall": waterfall,
        "by_source": dict(sorted(by_source.items())),
        "by_language": dict(sorted(by_language.items())),
        "per_group_note": None
        if flows is not None
        else "a stage's stats hold no per-document tally (built before the card)",
        "examples": {
            f"{stage}:{reason}": stages[stage].examples[reason]
            for stage in STAGES
            if stage in stages
            for reason in ordered_rules(stage, stages[stage].examples)
        },
        "pii": _prefixed(stages, PII_PREFIX),
        "c4_lines_removed": _prefixed(stages, C4_LINES_PREFIX),
        "mixture": {split: mixture_table(mixture, split) for split in ("train", "valid")} if mixture else {},
    }


def _prefixed(stages: Mapping[str, StageStats], prefix: str) -> dict[str, dict[str, Any]]:
    """The ``extra`` counters starting with ``prefix``, per stage (the prefix cut off)."""
    out = {}
    for stage, st in stages.items():
        found = {k[len(prefix) :]: v for k, v in sorted(st.extra.items()) if k.startswith(prefix)}
        if found:
            out[stage] = found
    return out


def _row(
    stage: str,
    rule: str,
    docs_in: int,
    bytes_in: int | None,
    docs: int,
    nbytes: int | None,
    tokens_in: int | None,
    tokens: int | None,
) -> dict[str, Any]:
    return {
        "stage": stage,
        "rule": rule,
        "docs_in": docs_in,
        "docs_removed": docs,
        "bytes_in": bytes_in,
        "bytes_removed": nbytes,
        "tokens_in_est": tokens_in,
        "tokens_removed_est": tokens,
    }


def _stage_rows(
    stage: str, st: StageStats, flow: Mapping[str, Any] | None, ratios: Mapping[Group | str, float]
) -> list[dict[str, Any]]:
    """The waterfall rows of one stage, its rules in order, then the bytes it trimmed from kept documents."""
    _, removed = _tallies(st)
    known = flow is not None or _complete(st, removed)
    drop_bytes = {r: sum(v[1] for v in removed.get(r, {}).values()) for r in st.dropped}
    bytes_in = st.bytes_out + sum(drop_bytes.values()) if stage == "ingest" else st.bytes_in
    if stage == "tokenize":  # its bytes are the kept documents' (an empty text has none)
        bytes_in = st.bytes_in

    def tokens(reason: str | None, nbytes: int) -> int:
        if flow is None:
            return round(nbytes * ratios["*"])
        groups = flow["removed"].get(reason, {}) if reason else flow["in"]
        return sum(_estimate(ratios, g, v[1]) for g, v in groups.items())

    rows, docs_left, bytes_left = [], st.docs_in, bytes_in
    tokens_left = tokens(None, bytes_in)
    for reason in ordered_rules(stage, (r for r, n in st.dropped.items() if n)):
        docs, nbytes = st.dropped[reason], drop_bytes[reason] if known else None
        est = tokens(reason, nbytes) if nbytes is not None else None
        rows.append(
            _row(
                stage,
                reason,
                docs_left,
                bytes_left if known else None,
                docs,
                nbytes,
                tokens_left if known else None,
                est,
            )
        )
        docs_left -= docs
        if nbytes is not None and est is not None:
            bytes_left, tokens_left = bytes_left - nbytes, tokens_left - est
    trimmed = bytes_left - st.bytes_out if known and stage not in ("ingest", "tokenize") else 0
    if trimmed > 0:
        est = round(trimmed * tokens_left / bytes_left) if bytes_left else 0
        rows.append(_row(stage, TRIMMED, docs_left, bytes_left, 0, trimmed, tokens_left, est))
    return rows


def _group_rows(
    stage: str,
    st: StageStats,
    flow: Mapping[str, Any],
    ratios: Mapping[Group | str, float],
    by_source: dict[str, list[dict[str, Any]]],
    by_language: dict[str, list[dict[str, Any]]],
) -> None:
    """The rows of one stage per source and per language (rules that removed something from the group)."""
    for key, table in ((0, by_source), (1, by_language)):
        entering: dict[str, list[int]] = {}
        for g, (docs, nbytes) in flow["in"].items():
            acc = entering.setdefault(g[key], [0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + docs, acc[1] + nbytes, acc[2] + _estimate(ratios, g, nbytes)
        for reason in ordered_rules(stage, flow["removed"]):
            removed: dict[str, list[int]] = {}
            for g, (docs, nbytes) in flow["removed"][reason].items():
                acc = removed.setdefault(g[key], [0, 0, 0])
                acc[0], acc[1], acc[2] = acc[0] + docs, acc[1] + nbytes, acc[2] + _estimate(ratios, g, nbytes)
            for label, (docs, nbytes, est) in sorted(removed.items()):
                left = entering[label]
                table.setdefault(label, []).append(
                    _row(stage, reason, left[0], left[1], docs, nbytes, left[2], est)
                )
                left[0], left[1], left[2] = left[0] - docs, left[1] - nbytes, left[2] - est


def card_bytes(card: Mapping[str, Any]) -> bytes:
    """The published bytes of a card: sorted keys, so the same card is always the same bytes."""
    return (json.dumps(card, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def attach_card(manifest: Manifest) -> bytes:
    """Build the card of ``manifest`` (from its stats and mixture), list it in the manifest (key, sha256,
    bytes) and return its bytes, to be published beside the manifest under the dataset's prefix."""
    data = card_bytes(build_card(manifest.name, manifest.dataset_id, manifest.stats, manifest.mixture))
    manifest.card = {"key": CARD_KEY, "sha256": sha256_bytes(data), "bytes": len(data)}
    return data


def read_card(manifest: Manifest, store: ObjectStore) -> dict[str, Any]:
    """The published card of a dataset (``store`` rooted at its prefix), verified against the manifest's
    sha256; a dataset published before cards existed gets one built from its manifest's stats."""
    if not manifest.card:
        return build_card(manifest.name, manifest.dataset_id, manifest.stats, manifest.mixture)
    data = store.get_bytes(manifest.card["key"])
    if sha256_bytes(data) != manifest.card["sha256"]:
        raise ValueError(
            f"{store.uri_of(manifest.card['key'])} does not match the sha256 the manifest lists for it "
            "(the card was edited or the upload is incomplete): publish the dataset again"
        )
    card: dict[str, Any] = json.loads(data)
    return card
