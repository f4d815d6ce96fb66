"""Corpus-wide boilerplate lines: counted once per document across parts, merged into a sorted uint64 .npy,
removed by clean from every document where they repeat, kept where they are unique or under the threshold."""

from __future__ import annotations

import io
import random
from collections import Counter

import numpy as np
import pytest

from pipeline.clean.boilerplate import (
    MERGE_BUDGET_BYTES,
    boilerplate_threshold,
    count_lines_part,
    counts_to_array,
    load_boilerplate,
    merge_boilerplate,
    merge_boilerplate_range,
    run_boilerplate_count_part,
)
from pipeline.clean.config import BoilerplateConfig, CleanConfig, QualityConfig
from pipeline.clean.normalize import line_hash
from pipeline.clean.stage import run_clean_part
from pipeline.records import Record, read_part, write_part
from pipeline.storage import FileStore
from pipeline.units.hashranges import HEAD_BYTES, fences_of, join_ranges, put_table
from pipeline.units.protocol import StageStats, finish_unit, put_npy, read_unit_stats
from tests.fixtures.counting_store import counting
from tests.kernels import needs_lines, require

WORD_TEXT = "river garden morning village teacher window market winter summer letter evening station"
WORDS = WORD_TEXT.split()
FOOTER = "Copyright 2024 Example Corp. All rights reserved."
NAV = "Home | About us | Contact | Privacy policy"
RARE = "Subscribe to our newsletter for weekly updates."  # in 3 docs only: under the threshold
CFG = CleanConfig(
    boilerplate=BoilerplateConfig(min_docs=5, min_line_chars=20), quality=QualityConfig(enabled=False)
)


def body(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(10)) + f" {seed}-{k}." for k in range(4)]


def corpus() -> list[list[Record]]:
    """Two parts, 12 docs: FOOTER in 10 (twice in one), NAV (with CRLF and padding) in 6, RARE in 3."""
    docs = []
    for i in range(12):
        lines = body(i)
        if i < 10:
            lines.append(FOOTER)
        if i == 0:
            lines.insert(0, FOOTER)
        if i % 2 == 0:
            lines.insert(1, "   " + NAV + "  ")
        if i < 3:
            lines.insert(2, RARE)
        sep = "\r\n" if i == 4 else "\n"
        docs.append(Record(f"d{i}", sep.join(lines), "src"))
    return [docs[:7], docs[7:]]


def test_count_lines_counts_each_document_once():
    counts = count_lines_part(corpus()[0], CFG)
    assert counts[line_hash(FOOTER)] == 7  # doc 0 holds it twice
    assert counts[line_hash(NAV)] == 4  # leading/trailing spaces and CRLF do not matter
    assert counts[line_hash(RARE)] == 3
    short = CleanConfig(boilerplate=BoilerplateConfig(min_line_chars=60))
    assert line_hash(FOOTER) not in count_lines_part(corpus()[0], short)


def test_threshold_uses_min_docs_and_fraction():
    cfg = CleanConfig(boilerplate=BoilerplateConfig(min_docs=5, min_fraction=0.01))
    assert boilerplate_threshold(100, cfg) == 5
    assert boilerplate_threshold(10_000, cfg) == 100


def test_boilerplate_removed_where_it_repeats_and_kept_where_unique(store):
    parts = corpus()
    for index, records in enumerate(parts):
        write_part(store, "ingest", index, records, StageStats(stage="ingest"))
        run_boilerplate_count_part(store, "ingest", "bp-counts", index, CFG)
    assert merge_boilerplate(store, "bp-counts", 2, CFG, "bp/boilerplate.npy") == 2

    array = np.load(io.BytesIO(store.get_bytes("bp/boilerplate.npy")), allow_pickle=False)
    assert array.dtype == np.uint64 and array.ndim == 1 and list(array) == sorted(array)
    assert load_boilerplate(store, "bp/boilerplate.npy") == {line_hash(FOOTER), line_hash(NAV)}

    stats = [run_clean_part(store, "ingest", "clean", i, CFG, "bp/boilerplate.npy") for i in range(2)]
    cleaned = {r.id: r.text for i in range(2) for r in read_part(store, "clean", i)}
    assert len(cleaned) == 12
    for i, text in enumerate(cleaned.values()):
        assert FOOTER not in text and NAV not in text
        assert all(line in text for line in body(i))  # unique lines kept
        assert (RARE in text) == (i < 3)
    assert sum(s.extra["boilerplate_lines_removed"] for s in stats) == 11 + 6
    assert sum(s.extra["docs_with_boilerplate"] for s in stats) == 11  # FOOTER in 0-9, NAV also in 10


