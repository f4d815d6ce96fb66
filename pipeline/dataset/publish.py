"""Stage 5: token parts -> balanced shards -> a published dataset.

Pass 1 counts the tokens of every part per source name and split (on the workers, right after tokenizing:
:func:`run_split_count_part`). Those counts plan everything: each split is one token stream (sources sorted by
name, each source's documents in part order), cut into balanced shards (:func:`pipeline.dataset.shards.plan_shards`).

Pass 2 writes the shards. A :class:`Window` is a run of one split's shards, ``[first, stop)``, with the
:class:`Segment` s of the stream it covers (a source's tokens in one part); a window's writer reads only those
parts and starts where the stream reaches its first shard, mid-document if need be. Windows write the same
bytes whether one process writes every shard (:func:`write_shards`) or many workers each write some
(:func:`plan_windows`, :func:`run_window_unit`: a build's parallel pass, each window task a unit in the work
folder).

Publishing: :func:`dataset_manifest` lists the shards the window units wrote (:func:`window_results`); they are
copied under the immutable ``datasets/<name>/<dataset_id>/`` prefix and verified
(:func:`pipeline.dataset.manifest.copy_verified`), then :func:`commit_dataset` adds the tokenizer and the data card and
writes the manifest last. ``flows/build`` runs these steps as tasks.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import io
import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from pipeline.dataset.card import attach_card, build_card, card_bytes
from pipeline.dataset.manifest import (
    Manifest,
    TokenizerInfo,
    already_published,
    commit_manifest,
    dataset_prefix,
    upload_verified,
)
from pipeline.dataset.shards import (
    PROVENANCE_COLUMNS,
    SPLITS,
    ShardConfig,
    ShardInfo,
    ShardWriter,
    dtype_for_vocab,
    plan_shards,
    split_of,
)
from pipeline.sources import shard_runs
from pipeline.storage import ObjectStore, join_key, local_temp_prefix, sha256_bytes
from pipeline.tokenize.hf_files import hf_tokenizer_files
from pipeline.tokenize.stage import special_id
from pipeline.units.protocol import (
    StageStats,
    checked_bytes,
    finish_unit,
    part_unit,
    require_done,
    unit_stats,
)

# ---------------------------------------------------------------- token parts


def iter_token_batches(
    store: ObjectStore,
    folder: str,
    index: int,
    columns: Sequence[str] = ("id", "source", "location", "tokens"),
) -> Iterator[pa.RecordBatch]:
    unit = part_unit(folder, index)
    require_done(store, unit, "run_tokenize_part")
    pf = pq.ParquetFile(io.BytesIO(checked_bytes(store, f"{unit}.parquet")))
    yield from pf.iter_batches(batch_size=4096, columns=list(columns))


def _split_arrays(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    tokens = batch.column("tokens")
    offsets = tokens.offsets.to_numpy()
    return offsets - offsets[0], tokens.flatten().to_numpy()


# ---------------------------------------------------------------- pass 1: counts


def count_source_tokens(
    store: ObjectStore,
    folder: str,
    num_parts: int,
    shard_cfg: ShardConfig,
    counts_folder: str | None = None,
) -> dict[str, dict[str, int]]:
    """Tokens per source name and split (pass 1 of :func:`write_shards`). ``counts_folder``: where
    :func:`run_split_count_part` counted each part already (in the parallel tokenize pass); a part it has not
    counted is read here."""
    totals: dict[str, dict[str, int]] = {}
    for counted in part_counts(store, folder, num_parts, shard_cfg, counts_folder):
        for name, per_split in counted.items():
            per = totals.setdefault(name, dict.fromkeys(SPLITS, 0))
            for split, n in per_split.items():
                per[split] += n
    return totals


def part_counts(
    store: ObjectStore,
    folder: str,
    num_parts: int,
    shard_cfg: ShardConfig,
    counts_folder: str | None = None,
) -> list[dict[str, dict[str, int]]]:
    """Every part's tokens per source name and split, in part order (from ``counts_folder`` where counted)."""

    def counted(i: int) -> dict[str, dict[str, int]]:
        done = unit_stats(store, part_unit(counts_folder, i)) if counts_folder else None
        if done is not None and done.extra.get("split") == _split_rule(shard_cfg):
            return done.extra["source_tokens"]
        return part_source_tokens(store, folder, i, shard_cfg)

    return store.map(counted, range(num_parts))


