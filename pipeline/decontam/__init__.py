"""Test-set decontamination: drop (or cut) documents that share a long n-gram with an evaluation text.

As GPT-3 did: text is lower-cased and split into *units*, words for most scripts and single characters for
Chinese/Japanese (Han, Hiragana, Katakana: no spaces between words), and a document is contaminated when it
shares an ``ngram``-unit window (13 by default) with any evaluation text.

Two steps, so the corpus is streamed against a set built once:

1. :func:`build_eval_index` reads every evaluation set (JSONL/parquet, optionally compressed, local or on
   ``s3://``, ``gs://``, ``az://``, through the ingest readers) and writes the sorted 64-bit hashes of all
   their n-grams, with a bit mask of the sets each one occurs in, to one ``.npz`` object.
2. :func:`run_decontam_part` loads it once per part and, per document, hashes every window (a rolling
   polynomial over per-unit xxhash64 values, vectorised with numpy) and looks them up with a binary search.
   ``mode="remove"`` drops a contaminated document; ``mode="cut"`` removes the matched spans and keeps the rest.

Each part writes ``part-NNNNN.matches.json`` (the matched n-grams, as text, with their eval sets) beside its
records; :func:`merge_reports` turns them into one report.
"""

from __future__ import annotations

import io
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.stage import iter_ingest_part, list_inputs, plan_parts
from pipeline.records import Quarantined, Record, iter_part_batches, write_part
from pipeline.sources import provenance, tally_document
from pipeline.storage import ObjectStore, S3Options
from pipeline.units.protocol import StageStats, done_part_stats, part_name

# A CJK character is a unit by itself; any other run of letters/digits is a word.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNIT_RE = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
_ASCII_SEPARATORS = (
    bytes(b if chr(b).isalnum() or b == ord("_") else ord(" ") for b in range(128)) + b" " * 128
)
_PRIME = np.uint64(1099511628211)  # FNV-64 prime: the rolling hash multiplier (mod 2**64)
PREFILTER_BITS = 24  # 16 MiB of filter: few false positives up to millions of evaluation n-grams
MAX_EVAL_SETS = 64  # one bit per set in the index's mask
MATCH_EXAMPLES_PER_PART = 200


@dataclass(frozen=True, kw_only=True)
class EvalSet:
    """One evaluation set: a name (used in counts and reports), its files and the field holding the text."""

    name: str
    inputs: tuple[str, ...]
    text_field: str = "text"

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise ValueError(
                f"decontam.eval_sets: name {self.name!r} must use letters, digits, '.', '_', '-'"
            )
        if not self.inputs:
            raise ValueError(f"decontam.eval_sets.{self.name}: inputs must list at least one file or folder")


@dataclass(frozen=True, kw_only=True)
class DecontamConfig:
    """``eval_sets`` empty: the stage is skipped. ``mode``: ``remove`` the document or ``cut`` the spans."""

    eval_sets: tuple[EvalSet, ...] = ()
    ngram: int = 13
    mode: str = "remove"
    min_kept_chars: int = 200  # "cut": a document left shorter than this is dropped as well

    def __post_init__(self) -> None:
        if self.ngram < 1:
            raise ValueError(f"decontam.ngram must be >= 1, got {self.ngram}")
        if self.mode not in ("remove", "cut"):
            raise ValueError(f"decontam.mode must be 'remove' or 'cut', got {self.mode!r}")
        if self.min_kept_chars < 0:
            raise ValueError(f"decontam.min_kept_chars must be >= 0, got {self.min_kept_chars}")
        names = [s.name for s in self.eval_sets]
        if len(set(names)) != len(names):
            raise ValueError(f"decontam.eval_sets: names must be unique, got {names}")
        if len(names) > MAX_EVAL_SETS:
            raise ValueError(f"decontam.eval_sets: at most {MAX_EVAL_SETS} sets, got {len(names)}")

    @property
    def enabled(self) -> bool:
        return bool(self.eval_sets)


# ---------------------------------------------------------------- n-grams


def _fold(text: str) -> str:
    """Case- and compatibility-folded text (NFKC): the corpus is cleaned, evaluation data is not. Length
    may change, so spans for cutting are found on the text itself (see :func:`cut_spans`)."""
    return text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()


def units(text: str) -> list[str]:
    """The folded words (CJK: characters) of ``text`` (the reference for :func:`unit_keys`)."""
    return _UNIT_RE.findall(_fold(text))


