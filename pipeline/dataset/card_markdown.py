"""The data card as markdown (``pileworks inspect card``, the build's ``data-card`` artifact), and the difference
between the cards of two datasets (``--against``): per rule and per source, what one build removed that the other
did not, so a scheduled rebuild reads in one page. Pure text; the flows add their charts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_ROWS = 40  # per table; the card's JSON holds every row


def _n(value: int | float | None) -> str:
    """A count with thousands separators (the JSON holds the exact values); ``-`` when unknown."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _pct(part: int | None, whole: int | None) -> str:
    return f"{part / whole:.2%}" if part is not None and whole else "-"


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("`", "'")


def waterfall_table(rows: list[dict[str, Any]], first: str = "stage | rule") -> list[str]:
    lines = [
        f"| {first} | docs in | docs removed | % | bytes in | bytes removed | tokens removed (est.) |",
        "|" + "---|" * (first.count("|") + 1) + "---:|" * 6,
    ]
    for r in rows[:MAX_ROWS]:
        lead = " | ".join(str(r[k]) for k in ("stage", "rule")) if first == "stage | rule" else r["rule"]
        lines.append(
            f"| {lead} | {_n(r['docs_in'])} | {_n(r['docs_removed'])} | {_pct(r['docs_removed'], r['docs_in'])} "
            f"| {_size(r['bytes_in'])} | {_size(r['bytes_removed'])} | {_n(r['tokens_removed_est'])} |"
        )
    if len(rows) > MAX_ROWS:
        lines.append(f"| … {len(rows) - MAX_ROWS} more rows in card.json |")
    return lines


def render_card(card: Mapping[str, Any]) -> str:
    """The whole card as markdown: totals, the waterfall, per source and language, examples, PII, C4, mixture."""
    lines = [
        f"# Data card: {card['name']}@{card['dataset_id'][:12]}",
        "",
        f"Documents in {_n(card['docs_in'])}, out {_n(card['docs_out'])}; tokens {_n(card['tokens'])} "
        f"(dataset tokens per byte {card['tokens_per_byte']['dataset']:g}). Tokens of removed documents "
        "are estimates (bytes x the tokens per byte of the kept documents of the same source and language).",
        "",
        "## Removal waterfall",
        "",
    ]
    lines += waterfall_table(card["waterfall"]) if card["waterfall"] else ["No document was removed."]
    if card.get("per_group_note"):
        lines += ["", f"No per-source table: {card['per_group_note']}."]
    for title, key in (("source", "by_source"), ("language", "by_language")):
        groups = card.get(key, {})
        if groups:
            lines += ["", f"## Removed per {title}", ""]
            for label, rows in list(groups.items())[:MAX_ROWS]:
                lines += [f"### {title} `{label}`", "", *waterfall_table(rows), ""]
    order = list(dict.fromkeys(f"{r['stage']}:{r['rule']}" for r in card["waterfall"]))
    examples = card.get("examples", {})
    lines += _examples({k: examples[k] for k in sorted(examples, key=lambda k: [*order, k].index(k))})
    for title, key in (("PII replaced", "pii"), ("C4 lines removed", "c4_lines_removed")):
        counters = card.get(key) or {}
        if counters:
            lines += ["", f"## {title}", "", "| stage | counter | value |", "|---|---|---:|"]
            lines += [f"| {st} | {k} | {_n(v)} |" for st, found in counters.items() for k, v in found.items()]
    lines += _histogram(card.get("quality_score_histogram") or {})
    lines += _mixture(card.get("mixture", {}))
    return "\n".join(lines) + "\n"


def _histogram(hist: Mapping[str, list[int]]) -> list[str]:
    """The quality classifier's scores per source: one row per source, a column per bin of 0.1."""
    if not hist:
        return []
    bins = len(next(iter(hist.values())))
    heads = [f"{b / bins:.1f}-{(b + 1) / bins:.1f}" for b in range(bins)]
    lines = ["", "## Quality scores (documents per score bin)", "", f"| source | {' | '.join(heads)} |"]
    lines.append("|---|" + "---:|" * bins)
    return lines + [f"| {_cell(src)} | {' | '.join(_n(c) for c in counts)} |" for src, counts in hist.items()]