def _split_rule(shard_cfg: ShardConfig) -> list[float | int]:
    return [shard_cfg.valid_fraction, shard_cfg.seed]


def part_source_tokens(
    store: ObjectStore, folder: str, index: int, shard_cfg: ShardConfig
) -> dict[str, dict[str, int]]:
    """Tokens per source name and split of one token part."""
    totals: dict[str, dict[str, int]] = {}
    for batch in iter_token_batches(store, folder, index, columns=("id", "tokens", "source_name")):
        offsets, _ = _split_arrays(batch)
        names = batch.column("source_name").to_pylist()
        ids = batch.column("id").to_pylist()
        for doc_id, name, n in zip(ids, names, np.diff(offsets).tolist(), strict=True):
            split = split_of(doc_id, shard_cfg.valid_fraction, shard_cfg.seed)
            per = totals.setdefault(name, dict.fromkeys(SPLITS, 0))
            per[split] += n
    return totals


def run_split_count_part(
    store: ObjectStore, token_folder: str, out_folder: str, index: int, shard_cfg: ShardConfig
) -> StageStats:
    """Count one token part's tokens per source name and split, as pass 1 of :func:`write_shards` would: a
    build runs it on the workers right after tokenizing the part, so the shard plan only adds these up.
    The counts are the unit's stats (``extra["source_tokens"]``, with the split rule they follow)."""
    unit = part_unit(out_folder, index)
    if (done := unit_stats(store, unit)) is not None:
        return done
    counted = part_source_tokens(store, token_folder, index, shard_cfg)
    tokens = sum(n for per in counted.values() for n in per.values())
    stats = StageStats(stage="split_count", extra={"tokens": tokens, "source_tokens": counted})
    stats.extra["split"] = _split_rule(shard_cfg)
    return finish_unit(store, unit, stats)


# ---------------------------------------------------------------- pass 2: windows of shards


@dataclass(frozen=True)
class Segment:
    """The tokens of source ``name`` in part ``part`` that belong to one split: ``[start, start + tokens)`` of
    the split's stream."""

    name: str
    part: int
    start: int
    tokens: int


@dataclass(frozen=True)
class Window:
    """Shards ``[first, stop)`` of ``split``, planned over the split's ``total`` tokens (``target`` per shard),
    and the segments of the stream they hold (in stream order)."""

    split: str
    total: int
    target: int
    first: int
    stop: int
    segments: tuple[Segment, ...]

    def sizes(self) -> list[int]:
        return plan_shards(self.total, self.target)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Window:
        return cls(**{**data, "segments": tuple(Segment(**s) for s in data["segments"])})


def split_streams(counts: Sequence[Mapping[str, Mapping[str, int]]]) -> dict[str, list[Segment]]:
    """Each split's token stream as segments: source names sorted, each in part order (empty ones left out)."""
    names = sorted({name for counted in counts for name in counted})
    streams: dict[str, list[Segment]] = {}
    for split in SPLITS:
        pos, segments = 0, []
        for name in names:
            for part, counted in enumerate(counts):
                n = counted.get(name, {}).get(split, 0)
                if n:
                    segments.append(Segment(name, part, pos, n))
                    pos += n
        streams[split] = segments
    return streams


