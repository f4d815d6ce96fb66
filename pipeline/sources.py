"""Named sources of a corpus and their mixture weights (The Pile's components, GPT-NeoX's data paths).

A corpus config lists *sources*: each has inputs, optional per-source overrides (text field, language
filter, quality thresholds) and a weight, given either as ``epochs`` (how many times its tokens are seen per
pass, as The Pile states its weights) or as ``share`` (the target fraction of training tokens). A document's
*source name* is the source's ``name``, or, for a source without a name (one input mixing several sources, as
The Pile's files do), the value of the meta field ``name_field`` (``pile_set_name`` by default).

This module owns the provenance fields every document carries in its meta (``source_name``, ``source_entry``,
``language``...; the user's own meta lives beside them under ``user``, never overwritten) and the arithmetic
of the mixture: the target share of every source name given the realised token counts (:func:`target_shares`)
and the table ``pileworks inspect mixture`` prints (:func:`mixture_table`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from pipeline.clean.config import LangIdConfig, QualityConfig
from pipeline.records import url_host
from pipeline.units.protocol import KEPT, UNKNOWN_LANGUAGE, StageStats, snippet

if TYPE_CHECKING:
    from pipeline.dataset.shards import ShardInfo

DEFAULT_SOURCE = "default"  # the name of documents whose source gives no name and whose meta has none
NAME_FIELD = "pile_set_name"
USER_META = "user"  # the key of the user's own meta inside a document's meta
# Our provenance fields in a document's meta, beside USER_META.
SOURCE_NAME, SOURCE_ENTRY, LANGUAGE, LANGUAGE_SCORE = (
    "source_name",
    "source_entry",
    "language",
    "language_score",
)


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "._- " for c in name)


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """One named source. Give at most one of ``epochs`` and ``share``; neither means ``epochs: 1``.

    ``text_field``, ``langid`` and ``quality`` override the corpus-wide ingest/clean settings for this
    source's documents (a whole ``langid``/``quality`` section: its omitted fields take their defaults).
    """

    name: str = ""
    inputs: tuple[str, ...] = ()
    name_field: str = NAME_FIELD
    epochs: float | None = None
    share: float | None = None
    text_field: str | None = None
    langid: LangIdConfig | None = None
    quality: QualityConfig | None = None

    def __post_init__(self) -> None:
        label = f"sources.{self.name or '<unnamed>'}"
        if self.name and not _valid_name(self.name):
            raise ValueError(f"{label}: name must use letters, digits, ' ', '.', '_' or '-'")
        if not self.inputs:
            raise ValueError(f"{label}: inputs must list at least one path, glob, file:// or s3:// URI")
        if self.epochs is not None and self.share is not None:
            raise ValueError(f"{label}: give epochs or share, not both")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"{label}: epochs must be > 0, got {self.epochs}")
        if self.share is not None and not 0 < self.share <= 1:
            raise ValueError(f"{label}: share must be in (0, 1], got {self.share}")
        if not self.name_field:
            raise ValueError(f"{label}: name_field must be a meta field name")


def check_sources(sources: Sequence[SourceConfig]) -> None:
    """Cross-source rules: unique names, shares that can be met."""
    names = [s.name for s in sources if s.name]
    if len(set(names)) != len(names):
        raise ValueError(f"sources: names must be unique, got {names}")
    shares = sum(s.share or 0.0 for s in sources)
    if shares > 1 + 1e-9:
        raise ValueError(f"sources: the shares add up to {shares:g} > 1")
    if all(s.share is not None for s in sources) and sources and abs(shares - 1) > 1e-6:
        raise ValueError(f"sources: every source gives a share, so they must add up to 1 (got {shares:g})")


def source_name(entry: SourceConfig, user_meta: Mapping[str, Any]) -> str:
    """The source name of a document of ``entry`` whose own meta is ``user_meta``."""
    if entry.name:
        return entry.name
    value = user_meta.get(entry.name_field)
    return value if isinstance(value, str) and value else DEFAULT_SOURCE


def provenance(meta_json: str) -> tuple[str, int, str]:
    """(source name, source entry, language) of a document's meta (defaults for old, un-annotated meta)."""
    meta = json.loads(meta_json) if meta_json else {}
    if not isinstance(meta, dict):
        return DEFAULT_SOURCE, 0, ""
    entry = meta.get(SOURCE_ENTRY, 0)
    return (
        str(meta.get(SOURCE_NAME, DEFAULT_SOURCE)),
        entry if isinstance(entry, int) else 0,
        str(meta.get(LANGUAGE, "")),
    )