def _examples(examples: Mapping[str, list[dict[str, str]]]) -> list[str]:
    if not examples:
        return []
    lines = [
        "",
        "## Examples of removed documents (first by id)",
        "",
        "| rule | id | source | language | text |",
        "|---|---|---|---|---|",
    ]
    for rule, found in examples.items():
        for e in found:
            lines.append(
                f"| {rule} | `{_cell(e['id'])}` | {_cell(e.get('source_name', ''))} | {e.get('language', '')} "
                f"| {_cell(e.get('text', ''))} |"
            )
    return lines


def _mixture(mixture: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for split, rows in mixture.items():
        if not rows:
            continue
        lines += [
            "",
            f"## Mixture ({split})",
            "",
            "| source | tokens | docs | share | target | languages |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for r in rows[:MAX_ROWS]:
            langs = ", ".join(
                f"{k} {_n(v)}" for k, v in sorted(r["languages"].items(), key=lambda kv: -kv[1])[:4]
            )
            lines.append(
                f"| {r['source']} | {_n(r['tokens'])} | {_n(r['docs'])} | {r['share']:.2%} | "
                f"{r['target_share']:.2%} | {langs} |"
            )
    return lines


# ---------------------------------------------------------------- two cards


def _removed(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {f"{r['stage']}:{r['rule']}": [r["docs_removed"], r["bytes_removed"] or 0] for r in rows}


def diff_cards(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """What moved from ``old`` to ``new``: documents and bytes removed per rule, overall and per source (rules
    either card has; zero where one lacks it), and the totals; rows whose counts are equal are left out."""

    def moved(a: dict[str, list[int]], b: dict[str, list[int]]) -> list[dict[str, Any]]:
        out = []
        for rule in list(dict.fromkeys([*b, *a])):
            (dn, bn), (do, bo) = a.get(rule, [0, 0]), b.get(rule, [0, 0])
            if (dn, bn) != (do, bo):
                out.append(
                    {
                        "rule": rule,
                        "docs_removed": [do, dn],
                        "docs_delta": dn - do,
                        "bytes_removed": [bo, bn],
                        "bytes_delta": bn - bo,
                    }
                )
        return out

    sources = sorted(set(new.get("by_source", {})) | set(old.get("by_source", {})))
    per_source = {
        s: m
        for s in sources
        if (m := moved(_removed(new["by_source"].get(s, [])), _removed(old["by_source"].get(s, []))))
    }
    return {
        "new": {"name": new["name"], "dataset_id": new["dataset_id"]},
        "old": {"name": old["name"], "dataset_id": old["dataset_id"]},
        "totals": {k: [old.get(k), new.get(k)] for k in ("docs_in", "docs_out", "tokens")},
        "rules": moved(_removed(new["waterfall"]), _removed(old["waterfall"])),
        "by_source": per_source,
    }


def render_diff(diff: Mapping[str, Any]) -> str:
    new, old = diff["new"], diff["old"]
    lines = [
        f"# Data card: {new['name']}@{new['dataset_id'][:12]} against {old['name']}@{old['dataset_id'][:12]}",
        "",
        "| | old | new | change |",
        "|---|---:|---:|---:|",
    ]
    for key, (a, b) in diff["totals"].items():
        delta = b - a if a is not None and b is not None else None
        lines.append(f"| {key} | {_n(a)} | {_n(b)} | {'+' if delta and delta > 0 else ''}{_n(delta)} |")
    sections = [("## Removed per rule", diff["rules"])]
    sections += [(f"## Source `{s}`", rows) for s, rows in diff["by_source"].items()]
    if not diff["rules"] and not diff["by_source"]:
        lines += ["", "Every rule removed the same documents and bytes in both."]
    for title, rows in sections:
        lines += [
            "",
            title,
            "",
            "| rule | docs removed (old -> new) | change | bytes removed (old -> new) | change |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in rows:
            (do, dn), (bo, bn) = r["docs_removed"], r["bytes_removed"]
            lines.append(
                f"| {r['rule']} | {_n(do)} -> {_n(dn)} | {r['docs_delta']:+,} | {_size(bo)} -> {_size(bn)} "
                f"| {r['bytes_delta']:+,} B |"
            )
    return "\n".join(lines) + "\n"