def _task_of_shards(count: int, tasks: int) -> list[int]:
    """Which of ``tasks`` writes each of ``count`` shards: runs of neighbours, as even as the counts allow."""
    return [(2 * k + 1) * tasks // (2 * count) for k in range(count)]


def plan_windows(
    counts: Sequence[Mapping[str, Mapping[str, int]]], target: int, tasks: int
) -> list[list[Window]]:
    """Cut every split's shards into ``tasks`` runs of neighbours: one list of windows (one per split that has
    shards there) per task; tasks that get no shard are left out. A task's train and valid windows cover
    about the same parts, as both streams follow the parts in the same order."""
    plan: list[list[Window]] = [[] for _ in range(max(1, tasks))]
    for split, segments in split_streams(counts).items():
        total = sum(s.tokens for s in segments)
        if not total:
            continue
        sizes = plan_shards(total, target)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        starts, ends = [s.start for s in segments], [s.start + s.tokens for s in segments]
        owner = _task_of_shards(len(sizes), len(plan))
        for task in sorted(set(owner)):
            first, stop = owner.index(task), len(owner) - owner[::-1].index(task)
            lo, hi = bounds[first], bounds[stop]
            held = segments[bisect.bisect_right(ends, lo) : bisect.bisect_left(starts, hi)]
            plan[task].append(Window(split, total, target, first, stop, tuple(held)))
    return [windows for windows in plan if windows]


class _WindowFeed:
    """Feeds one window's writer from the parts it reads: keeps the tokens in ``[lo, hi)`` of the stream."""

    def __init__(self, window: Window, out_dir: Path, dtype: np.dtype):
        self.window = window
        all_sizes = window.sizes()
        self.bounds = np.concatenate([[0], np.cumsum(all_sizes)])
        self.lo, self.hi = int(self.bounds[window.first]), int(self.bounds[window.stop])
        sizes = all_sizes[window.first : window.stop]
        self.writer = ShardWriter(out_dir, window.split, sizes, dtype, window.first, self.lo)
        self.segments = {(s.name, s.part): s for s in window.segments}
        self.read: dict[tuple[str, int], int] = {}  # tokens of each segment seen so far

    def add(
        self,
        seg: Segment,
        lengths: np.ndarray,
        flat: np.ndarray,
        docs: Mapping[str, list],
        picked: np.ndarray,
    ) -> None:
        """The documents ``picked`` of a batch (in order; ``lengths`` theirs, ``flat`` their tokens), which
        continue ``seg``: the part of them inside the window goes to the writer."""
        key = (seg.name, seg.part)
        start = seg.start + self.read.get(key, 0)
        total = int(lengths.sum())
        self.read[key] = self.read.get(key, 0) + total
        a, b = max(self.lo - start, 0), min(self.hi - start, total)
        if a >= b:
            return
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        first = int(np.searchsorted(offsets, a, side="right")) - 1
        last = int(np.searchsorted(offsets, b, side="left"))
        if offsets[first] < a:  # the window starts inside this document: which piece of it that is
            began_in = int(np.searchsorted(self.bounds, start + int(offsets[first]), side="right")) - 1
            self.writer.continue_document(self.window.first - began_in)
        rows = picked[first:last].tolist()
        cols = {c: [docs[c][k] for k in rows] for c in docs}
        sub = np.clip(offsets[first : last + 1], a, b) - a
        prov = {c: cols[c] for c in PROVENANCE_COLUMNS}
        self.writer.add_batch(cols["id"], cols["source"], cols["location"], sub, flat[a:b], prov)

    def close(self) -> list[ShardInfo]:
        for key, seg in self.segments.items():
            if self.read.get(key, 0) != seg.tokens:
                raise ValueError(
                    f"{self.window.split}: part {seg.part} holds {self.read.get(key, 0)} tokens of source "
                    f"{seg.name!r}, but {seg.tokens} were counted; the token counts changed between planning "
                    "and writing"
                )
        return self.writer.close()


def write_windows(
    store: ObjectStore,
    folder: str,
    windows: Sequence[Window],
    out_dir: Path,
    dtype: np.dtype,
    shard_cfg: ShardConfig,
) -> list[ShardInfo]:
    """Write the shards of ``windows`` under ``out_dir``, reading each (source, part) they hold once."""
    feeds = {w.split: _WindowFeed(w, out_dir, dtype) for w in windows if w.stop > w.first}
    wanted = sorted({(s.name, s.part) for f in feeds.values() for s in f.window.segments})
    columns = ("id", "source", "location", "tokens", *PROVENANCE_COLUMNS)
    for name, part in wanted:
        segs = {split: f.segments[(name, part)] for split, f in feeds.items() if (name, part) in f.segments}
        for batch in iter_token_batches(store, folder, part, columns=columns):
            _feed_batch(batch, name, segs, feeds, shard_cfg)
    return [shard for split in SPLITS if split in feeds for shard in feeds[split].close()]


def _feed_batch(
    batch: pa.RecordBatch,
    source: str,
    segments: Mapping[str, Segment],
    feeds: Mapping[str, _WindowFeed],
    shard_cfg: ShardConfig,
) -> None:
    """The documents of ``source`` in ``batch``, each to the feed of its split (those in ``segments``)."""
    offsets, flat = _split_arrays(batch)
    docs = {c: batch.column(c).to_pylist() for c in ("id", "source", "location", *PROVENANCE_COLUMNS)}
    of_source = np.array([n == source for n in docs["source_name"]], dtype=bool)
    if not of_source.any():
        return
    splits = np.array([split_of(d, shard_cfg.valid_fraction, shard_cfg.seed) for d in docs["id"]])
    lengths = np.diff(offsets)
    for split, seg in segments.items():
        mask = (splits == split) & of_source
        if not mask.any():
            continue
        sub_flat = flat if mask.all() else flat[np.repeat(mask, lengths)]
        feeds[split].add(seg, lengths[mask], sub_flat, docs, np.flatnonzero(mask))


def write_shards(
    store: ObjectStore,
    folder: str,
    num_parts: int,
    out_dir: Path,
    dtype: np.dtype,
    shard_cfg: ShardConfig,
    counts_folder: str | None = None,
) -> list[ShardInfo]:
    """Pass 2 in one process: stream every document into its split's balanced shards under ``out_dir``,
    grouped by source name (sorted), each source in part order, so every source is one contiguous token range
    of its split: the blended sampler draws from a source by drawing from its range (see ``source_ranges``).
    Pass 1 (the tokens per source and split that plan the shards) adds up ``counts_folder``'s per-part counts
    when there are any."""
    counts = part_counts(store, folder, num_parts, shard_cfg, counts_folder)
    windows = plan_windows(counts, shard_cfg.target_tokens(dtype), 1)
    return write_windows(store, folder, windows[0] if windows else [], out_dir, dtype, shard_cfg)


# ---------------------------------------------------------------- pass 2 on workers: window units


def shards_folder(
    work_folder: str, tokenizer_sha256: str, dtype: np.dtype, shard_cfg: ShardConfig, counts: Any
) -> str:
    """The work folder's place for the shards of one plan: named by what decides their bytes (the token
    counts and the tokenizer, the dtype and the shard config), so a changed plan never reuses another's
    shards."""
    basis = json.dumps([tokenizer_sha256, dtype.name, dataclasses.asdict(shard_cfg), counts], sort_keys=True)
    return f"{work_folder}/shards/{hashlib.sha256(basis.encode()).hexdigest()[:16]}"


def window_name(windows: Sequence[Window]) -> str:
    return "+".join(f"{w.split}-{w.first:05d}-{w.stop:05d}" for w in windows)


def run_window_unit(
    store: ObjectStore,
    token_folder: str,
    out_folder: str,
    windows: Sequence[Window],
    dtype: np.dtype,
    shard_cfg: ShardConfig,
) -> StageStats:
    """Write the shards of ``windows`` and put them under ``out_folder`` in the store (keys as in the
    dataset); the unit's stats hold each shard (``extra["written"]``) and its mixture runs
    (``extra["runs"]``). A rerun returns the stored stats."""
    unit = join_key(out_folder, window_name(windows))
    if (done := unit_stats(store, unit)) is not None:
        return done
    with tempfile.TemporaryDirectory(prefix=local_temp_prefix("pileworks-shards-")) as tmp:
        staged = Path(tmp)
        written = write_windows(store, token_folder, windows, staged, dtype, shard_cfg)
        runs = [shard_runs(staged / w.docs_key) for w in written]
        for w in written:
            for key in (w.key, w.idx_key, w.docs_key):
                store.put_file(join_key(out_folder, key), staged / key)
    stats = shard_stats(written)
    stats.extra.update(written=[dataclasses.asdict(w) for w in written], runs=runs)
    return finish_unit(store, unit, stats)


def window_results(units: Sequence[Mapping[str, Any]]) -> tuple[list[ShardInfo], list[list[list[Any]]]]:
    """The shards and their mixture runs from the stats (JSON) of every window unit, in shard order."""
    written: list[ShardInfo] = []
    runs: list[list[list[Any]]] = []
    for stats in units:
        written += [ShardInfo(**w) for w in stats["extra"]["written"]]
        runs += stats["extra"]["runs"]
    order = sorted(range(len(written)), key=lambda i: (SPLITS.index(written[i].split), written[i].index))
    return [written[i] for i in order], [runs[i] for i in order]


# ---------------------------------------------------------------- the manifest and the publish


def shard_stats(written: Sequence[ShardInfo]) -> StageStats:
    tokens = sum(w.tokens for w in written)
    return StageStats(
        stage="shard",
        docs_in=sum(w.docs for w in written),
        docs_out=sum(w.docs for w in written),
        bytes_in=4 * tokens,
        bytes_out=sum(w.bytes for w in written),
        extra={"tokens": tokens, "shards": len(written)},
    )


@dataclass(frozen=True)
class TokenizerFiles:
    """The tokenizer a dataset is published with: its bytes, ids and the Hugging Face files beside it."""

    data: bytes
    vocab_size: int
    eos_id: int
    pad_id: int | None
    hf_files: dict[str, bytes]

    @classmethod
    def load(cls, data: bytes, eos_token: str, pad_token: str | None) -> TokenizerFiles:
        tok = Tokenizer.from_str(data.decode("utf-8"))
        eos_id = special_id(tok, eos_token)
        pad_id = None if pad_token is None else special_id(tok, pad_token)
        files = hf_tokenizer_files(data, eos_id=eos_id, pad_id=pad_id)
        return cls(data, tok.get_vocab_size(), eos_id, pad_id, files)

    @property
    def dtype(self) -> np.dtype:
        return dtype_for_vocab(self.vocab_size)

    def info(self) -> TokenizerInfo:
        return TokenizerInfo(
            key="tokenizer.json",
            sha256=sha256_bytes(self.data),
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            bos_id=None,
            pad_id=self.pad_id,
            files={name: sha256_bytes(data) for name, data in self.hf_files.items()},
        )

    def stage(self, folder: Path) -> None:
        (folder / "tokenizer.json").write_bytes(self.data)
        for name, data in self.hf_files.items():
            (folder / name).write_bytes(data)


def dataset_manifest(
    name: str,
    tok: TokenizerFiles,
    written: Sequence[ShardInfo],
    mixture: dict[str, Any],
    stats: dict[str, Any],
    inputs: list[dict] | None = None,
    config: dict | None = None,
    lineage: dict | None = None,
) -> Manifest:
    """The manifest of a dataset whose shards are ``written`` (``stats``: every stage's, as JSON), with its data
    card listed (:func:`pipeline.dataset.card.attach_card`; :func:`dataset_card` gives the card's bytes)."""
    manifest = Manifest(
        name=name,
        dtype=tok.dtype.name,
        shards=list(written),
        tokenizer=tok.info(),
        stats={**stats, "shard": shard_stats(written).to_json()},
        mixture=mixture,
        inputs=list(inputs or []),
        config=dict(config or {}),
        lineage=dict(lineage or {"prefect_flow_run_id": None}),
    )
    attach_card(manifest)
    return manifest


def dataset_card(manifest: Manifest) -> bytes:
    """The bytes of the card ``manifest`` lists (rebuilt from the manifest and checked against its sha256)."""
    data = card_bytes(build_card(manifest.name, manifest.dataset_id, manifest.stats, manifest.mixture))
    if sha256_bytes(data) != manifest.card.get("sha256"):
        raise ValueError(
            f"dataset {manifest.dataset_id}: the card built from the manifest does not match its sha256"
        )
    return data


def commit_dataset(store: ObjectStore, manifest: Manifest, tok: TokenizerFiles) -> str:
    """The last step of a build, once every shard is under the dataset's prefix and verified: upload the
    tokenizer files and the data card (each verified), then write the manifest and ``latest.json``
    (:func:`pipeline.dataset.manifest.commit_manifest`, whose :class:`DatasetConflictError` it passes on). A dataset
    already published keeps every object as it is (:func:`pipeline.dataset.manifest.already_published`). Returns the
    manifest URI."""
    if already_published(store, manifest):
        return commit_manifest(store, manifest.name, manifest)
    prefix = dataset_prefix(manifest.name, manifest.dataset_id)
    with tempfile.TemporaryDirectory(prefix=local_temp_prefix("pileworks-tokenizer-")) as tmp:
        staged = Path(tmp)
        tok.stage(staged)
        files = {manifest.tokenizer.key: manifest.tokenizer.sha256, **manifest.tokenizer.files}
        if manifest.card:  # the data card, beside the manifest
            (staged / manifest.card["key"]).write_bytes(dataset_card(manifest))
            files[manifest.card["key"]] = manifest.card["sha256"]
        for name, sha in files.items():
            upload_verified(store, join_key(prefix, name), staged / name, sha)
    return commit_manifest(store, manifest.name, manifest)