def tally_document(
    stats: StageStats,
    reason: str | None,
    doc_id: str,
    text: str,
    uri: str,
    meta_json: str,
    nbytes_in: int,
    nbytes_out: int = 0,
    language: str | None = None,
) -> None:
    """Count one document in ``stats.tally`` under its source name and language (``language``: as just
    identified, else its meta's); ``reason``: its drop reason (the document is kept as an example when it is
    among the first by id; the caller counts the drop itself with ``stats.drop``), or None when it goes on."""
    name, _, lang = provenance(meta_json)
    lang = (language if language is not None else lang) or UNKNOWN_LANGUAGE
    if reason is None:
        stats.count_doc(KEPT, name, lang, nbytes_in, nbytes_out)
        return
    stats.count_doc(reason, name, lang, nbytes_in)
    if stats.wants_example(reason, doc_id):
        example = {"id": doc_id, "source": uri, "source_name": name, "language": lang, "text": snippet(text)}
        stats.add_example(reason, example)


def target_shares(
    sources: Sequence[SourceConfig], tokens: Mapping[str, int], entry_of: Mapping[str, int]
) -> dict[str, float]:
    """The share of training tokens each source name should get, from the asked weights and the realised
    token counts (``tokens`` per name, ``entry_of``: the source entry each name came from).

    A source with a ``share`` gets it (split among the names it yields by their tokens); the others share
    what is left in proportion to ``epochs * tokens`` (epochs defaults to 1, i.e. natural proportions).
    """
    names = [n for n in sorted(tokens) if tokens[n] > 0]
    by_entry: dict[int, list[str]] = {}
    for n in names:
        by_entry.setdefault(entry_of.get(n, 0), []).append(n)
    out: dict[str, float] = {}
    fixed = 0.0
    for e, members in by_entry.items():
        share = sources[e].share if e < len(sources) else None
        if share is not None:
            entry_tokens = sum(tokens[n] for n in members)
            out.update({n: share * tokens[n] / entry_tokens for n in members})
            fixed += share
    free = [n for n in names if n not in out]
    raw = {n: _epochs(sources, entry_of.get(n, 0)) * tokens[n] for n in free}
    raw_total = float(sum(raw.values(), 0.0))
    if free and raw_total > 0:
        out.update({n: (1.0 - fixed) * raw[n] / raw_total for n in free})
    grand = float(sum(out.values(), 0.0))
    return {n: v / grand for n, v in out.items()} if grand > 0 else out


def _epochs(sources: Sequence[SourceConfig], entry: int) -> float:
    if entry < len(sources) and sources[entry].epochs is not None:
        return float(sources[entry].epochs)  # type: ignore[arg-type]
    return 1.0


def asked_weight(sources: Sequence[SourceConfig], entry: int) -> dict[str, float]:
    """The weight a source entry asked for, as written in the config."""
    if entry < len(sources) and sources[entry].share is not None:
        return {"share": float(sources[entry].share)}  # type: ignore[arg-type]
    return {"epochs": _epochs(sources, entry)}