def test_reruns_skip_done_units(store):
    parts = corpus()
    for index, records in enumerate(parts):
        write_part(store, "ingest", index, records, StageStats(stage="ingest"))
        first = run_boilerplate_count_part(store, "ingest", "bp-counts", index, CFG)
        store.delete(f"ingest/part-{index:05d}.parquet")
        again = run_boilerplate_count_part(store, "ingest", "bp-counts", index, CFG)
        assert again.to_json() == first.to_json() and first.docs_in == len(records)
    assert merge_boilerplate(store, "bp-counts", 2, CFG, "bp.npy") == 2
    store.delete("bp-counts/part-00000.npy")  # merged already: not read again
    assert merge_boilerplate(store, "bp-counts", 2, CFG, "bp.npy") == 2


def test_merge_refuses_missing_parts(store):
    write_part(store, "ingest", 0, corpus()[0], StageStats(stage="ingest"))
    run_boilerplate_count_part(store, "ingest", "bp-counts", 0, CFG)
    with pytest.raises(RuntimeError, match="part-00001"):
        merge_boilerplate(store, "bp-counts", 2, CFG, "bp.npy")


def _random_counts(
    store, parts: int, seed: int = 3, older: tuple[int, ...] = (), own_lines: int = 2000
) -> dict[int, int]:
    """Parts of random line hashes, some shared by many parts; returns the true document counts. The parts in
    ``older`` are written as a version before the hash tables did (a 2 x n array beside its fences)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64)
    total: Counter[int] = Counter()
    for index in range(parts):
        own = rng.integers(0, 2**64 - 1, size=own_lines, dtype=np.uint64)
        counts = {
            int(h): int(rng.integers(1, 4)) for h in np.concatenate([own, shared[rng.random(300) < 0.5]])
        }
        total.update(counts)
        array = counts_to_array(counts)
        name = f"bp-counts/part-{index:05d}"
        if index in older:
            put_npy(store, f"{name}.npy", array)
            put_npy(store, f"{name}.fences.npy", fences_of(array[0]))
        else:
            put_table(store, f"{name}.npy", np.ascontiguousarray(array.T))
        finish_unit(store, name, StageStats(stage="bp", docs_in=int(array[1].sum())))
    return dict(total)


def _spread_merge(
    store, parts: int, cfg: CleanConfig, ranges: int, budget: int = MERGE_BUDGET_BYTES
) -> bytes:
    """The merge as a build spreads it: a task per range of the hashes, then the ranges joined."""
    folder = f"bp-ranges-{ranges}"
    for index in range(parts):  # each range reads every part's counts: here, a copy per number of ranges
        for ext in ("npy", "done", "stats.json"):
            store.put_bytes(
                f"{folder}/part-{index:05d}.{ext}", store.get_bytes(f"bp-counts/part-{index:05d}.{ext}")
            )
    docs = sum(read_unit_stats(store, f"bp-counts/part-{i:05d}").docs_in for i in range(parts))
    found = [
        merge_boilerplate_range(store, folder, parts, cfg, r, ranges, docs, budget) for r in range(ranges)
    ]
    assert join_ranges(store, folder, ranges, f"{folder}.npy") == sum(found)
    return store.get_bytes(f"{folder}.npy")


def test_a_merge_in_hash_ranges_keeps_exactly_the_lines_over_the_threshold(store):
    """A small budget splits the merge into runs of fences, each read from every part by ranged gets; split over
    1, 2, 3 or 7 tasks by range of the hashes, joined, it writes byte for byte what one process writes; the set
    equals the one-shot answer computed here, whatever the budget."""
    true = _random_counts(store, parts=6)
    cfg = CleanConfig(boilerplate=BoilerplateConfig(min_docs=6))
    expected = sorted(h for h, docs in true.items() if docs >= 6)
    assert 50 < len(expected) < 300
    for budget, key in ((32 * 1024, "small.npy"), (1 << 40, "large.npy")):
        assert merge_boilerplate(store, "bp-counts", 6, cfg, key, budget_bytes=budget) == len(expected)
        assert np.load(io.BytesIO(store.get_bytes(key))).tolist() == expected
    whole = store.get_bytes("large.npy")
    assert store.get_bytes("small.npy") == whole
    for ranges in (1, 2, 3, 7):
        assert _spread_merge(store, 6, cfg, ranges, budget=16 * 1024) == whole, ranges


def test_counts_written_by_an_older_version_merge_to_the_same_bytes(tmp_path):
    """Parts counted before the hash tables (a 2 x n array, read whole) and parts counted now, mixed: the merge,
    in one process or by ranges, writes the bytes that all-new parts give."""
    cfg = CleanConfig(boilerplate=BoilerplateConfig(min_docs=6))
    new, old = FileStore(tmp_path / "new"), FileStore(tmp_path / "old")
    assert _random_counts(new, parts=5) == _random_counts(old, parts=5, older=(0, 2, 3))
    merge_boilerplate(new, "bp-counts", 5, cfg, "bp.npy")
    merge_boilerplate(old, "bp-counts", 5, cfg, "bp.npy")
    assert new.get_bytes("bp.npy") == old.get_bytes("bp.npy")
    assert _spread_merge(old, 5, cfg, 3) == new.get_bytes("bp.npy")


def test_a_range_of_the_merge_reads_its_slice_of_each_part(store):
    """Each of 7 ranges reads every part's head and its own rows, not the whole of the counts: far less than the
    parts' files (counted on a folder and on S3), two calls a part; a part under 64 KiB comes in one call."""
    _random_counts(store, parts=4, seed=8, own_lines=30_000)
    cfg = CleanConfig(boilerplate=BoilerplateConfig(min_docs=3))
    files = sum(store.stat(f"bp-counts/part-{i:05d}.npy").size for i in range(4))
    for r in range(7):
        counted = counting(store)
        merge_boilerplate_range(counted, "bp-counts", 4, cfg, r, 7, docs_total=100)
        assert len(counted.reads) == 4 * 2  # each part: its head, then its other rows of the range
        assert sum(counted.reads) < min(files / 3, 4 * HEAD_BYTES + files / 7 + files / 50), (
            counted.reads,
            files,
        )
    small = FileStore(store.root / "small") if isinstance(store, FileStore) else store.child("small")
    _random_counts(small, parts=4, seed=8)  # 2,000 lines a part: 36 KB
    counted = counting(small)
    merge_boilerplate_range(counted, "bp-counts", 4, cfg, 3, 7, docs_total=100)
    assert len(counted.reads) == 4