def unit_keys(text: str) -> list[str] | list[bytes]:
    """The units of ``text`` for hashing: ASCII text is split as bytes (3x faster than the regex, and the
    same words: ``\\w`` on ASCII is ``[A-Za-z0-9_]``), other text by :func:`units`."""
    if text.isascii():
        return text.encode("ascii").lower().translate(_ASCII_SEPARATORS).split()
    return units(text)


class _HashCache(dict[str | bytes, int]):
    """xxhash64 of a unit's UTF-8 bytes, whether the unit comes as ``str`` or as ``bytes``."""

    def __missing__(self, word: str | bytes) -> int:
        data = word.encode("utf-8", "surrogatepass") if isinstance(word, str) else word
        value = self[word] = xxhash.xxh64_intdigest(data)
        return value


class UnitHasher:
    """xxhash64 of each unit, memoised (words repeat: Zipf), bounded so memory stays flat."""

    def __init__(self, limit: int = 1 << 20):
        self.cache = _HashCache()
        self.limit = limit

    def __call__(self, words: list[str] | list[bytes]) -> np.ndarray:
        if len(self.cache) > self.limit:
            self.cache.clear()
        return np.fromiter(map(self.cache.__getitem__, words), dtype=np.uint64, count=len(words))


def window_hashes(unit_hashes: np.ndarray, n: int) -> np.ndarray:
    """Hash of every window of ``n`` consecutive units (empty when there are fewer than ``n``)."""
    m = len(unit_hashes) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    acc = unit_hashes[:m].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            acc *= _PRIME
            acc += unit_hashes[k : k + m]
    return acc


# ---------------------------------------------------------------- the evaluation index