def format_mixture(mixture: Mapping[str, Any], split: str = "train") -> str:
    """The mixture as a text table: one row per source, then one per language."""
    lines = [f"{'source':24} {'tokens':>12} {'docs':>8} {'share':>7} {'target':>7}  asked      languages"]
    for row in mixture_table(mixture, split):
        asked = ", ".join(f"{k} {v:g}" for k, v in row["asked"].items())
        top = ", ".join(f"{k} {v}" for k, v in sorted(row["languages"].items(), key=lambda kv: -kv[1])[:4])
        lines.append(
            f"{row['source'][:24]:24} {row['tokens']:>12,} {row['docs']:>8,} {row['share']:>7.2%} "
            f"{row['target_share']:>7.2%}  {asked:10} {top}"
        )
    langs = mixture.get("languages", {})
    total = sum(v.get(split, {}).get("tokens", 0) for v in langs.values()) or 1
    lines.append(f"{'language':24} {'tokens':>12} {'docs':>8} {'share':>7}")
    for lang in sorted(langs, key=lambda k: -langs[k].get(split, {}).get("tokens", 0)):
        counts = langs[lang].get(split, {"tokens": 0, "docs": 0})
        lines.append(
            f"{lang:24} {counts['tokens']:>12,} {counts['docs']:>8,} {counts['tokens'] / total:>7.2%}"
        )
    return "\n".join(lines)


def url_domain(url: str) -> str:
    """The host of a URL as :func:`pipeline.records.url_host` gives it, without ``www.`` ("" for no URL)."""
    return url_host(url).removeprefix("www.")


def domain_tokens(docs_paths: Iterable[Any], top: int = 10) -> dict[str, list[tuple[str, int, int]]]:
    """The ``top`` domains of each source name, (domain, tokens, documents) by tokens, from shards'
    ``docs.parquet`` files (paths or file objects); sources without URLs are left out."""
    per: dict[str, dict[str, list[int]]] = {}
    for path in docs_paths:
        table = pq.read_table(path, columns=["source_name", "url", "tokens", "piece"])
        cols = [table.column(c).to_pylist() for c in ("source_name", "url", "tokens", "piece")]
        for name, url, tokens, piece in zip(*cols, strict=True):
            if not url:
                continue
            acc = per.setdefault(name, {}).setdefault(url_domain(url), [0, 0])
            acc[0] += tokens
            acc[1] += int(piece == 0)
    return {
        name: sorted(((d, t, n) for d, (t, n) in domains.items()), key=lambda x: (-x[1], x[0]))[:top]
        for name, domains in sorted(per.items())
    }


def format_top_domains(top: Mapping[str, Sequence[tuple[str, int, int]]]) -> str:
    """Top domains per source as a text table (empty when no document has a URL)."""
    if not top:
        return ""
    lines = [f"{'source':24} {'domain':40} {'tokens':>12} {'docs':>8}"]
    for name, rows in top.items():
        lines += [f"{name[:24]:24} {d[:40]:40} {t:>12,} {n:>8,}" for d, t, n in rows]
    return "\n".join(lines)


def mixture_table(mixture: Mapping[str, Any], split: str = "train") -> list[dict[str, Any]]:
    """Rows (source, tokens, docs, natural share, target share, asked weight) of a manifest's mixture."""
    per_source = mixture.get("sources", {})
    total = sum(v.get(split, {}).get("tokens", 0) for v in per_source.values()) or 1
    rows = []
    for name in sorted(per_source):
        info = per_source[name]
        counts = info.get(split, {})
        rows.append(
            {
                "source": name,
                "tokens": int(counts.get("tokens", 0)),
                "docs": int(counts.get("docs", 0)),
                "share": round(counts.get("tokens", 0) / total, 4),
                "target_share": round(float(info.get("target_share", 0.0)), 4),
                "asked": info.get("asked", {}),
                "languages": info.get("languages", {}).get(split, {}),
            }
        )
    return rows