def _line_cases() -> list[str]:
    """Documents whose lines test every edge of the line rules: Python's whitespace at both ends of a line
    (NBSP, ideographic space, U+001C-U+001F, NEL, U+2028), lines of exactly the minimum length in multi-byte
    characters, empty lines and documents, CRLF, boilerplate at the start, the end and twice in a row, and
    random lines of every length around xxhash64's 4-, 8- and 32-byte steps."""
    rng = random.Random(5)
    edges = ["\xa0", "\u3000", "\x1c", "\x1f", "\x85", "\u2028", "\t", " ", "\r", "\x0b"]
    lines = [
        FOOTER,
        NAV,
        RARE,
        "ééééééééééééééééééé",
        "中文中文中文中文中文中文中文中文中文中",
        "x" * 19,
        "x" * 20,
    ]
    lines += ["".join(rng.choice("ab é中\U0001f600.") for _ in range(n)) for n in range(0, 70)]
    docs = ["", "\n", "\n\n", FOOTER, FOOTER + "\n" + FOOTER, "\n" + FOOTER + "\n", NAV + "\r\n" + NAV]
    for _ in range(300):
        picked = [rng.choice(lines) for _ in range(rng.randrange(1, 8))]
        docs.append(
            "\n".join(
                rng.choice(edges) * rng.randrange(3) + p + rng.choice(edges) * rng.randrange(3)
                for p in picked
            )
        )
    return docs + [" ".join(r.text for r in part) for part in corpus()]


