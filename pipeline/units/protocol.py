"""The unit protocol, spelled once: every unit of work writes its outputs, then its stats, then its marker.

A *unit* is a key prefix ``U`` in a store (``work/clean/part-00003``, ``work/near/edges/p-00001``): its outputs
are ``U.<suffix>`` or ``U/...`` objects, then ``U.stats.json`` (its counted :class:`StageStats`), then
``U.done`` (empty, written last). A reader never reads a unit without its marker, and a rerun skips every unit
that has one (:func:`unit_stats` returns its stored stats), so a crash between two writes costs only a redo of
that unit. A step over a whole folder marks it with ``_SUCCESS`` once every unit in it is done
(:func:`mark_stage_success`), or, for a global step, after its outputs and ``stats.json``
(:func:`finish_folder`).

Arrays hand off between steps as ``.npy``/``.npz`` loaded with ``allow_pickle=False`` (no pickle anywhere).
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import UnitDamaged, UnitNotDone
from pipeline.storage import ObjectInfo, ObjectStore
from pipeline.units.proofs import bytes_digest, check_outputs, folder_listing, record_outputs, unit_listing

log = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
CACHE_ENTRY = "cache_entry"  # in a unit restored from the unit cache (pipeline.units.cache): the entry's key
# The build run computing units in this context (``flows/build/context.run_unit``): each marker written records it,
# so a unit this run computed before its steps ran again is not counted as reused.
WRITER: contextvars.ContextVar[str] = contextvars.ContextVar("pileworks_unit_writer", default="")
_PART_OUTPUT = re.compile(r"^(.*part-\d{5})([./].+)$")  # a part unit's output: <unit>.<suffix> or <unit>/...
KEPT = ""  # the outcome of a tallied document that was not dropped
UNKNOWN_LANGUAGE = "und"  # a document whose language was not identified (ISO 639-2 "undetermined")


EXAMPLES_PER_REASON = 3  # documents kept as examples of each drop reason (the first by id)
EXAMPLE_CHARS = 160  # characters of an example's text


def snippet(text: str, limit: int = EXAMPLE_CHARS) -> str:
    """The start of ``text`` on one line (whitespace runs as one space), at most ``limit`` characters."""
    return " ".join(text[: limit * 4].split())[:limit]


@dataclass
class StageStats:
    """Counted outcome of one stage over one or more parts. Every drop has a reason.

    ``tally`` breaks the documents down where a stage records it (the data card's waterfall): per (outcome,
    source name, language), ``[documents, bytes in, bytes out]``; the outcome is a drop reason, or ``KEPT``
    for the documents that go on (``bytes out`` < ``bytes in`` when their text was trimmed). ``examples``: per
    drop reason, the first ``EXAMPLES_PER_REASON`` dropped documents by id (id, source, source name,
    language, the start of the text), so a merge in any order keeps the same ones."""

    stage: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)
    tally: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n

    def count_doc(
        self, outcome: str, source: str, language: str, nbytes_in: int, nbytes_out: int = 0
    ) -> None:
        """Tally one document of ``source``/``language``: ``outcome`` is its drop reason or ``KEPT`` (the drop
        itself is counted by :meth:`drop`)."""
        row = self.tally.get((outcome, source, language or UNKNOWN_LANGUAGE))
        if row is None:
            self.tally[(outcome, source, language or UNKNOWN_LANGUAGE)] = [1, nbytes_in, nbytes_out]
        else:
            row[0] += 1
            row[1] += nbytes_in
            row[2] += nbytes_out

    def wants_example(self, reason: str, doc_id: str) -> bool:
        """Whether a document dropped for ``reason`` would be one of its examples (cheap: build it only then)."""
        have = self.examples.get(reason, [])
        return len(have) < EXAMPLES_PER_REASON or doc_id < have[-1]["id"]

    def add_example(self, reason: str, example: dict[str, str]) -> None:
        self._merge_examples(reason, [example])

    def _merge_examples(self, reason: str, new: list[dict[str, str]]) -> None:
        merged = {e["id"]: e for e in [*self.examples.get(reason, ()), *new]}
        self.examples[reason] = [merged[k] for k in sorted(merged)[:EXAMPLES_PER_REASON]]

    def merge(self, other: StageStats) -> StageStats:
        """Add ``other`` into self (numeric ``extra`` values are summed, others kept from the first)."""
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.dropped.update(other.dropped)
        for key, value in other.extra.items():
            mine = self.extra.get(key)
            if isinstance(value, (int, float)) and isinstance(mine, (int, float)):
                self.extra[key] = mine + value
            elif key not in self.extra:
                self.extra[key] = value
        for group, (docs, b_in, b_out) in other.tally.items():
            row = self.tally.setdefault(group, [0, 0, 0])
            row[0], row[1], row[2] = row[0] + docs, row[1] + b_in, row[2] + b_out
        for reason, examples in other.examples.items():
            self._merge_examples(reason, examples)
        return self

    def to_json(self) -> dict[str, Any]:
        out = {
            "stage": self.stage,
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "dropped": dict(sorted(self.dropped.items())),
            "extra": self.extra,
        }
        if self.tally:  # left out when empty: the stats of steps that record none stay as they were
            out["tally"] = [[*group, *self.tally[group]] for group in sorted(self.tally)]
        if self.examples:
            out["examples"] = {reason: self.examples[reason] for reason in sorted(self.examples)}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageStats:
        """Stats as :meth:`to_json` wrote them; stats written before ``tally``/``examples`` existed read as empty."""
        return cls(
            stage=data["stage"],
            docs_in=int(data["docs_in"]),
            docs_out=int(data["docs_out"]),
            bytes_in=int(data["bytes_in"]),
            bytes_out=int(data["bytes_out"]),
            dropped=Counter(data.get("dropped", {})),
            extra=dict(data.get("extra", {})),
            tally={
                (str(o), str(s), str(lang)): [int(d), int(bi), int(bo)]
                for o, s, lang, d, bi, bo in data.get("tally", [])
            },
            examples={str(r): [dict(e) for e in ex] for r, ex in data.get("examples", {}).items()},
        )


# ---------------------------------------------------------------- unit names


def part_name(index: int) -> str:
    if index < 0:
        raise ValueError(f"part index must be >= 0, got {index}")
    return f"part-{index:05d}"


def folder_key(folder: str, name: str) -> str:
    """``folder/name``, or ``name`` at the store root (``folder == ""``)."""
    return f"{folder}/{name}" if folder else name


def part_unit(folder: str, index: int) -> str:
    """The unit of part ``index`` in ``folder``: ``folder/part-NNNNN``."""
    return folder_key(folder, part_name(index))


# ---------------------------------------------------------------- one unit: outputs, stats, marker


def stats_bytes(stats: StageStats) -> bytes:
    return json.dumps(stats.to_json(), indent=1).encode()


def finish_unit(store: ObjectStore, unit: str, stats: StageStats) -> StageStats:
    """Stats, then the marker, after the unit's outputs: a unit without its marker is never read and is redone.
    The marker holds the stats too and what proves the outputs' bytes (``pipeline.units.proofs``), so a rerun
    reads one object to skip the unit."""
    store.put_bytes(f"{unit}.stats.json", stats_bytes(stats))
    outputs = [i for k, i in unit_listing(store, unit).items() if k not in _own_files(unit)]
    marker: dict[str, Any] = {"stats": stats.to_json(), "outputs": record_outputs(store, unit, outputs)}
    if writer := WRITER.get():
        marker["run"] = writer
    store.put_bytes(f"{unit}.done", json.dumps(marker, indent=1).encode())
    return stats


def _own_files(unit: str) -> tuple[str, str]:
    return f"{unit}.done", f"{unit}.stats.json"


def unit_done(store: ObjectStore, unit: str) -> bool:
    return store.exists(f"{unit}.done")


def unit_stats(store: ObjectStore, unit: str) -> StageStats | None:
    """The stored stats of a finished unit whose outputs are intact (a rerun returns these and skips the
    work), else None: a unit whose outputs no longer match its marker loses the marker, with one warning
    naming the file, and is recomputed. One listing and one read, as many round trips as a HEAD and a read."""
    marker = intact_marker(store, unit)
    return None if marker is None else StageStats.from_json(marker["stats"])


def intact_marker(store: ObjectStore, unit: str) -> dict[str, Any] | None:
    """:func:`unit_stats`'s check, returning the whole marker (its ``stats``, ``outputs``, the ``run`` that
    wrote it)."""
    listing = unit_listing(store, unit)
    marker = listing.get(f"{unit}.done")
    if marker is None:
        return None
    if marker.size == 0:  # a marker written before markers recorded their outputs: nothing to check
        return {"stats": read_unit_stats(store, unit).to_json()}
    data: dict[str, Any] = json.loads(store.get_bytes(marker.key))
    if not _intact(store, unit, data, listing):
        return None
    return data


def _intact(store: ObjectStore, base: str, data: dict[str, Any], listing: dict[str, ObjectInfo]) -> bool:
    """Whether the outputs recorded in ``data`` (a marker) match ``listing``; a damaged unit loses its marker
    (``base``'s ``.done``, or ``base/_SUCCESS`` for a folder) with one warning line naming the file."""
    marker_key = f"{base}.done" if f"{base}.done" in listing else f"{base}/{SUCCESS}"
    check = check_outputs(store, base, data.get("outputs", {}), listing)
    if check.damaged is not None:
        log.warning(
            "%s %s: recomputing its unit (its marker %s no longer matches)",
            store.uri_of(check.damaged),
            check.reason,
            marker_key,
        )
        store.delete(marker_key)
        return False
    if (
        check.refreshed is not None
    ):  # copied or touched, same bytes: record the new tags, checked free next time
        store.put_bytes(marker_key, json.dumps({**data, "outputs": check.refreshed}, indent=1).encode())
    return True


def read_unit_stats(store: ObjectStore, unit: str) -> StageStats:
    return StageStats.from_json(json.loads(store.get_bytes(f"{unit}.stats.json")))


def require_done(store: ObjectStore, unit: str, step: str = "the step that writes it") -> None:
    if not unit_done(store, unit):
        raise UnitNotDone(f"{store.uri_of(unit)} has no .done marker: run {step} first")


def done_stats_or_fail(store: ObjectStore, unit: str, step: str = "the previous step") -> StageStats:
    stats = unit_stats(store, unit)
    if stats is None:
        raise UnitNotDone(f"{store.uri_of(unit)} is not done: run {step} first")
    return stats


# ---------------------------------------------------------------- parts of a folder, and _SUCCESS


def part_done(store: ObjectStore, folder: str, index: int) -> bool:
    return unit_done(store, part_unit(folder, index))


def done_part_stats(store: ObjectStore, folder: str, index: int) -> StageStats | None:
    """:func:`unit_stats` of part ``index`` of ``folder``: its stats when it is done and intact, else None."""
    return unit_stats(store, part_unit(folder, index))


def read_part_stats(store: ObjectStore, folder: str, index: int) -> StageStats:
    return read_unit_stats(store, part_unit(folder, index))


def merged_stats(store: ObjectStore, folder: str, num_parts: int, stage: str) -> StageStats:
    total = StageStats(stage=stage)
    for stats in store.map(lambda i: read_part_stats(store, folder, i), range(num_parts)):
        total.merge(stats)
    return total


def mark_stage_success(store: ObjectStore, folder: str, num_parts: int, checked: bool = False) -> None:
    """``_SUCCESS`` once every part of the folder has its marker (refuses otherwise). ``checked``: the caller
    knows they have (a build's flow, from the results of the tasks that finished every unit): not looked up
    again, one call per part on S3."""
    done = (
        [True] * num_parts if checked else store.map(lambda i: part_done(store, folder, i), range(num_parts))
    )
    missing = [i for i, ok in enumerate(done) if not ok]
    if missing:
        raise RuntimeError(f"{folder}: parts {missing[:10]} are not done; refusing to write {SUCCESS}")
    store.put_bytes(f"{folder}/{SUCCESS}", json.dumps({"parts": num_parts}).encode())


def stage_succeeded(store: ObjectStore, folder: str) -> bool:
    return store.exists(f"{folder}/{SUCCESS}")


def finish_folder(
    store: ObjectStore, folder: str, stats: StageStats, stats_name: str = "stats.json"
) -> StageStats:
    """A global step's end: ``folder/<stats_name>``, then ``folder/_SUCCESS``, after its outputs. ``_SUCCESS``
    records the outputs under ``folder`` as a unit's marker does (``pipeline.units.proofs``)."""
    store.put_bytes(f"{folder}/{stats_name}", stats_bytes(stats))
    own = (f"{folder}/{stats_name}", f"{folder}/{SUCCESS}")
    outputs = [i for k, i in folder_listing(store, folder).items() if k not in own]
    marker = {"stats": stats.to_json(), "outputs": record_outputs(store, folder, outputs)}
    store.put_bytes(f"{folder}/{SUCCESS}", json.dumps(marker, indent=1).encode())
    return stats


def folder_stats(store: ObjectStore, folder: str, stats_name: str = "stats.json") -> StageStats | None:
    """The stats of a finished global step (see :func:`finish_folder`) whose outputs are intact, else None (a
    damaged output is named in one warning and the step reruns)."""
    listing = folder_listing(store, folder)
    marker = listing.get(f"{folder}/{SUCCESS}")
    if marker is None:
        return None
    data = json.loads(store.get_bytes(marker.key)) if marker.size else {}
    if "outputs" not in data:  # written before _SUCCESS recorded its outputs
        return StageStats.from_json(json.loads(store.get_bytes(f"{folder}/{stats_name}")))
    if not _intact(store, folder, data, listing):
        return None
    return StageStats.from_json(data["stats"])


def require_success(store: ObjectStore, folder: str, step: str) -> None:
    """Refuse to read a global step's outputs before its ``_SUCCESS`` (``step`` names what writes it)."""
    if not stage_succeeded(store, folder):
        raise UnitNotDone(f"{store.uri_of(folder)} has no {SUCCESS}: run {step} first")


# ---------------------------------------------------------------- reads checked by the consumer


def _marker_of(store: ObjectStore, key: str) -> tuple[str, str, dict[str, Any]] | None:
    """(marker key, the output's name in the marker's record, the marker) of the unit that wrote ``key``: a part
    unit's ``.done``, else the ``_SUCCESS`` of the folder (or the folder above) of a global step; None when no
    marker records the output (written before markers did, or not a unit's output)."""
    candidates = []
    if (m := _PART_OUTPUT.match(key)) is not None:
        candidates.append((f"{m.group(1)}.done", m.group(2)))
    folder = key
    for _ in range(2):
        folder = folder.rpartition("/")[0]
        if folder:
            candidates.append((f"{folder}/{SUCCESS}", key[len(folder) :]))
    for marker_key, rel in candidates:
        try:
            raw = store.get_bytes(marker_key)
        except FileNotFoundError:
            continue
        data = json.loads(raw) if raw else {}
        if isinstance(data, dict) and rel in data.get("outputs", {}):
            return marker_key, rel, data
        if marker_key.endswith(".done"):
            return None  # the unit's own marker, from before markers recorded their outputs
    return None


def checked_bytes(store: ObjectStore, key: str) -> bytes:
    """The bytes of a unit's output, checked against the digest its marker records (xxh64, or the MD5 an S3
    ETag stands for). A mismatch (bit rot behind an unchanged mtime, a half-synced copy) is named in one warning;
    the marker goes, with the unit cache entry it was restored by, so the unit is recomputed rather than copied
    again, and :class:`UnitDamaged` tells the caller (a build reruns its steps: ``flows/build/flow.py``)."""
    found = _marker_of(store, key)
    data = store.get_bytes(key)
    if found is None:
        return data
    marker_key, rel, marker = found
    want = str(marker["outputs"][rel]["digest"])
    got = bytes_digest(data, want.split(":", 1)[0])
    if got == want:
        return data
    log.warning(
        "%s %s != %s recorded: recomputing its unit (its marker %s no longer matches)",
        store.uri_of(key),
        got,
        want,
        marker_key,
    )
    store.delete(marker_key)
    if entry := marker.get(CACHE_ENTRY):
        store.delete(str(entry))
    raise UnitDamaged(f"{store.uri_of(key)} does not match its marker's digest: its unit is recomputed", key)


# ---------------------------------------------------------------- arrays


def npy_bytes(array: np.ndarray) -> bytes:
    sink = io.BytesIO()
    np.save(sink, array, allow_pickle=False)
    return sink.getvalue()


def put_npy(store: ObjectStore, key: str, array: np.ndarray) -> None:
    store.put_bytes(key, npy_bytes(array))


def get_npy(store: ObjectStore, key: str) -> np.ndarray:
    """A unit's array, its bytes checked against its marker (:func:`checked_bytes`)."""
    return np.load(io.BytesIO(checked_bytes(store, key)), allow_pickle=False)


def put_npz(store: ObjectStore, key: str, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    store.put_bytes(key, buf.getvalue())


def get_npz(store: ObjectStore, key: str) -> dict[str, np.ndarray]:
    """A unit's arrays, their bytes checked against its marker (:func:`checked_bytes`)."""
    with np.load(io.BytesIO(checked_bytes(store, key)), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def packed_ranges(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive ``[lo, hi)`` ranges of items whose sizes add up to at most ``budget`` each (an item larger
    than the budget forms a range alone); always at least one range. Used to bound what one step holds at once."""
    out, lo, acc = [], 0, 0
    for i, size in enumerate(sizes):
        if acc and acc + size > budget:
            out.append((lo, i))
            lo, acc = i, 0
        acc += size
    out.append((lo, len(sizes)))
    return out