def mixture_of_shards(
    staged: str | Path, written: Sequence[ShardInfo], sources: Sequence[SourceConfig]
) -> dict[str, Any]:
    """The manifest's ``mixture``, counted from the shards' ``docs.parquet`` (so the two always agree).

    ``sources[name]``: tokens and documents per split, tokens per language per split, the source entry,
    the weight asked and the target share of training tokens; ``languages[code]``: tokens and documents per
    split; ``ranges[split]``: each source's contiguous ``[token_start, token_start + tokens)`` in the split's
    token stream (the shard writer groups documents by source).
    """
    runs = [shard_runs(Path(staged) / shard.docs_key) for shard in written]
    return mixture_from_runs(written, runs, sources)


def shard_runs(docs_path: str | Path) -> list[list[Any]]:
    """A shard's ``docs.parquet`` as runs of consecutive pieces with the same source name and language:
    ``[name, language, source entry of the run's first piece, tokens, documents starting]`` (what
    :func:`mixture_from_runs` adds up; a worker that wrote the shard hands these on instead of the file)."""
    table = pq.read_table(docs_path, columns=["tokens", "piece", *_COLUMNS])
    cols = {c: table.column(c).to_pylist() for c in ("tokens", "piece", *_COLUMNS)}
    runs: list[list[Any]] = []
    for tokens, piece, name, lang, meta in zip(*cols.values(), strict=True):
        if runs and runs[-1][0] == name and runs[-1][1] == lang:
            runs[-1][3] += tokens
            runs[-1][4] += int(piece == 0)
        else:
            runs.append([name, lang, provenance(meta)[1], tokens, int(piece == 0)])
    return runs


def mixture_from_runs(
    written: Sequence[ShardInfo], runs: Sequence[Sequence[Sequence[Any]]], sources: Sequence[SourceConfig]
) -> dict[str, Any]:
    """:func:`mixture_of_shards` from each shard's :func:`shard_runs` (``runs[i]`` belongs to ``written[i]``)."""
    per: dict[str, dict[str, Any]] = {}
    langs: dict[str, dict[str, dict[str, int]]] = {}
    ranges: dict[str, list[dict[str, Any]]] = {}
    for shard, shard_runs_ in sorted(zip(written, runs, strict=True), key=lambda x: (x[0].split, x[0].index)):
        offset = shard.token_offset
        for name, lang, entry, tokens, starts in shard_runs_:
            info = per.setdefault(name, {"entry": entry, "languages": {}})
            _add(info.setdefault(shard.split, {"tokens": 0, "docs": 0}), tokens, starts)
            by_lang = info["languages"].setdefault(shard.split, {})
            by_lang[lang or "und"] = by_lang.get(lang or "und", 0) + tokens
            _add(
                langs.setdefault(lang or "und", {}).setdefault(shard.split, {"tokens": 0, "docs": 0}),
                tokens,
                starts,
            )
            _extend_range(ranges.setdefault(shard.split, []), name, offset, tokens)
            offset += tokens
    train = {n: v.get("train", {}).get("tokens", 0) for n, v in per.items()}
    shares = target_shares(sources, train, {n: v["entry"] for n, v in per.items()})
    for name, info in per.items():
        info["asked"] = asked_weight(sources, info["entry"])
        info["target_share"] = round(shares.get(name, 0.0), 6)
    return {"sources": dict(sorted(per.items())), "languages": dict(sorted(langs.items())), "ranges": ranges}


_COLUMNS = ("source_name", "language", "meta")


def _add(counts: dict[str, int], tokens: int, starts: int) -> None:
    counts["tokens"] += tokens
    counts["docs"] += starts


def _extend_range(ranges: list[dict[str, Any]], name: str, offset: int, tokens: int) -> None:
    if ranges and ranges[-1]["source"] == name and ranges[-1]["token_start"] + ranges[-1]["tokens"] == offset:
        ranges[-1]["tokens"] += tokens
        return
    if any(r["source"] == name for r in ranges):
        raise ValueError(
            f"source {name!r} is not contiguous in the token stream; shards must group by source"
        )
    ranges.append({"source": name, "token_start": offset, "tokens": tokens})