@dataclass
class EvalIndex:
    """Sorted unique n-gram hashes of the evaluation data and, for each, the bit mask of its sets."""

    names: tuple[str, ...]
    ngram: int
    hashes: np.ndarray
    masks: np.ndarray
    texts: dict[str, int] = field(default_factory=dict)  # eval texts read per set
    too_short: dict[str, int] = field(default_factory=dict)  # eval texts with fewer than ngram units

    def __post_init__(self) -> None:
        # A one-byte-per-slot filter on the top PREFILTER_BITS of each hash: most windows of a clean
        # document miss it, and only the others are binary-searched.
        self._filter = np.zeros(1 << PREFILTER_BITS, dtype=np.bool_)
        self._filter[self.hashes >> np.uint64(64 - PREFILTER_BITS)] = True

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Per window: the mask of the sets holding it (0 when none)."""
        out = np.zeros(len(hashes), dtype=np.uint64)
        if not len(self.hashes) or not len(hashes):
            return out
        maybe = np.flatnonzero(self._filter[hashes >> np.uint64(64 - PREFILTER_BITS)])
        if len(maybe):
            candidates = hashes[maybe]
            pos = np.minimum(np.searchsorted(self.hashes, candidates), len(self.hashes) - 1)
            out[maybe] = np.where(self.hashes[pos] == candidates, self.masks[pos], np.uint64(0))
        return out

    def to_bytes(self) -> bytes:
        sink = io.BytesIO()
        meta = {"names": self.names, "ngram": self.ngram, "texts": self.texts, "too_short": self.too_short}
        np.savez(sink, hashes=self.hashes, masks=self.masks, meta=np.array(json.dumps(meta)))
        return sink.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> EvalIndex:
        with np.load(io.BytesIO(data)) as z:
            meta = json.loads(str(z["meta"]))
            return cls(
                tuple(meta["names"]),
                int(meta["ngram"]),
                z["hashes"],
                z["masks"],
                meta["texts"],
                meta["too_short"],
            )


def index_texts(texts_by_set: dict[str, list[str]], ngram: int) -> EvalIndex:
    """Build the index from texts in memory (what :func:`build_eval_index` does after reading the sets)."""
    hasher = UnitHasher()
    all_hashes, all_masks = [], []
    names = tuple(texts_by_set)
    counts, short = {}, {}
    for bit, name in enumerate(names):
        texts = texts_by_set[name]
        counts[name], short[name] = len(texts), 0
        for text in texts:
            hashes = window_hashes(hasher(unit_keys(text)), ngram)
            short[name] += not len(hashes)
            all_hashes.append(hashes)
            all_masks.append(np.full(len(hashes), np.uint64(1) << np.uint64(bit), dtype=np.uint64))
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, dtype=np.uint64)
    masks = np.concatenate(all_masks) if all_masks else np.zeros(0, dtype=np.uint64)
    order = np.argsort(hashes, kind="stable")
    hashes, masks = hashes[order], masks[order]
    unique, first = np.unique(hashes, return_index=True)
    merged = np.bitwise_or.reduceat(masks, first) if len(first) else masks
    return EvalIndex(names, ngram, unique, merged, counts, short)


def read_eval_texts(eval_set: EvalSet, s3: S3Options | None = None) -> list[str]:
    """Every text of one evaluation set, read with the ingest readers (any format ingest reads)."""
    cfg = IngestConfig(text_field=eval_set.text_field, txt_mode="paragraph")
    texts: list[str] = []
    for plan in plan_parts(list_inputs(list(eval_set.inputs), s3, cfg.extensions), 1 << 62, cfg=cfg, s3=s3):
        stats, quarantined = StageStats(stage="eval"), list[Quarantined]()
        texts += [r.text for r in iter_ingest_part(plan, cfg, stats, quarantined, s3)]
        if quarantined:
            bad = quarantined[0]
            raise ValueError(
                f"eval set {eval_set.name}: {len(quarantined)} unreadable record(s), e.g. {bad.source} "
                f"{bad.location}: {bad.reason} {bad.detail}"
            )
    return texts


def build_eval_index(
    store: ObjectStore, key: str, cfg: DecontamConfig, s3: S3Options | None = None
) -> EvalIndex:
    """Read every evaluation set once and write the n-gram index to ``key``."""
    index = index_texts({s.name: read_eval_texts(s, s3) for s in cfg.eval_sets}, cfg.ngram)
    store.put_bytes(key, index.to_bytes())
    return index


# ---------------------------------------------------------------- the corpus side


@dataclass
class Contamination:
    """What one document shares with the evaluation data: window starts (in units) and their set masks."""

    starts: np.ndarray
    masks: np.ndarray
    units: list[str] | list[bytes]

    def ngram_text(self, start: int, n: int) -> str:
        words = self.units[start : start + n]
        return " ".join(w.decode() if isinstance(w, bytes) else w for w in words)

    def set_names(self, names: tuple[str, ...]) -> list[str]:
        combined = int(np.bitwise_or.reduce(self.masks))
        return [name for bit, name in enumerate(names) if combined >> bit & 1]


def find_contamination(text: str, index: EvalIndex, hasher: UnitHasher) -> Contamination | None:
    keys = unit_keys(text)
    found = index.lookup(window_hashes(hasher(keys), index.ngram))
    hit = np.flatnonzero(found)
    return Contamination(hit, found[hit], keys) if len(hit) else None


def cut_spans(text: str, starts: np.ndarray, n: int) -> tuple[str, int]:
    """``text`` without the characters of the matched windows (unit ``s`` .. ``s+n-1`` for each start)."""
    spans = [m.span() for m in _UNIT_RE.finditer(text)]  # one per unit unless folding changed the text
    if len(spans) != len(units(text)):
        spans = _folded_spans(text)
    covered = np.zeros(len(spans) + 1, dtype=np.int64)
    np.add.at(covered, starts, 1)
    np.add.at(covered, starts + n, -1)
    inside = np.cumsum(covered[:-1]) > 0
    pieces, pos, cut = [], 0, 0
    i = 0
    while i < len(spans):
        if not inside[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(spans) and inside[j + 1]:
            j += 1
        start, end = spans[i][0], spans[j][1]
        pieces.append(text[pos:start])
        cut += 1
        pos, i = end, j + 1
    pieces.append(text[pos:])
    return "".join(pieces), cut


def _folded_spans(text: str) -> list[tuple[int, int]]:
    """Spans of the units of ``text`` when folding changes the unit count (rare: ligatures, full-width
    forms): each character is folded alone, so every folded unit maps back to the characters it came from."""
    owner: list[int] = []
    folded = []
    for i, ch in enumerate(text):
        f = _fold(ch)
        folded.append(f)
        owner += [i] * len(f)
    return [(owner[a], owner[b - 1] + 1) for a, b in (m.span() for m in _UNIT_RE.finditer("".join(folded)))]


def decontam_batch(
    records: list[Record], index: EvalIndex, cfg: DecontamConfig, hasher: UnitHasher, matches: Counter[str]
) -> tuple[list[Record], StageStats]:
    """Remove (or cut) contaminated documents; counts per eval set in ``stats.extra``, n-grams in ``matches``."""
    stats = StageStats(stage="decontam", docs_in=len(records))
    out: list[Record] = []
    for rec in records:
        stats.bytes_in += (nbytes := len(rec.text.encode("utf-8", "surrogatepass")))
        found = find_contamination(rec.text, index, hasher)
        if found is not None:
            for name in found.set_names(index.names):
                stats.extra[f"contaminated.{name}"] = stats.extra.get(f"contaminated.{name}", 0) + 1
            for start, mask in zip(found.starts[:20].tolist(), found.masks[:20].tolist(), strict=True):
                sets = ",".join(n for b, n in enumerate(index.names) if mask >> b & 1)
                matches[f"{sets}\t{found.ngram_text(start, index.ngram)}"] += 1
            if cfg.mode == "remove":
                stats.drop("contaminated")
                tally_document(stats, "contaminated", rec.id, rec.text, rec.source, rec.meta, nbytes)
                continue
            text, cut = cut_spans(rec.text, found.starts, index.ngram)
            stats.extra["spans_cut"] = stats.extra.get("spans_cut", 0) + cut
            if len(text.strip()) < cfg.min_kept_chars:
                stats.drop("contaminated")
                tally_document(stats, "contaminated", rec.id, rec.text, rec.source, rec.meta, nbytes)
                continue
            rec = Record(rec.id, text, rec.source, rec.meta)
        out.append(rec)
        stats.bytes_out += (kept_bytes := len(rec.text.encode("utf-8", "surrogatepass")))
        tally_document(stats, None, rec.id, rec.text, rec.source, rec.meta, nbytes, kept_bytes)
        name = f"source.{provenance(rec.meta)[0]}"
        stats.extra[name] = stats.extra.get(name, 0) + 1
    stats.docs_out = len(out)
    return out, stats


def run_decontam_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, index_key: str, cfg: DecontamConfig
) -> StageStats:
    """Decontaminate one part against the index at ``index_key`` (skipped when its marker exists)."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    eval_index = EvalIndex.from_bytes(store.get_bytes(index_key))
    hasher, matches = UnitHasher(), Counter[str]()
    stats = StageStats(stage="decontam")
    kept: list[Record] = []
    for batch in iter_part_batches(store, in_folder, index):
        out, batch_stats = decontam_batch(batch, eval_index, cfg, hasher, matches)
        kept += out
        stats.merge(batch_stats)
    for name in eval_index.names:
        stats.extra.setdefault(f"contaminated.{name}", 0)
    report = [
        {"sets": key.split("\t")[0].split(","), "ngram": key.split("\t")[1], "docs": count}
        for key, count in matches.most_common(MATCH_EXAMPLES_PER_PART)
    ]
    store.put_bytes(f"{out_folder}/{part_name(index)}.matches.json", json.dumps(report).encode())
    write_part(store, out_folder, index, kept, stats)
    return stats


def merge_reports(
    store: ObjectStore, folder: str, num_parts: int, index_key: str, key: str
) -> dict[str, Any]:
    """One report of the whole stage: the eval sets read, and the most matched n-grams with document counts."""
    index = EvalIndex.from_bytes(store.get_bytes(index_key))
    total: Counter[tuple[str, str]] = Counter()
    for rows in store.map(
        lambda i: json.loads(store.get_bytes(f"{folder}/{part_name(i)}.matches.json")), range(num_parts)
    ):
        for row in rows:
            total[(",".join(row["sets"]), row["ngram"])] += int(row["docs"])
    report = {
        "ngram": index.ngram,
        "eval_sets": {
            n: {"texts": index.texts.get(n, 0), "too_short": index.too_short.get(n, 0)} for n in index.names
        },
        "eval_ngrams": len(index.hashes),
        "matched_ngrams": [
            {"sets": sets.split(","), "ngram": ngram, "docs": docs}
            for (sets, ngram), docs in total.most_common(MATCH_EXAMPLES_PER_PART)
        ],
    }
    store.put_bytes(key, json.dumps(report, ensure_ascii=False, indent=1).encode())
    return report