@needs_lines
def test_compiled_line_keys_and_removal_are_the_python_rules(monkeypatch: pytest.MonkeyPatch):
    """``pipeline/clean/_lines.c`` (xxhash64, str.strip()'s whitespace, lengths in code points) gives the keys
    and removals of the Python lines on every edge case; a text with a lone surrogate goes to the Python path;
    where a C compiler was found at install (CI's machine has one) it is built."""

    from pipeline.clean import boilerplate as bp_module
    from pipeline.clean import normalize

    kernel = normalize.lines_kernel
    require(kernel, "pipeline.clean._lines")
    docs = _line_cases()
    boilerplate = frozenset(line_hash(line) for line in (FOOTER, NAV, "ééééééééééééééééééé", "x" * 20))
    for min_chars in (0, 1, 19, 20):
        compiled = [
            (normalize.remove_boilerplate(d, boilerplate, min_chars), bp_module.doc_line_keys(d, min_chars))
            for d in docs
        ]
        assert kernel.line_hashes("a\ud800b", min_chars) is None
        assert kernel.remove_lines("a\ud800b", normalize.sorted_keys(boilerplate), min_chars) is None
        with monkeypatch.context() as m:
            m.setattr(normalize, "lines_kernel", None)
            python = [
                (
                    normalize.remove_boilerplate(d, boilerplate, min_chars),
                    bp_module.doc_line_keys(d, min_chars),
                )
                for d in docs
            ]
            assert normalize.remove_boilerplate("a\ud800b\n" + FOOTER, boilerplate, 20) == ("a\ud800b", 1)
        assert compiled == python, min_chars
        assert sum(removed for (_, removed), _ in compiled) > 50  # the cases do remove lines
    keys = [np.frombuffer(bp_module.doc_line_keys(d, 20), np.uint64).tolist() for d in docs]
    assert keys == [sorted(bp_module.doc_line_hashes(d, 20)) for d in docs]


def test_whitespace_after_removal_needs_only_blank_runs_and_ends_on_normalised_text():
    """Clean normalises again after taking lines out, without the Unicode-space pass: on normalised text
    (ingest's), removing whole lines can only leave blank-line runs and blank ends, so the light pass gives
    what the full one gives."""
    from pipeline.clean.normalize import normalize_text, normalize_whitespace, remove_boilerplate

    rng = random.Random(9)
    pieces = [
        FOOTER,
        NAV,
        "a\u00a0b\u2003c",
        "x\u2028y",
        "trailing  ",
        "\r\nz",
        "",
        "",
        "\t",
        "ünï\u3000cödé",
    ]
    cfg = CleanConfig()
    boilerplate = frozenset({line_hash(FOOTER), line_hash(NAV)})
    removed = 0
    for _ in range(400):
        raw = "\n".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        text = normalize_text(raw, cfg, Counter())
        out, n = remove_boilerplate(text, boilerplate, 20)
        removed += n
        full = normalize_whitespace(out, cfg.max_blank_lines)
        assert normalize_whitespace(out, cfg.max_blank_lines, unicode_spaces=False) == full, raw
    assert removed > 100


def test_loading_the_set_hands_its_sorted_array_to_the_removal(tmp_path):
    """The merge's sorted array serves the compiled removal as it is (no sort per part), and the lines out are
    the same as with a set the removal sorts itself."""
    from pipeline.clean import normalize

    store = FileStore(tmp_path)
    keys = np.array(sorted({line_hash(FOOTER), line_hash(NAV), 7, 2**63}), dtype=np.uint64)
    store.put_bytes("bp.npy", (lambda b: (np.save(b, keys), b.getvalue())[1])(io.BytesIO()))
    loaded = load_boilerplate(store, "bp.npy")
    assert normalize.sorted_keys(loaded) is normalize._last_keys[1]
    assert normalize.sorted_keys(loaded).tolist() == keys.tolist()
    text = "\n".join([FOOTER, "kept line of text here", NAV])
    assert normalize.remove_boilerplate(text, loaded, 20) == normalize.remove_boilerplate(
        text, frozenset(loaded), 20
    )
    assert normalize.remove_boilerplate(text, loaded, 20)[1] == 2
