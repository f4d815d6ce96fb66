"""Ingest: raw objects (txt, jsonl[.gz|.zst], parquet on file:// or s3://) -> docs parts.

Three steps, each a pure function over small serialisable values so a flow can fan out over parts:

1. :func:`list_inputs` expands sources (paths, folders, globs, ``file://``, ``s3://bucket/prefix``) into
   fingerprinted :class:`InputFile` objects, sorted by URI.
2. :func:`plan_parts` packs them into :class:`PartPlan` units of similar byte size; a large uncompressed
   ``.jsonl``/``.txt`` is split into byte ranges and a large parquet file into row-group ranges.
3. :func:`ingest_part` / :func:`run_ingest_part` read one plan into records (the readers live in
   :mod:`pipeline.ingest_readers`) and write the part. Bad input is quarantined with a reason, never fatal.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from pipeline import ingest_readers as readers
from pipeline import ingest_streams as streams
from pipeline.encoding import is_line_safe
from pipeline.records import (
    PartWriter,
    Quarantined,
    Record,
    StageStats,
    part_done,
    read_part_stats,
)
from pipeline.sources import SourceConfig
from pipeline.storage import ObjectStore, S3Options, StorageError, open_store, split_uri

log = logging.getLogger(__name__)

FORMATS = ("txt", "txt.gz", "txt.zst", "jsonl", "jsonl.gz", "jsonl.zst", "parquet")
DEFAULT_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        ".txt": "txt",
        ".txt.gz": "txt.gz",
        ".txt.zst": "txt.zst",
        ".jsonl": "jsonl",
        ".ndjson": "jsonl",
        ".jsonl.gz": "jsonl.gz",
        ".json.gz": "jsonl.gz",
        ".jsonl.zst": "jsonl.zst",
        ".json.zst": "jsonl.zst",
        ".parquet": "parquet",
    }
)
_GLOB_CHARS = ("*", "?", "[")
# Planning weighs pieces by the text they will produce (that is what a part holds in memory), estimating
# compressed inputs (gz, zst, parquet) at 4x their size, a typical ratio for text, without opening them.
COMPRESSION_ESTIMATE = 4


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """How raw objects become documents. ``extensions`` maps a file-name suffix to one of :data:`FORMATS`."""

    txt_mode: str = "file"  # "file": one document per file; "paragraph": blank-line separated blocks
    text_field: str = "text"
    meta_field: str = "meta"
    id_field: str | None = None  # take record ids from this field instead of "<uri>#<position>"
    target_part_bytes: int = 32 * 1024 * 1024
    max_doc_bytes: int = 10 * 1024 * 1024
    min_detect_confidence: float = 0.8
    # A chunk of otherwise valid UTF-8 with invalid bytes: "replace" them with U+FFFD (keeping every valid
    # character, counted as repaired_invalid_utf8) or "quarantine" the whole line/paragraph (invalid_utf8).
    invalid_utf8: str = "replace"
    extensions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_EXTENSIONS))

    def __post_init__(self) -> None:
        if self.txt_mode not in ("file", "paragraph"):
            raise ValueError(f"ingest.txt_mode must be 'file' or 'paragraph', got {self.txt_mode!r}")
        if self.invalid_utf8 not in ("replace", "quarantine"):
            raise ValueError(
                f"ingest.invalid_utf8 must be 'replace' or 'quarantine', got {self.invalid_utf8!r}"
            )
        for name in ("text_field", "meta_field"):
            if not getattr(self, name):
                raise ValueError(f"ingest.{name} must be a non-empty field name")
        if self.id_field is not None and not self.id_field:
            raise ValueError("ingest.id_field must be a field name or None")
        if self.target_part_bytes < 1:
            raise ValueError(f"ingest.target_part_bytes must be >= 1, got {self.target_part_bytes}")
        if self.max_doc_bytes < 1:
            raise ValueError(f"ingest.max_doc_bytes must be >= 1, got {self.max_doc_bytes}")
        if not 0.0 <= self.min_detect_confidence <= 1.0:
            raise ValueError(
                f"ingest.min_detect_confidence must be in [0, 1], got {self.min_detect_confidence}"
            )
        bad = {
            ext: fmt for ext, fmt in self.extensions.items() if fmt not in FORMATS or not ext.startswith(".")
        }
        if bad:
            raise ValueError(f"ingest.extensions: {bad} must map '.suffix' to one of {FORMATS}")


@dataclass(frozen=True, kw_only=True)
class InputFile:
    """One raw object and its fingerprint (recorded in the manifest; a rebuild redoes what changed)."""

    uri: str
    size: int
    etag: str
    mtime: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A whole object, bytes ``[start, end)`` of one (txt/jsonl) or row groups ``[start, end)`` (parquet)."""

    uri: str
    fmt: str
    size: int
    start: int = 0
    end: int | None = None  # None: to the end of the object
    weight: int = 0  # bytes this piece accounts for in planning
    entry: int = 0  # the index of the configured source (``CorpusConfig.sources``) the object belongs to


@dataclass(frozen=True, kw_only=True)
class PartPlan:
    index: int
    pieces: tuple[Piece, ...]

    @property
    def bytes(self) -> int:
        return sum(p.weight for p in self.pieces)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "pieces": [asdict(p) for p in self.pieces]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartPlan:
        return cls(index=int(data["index"]), pieces=tuple(Piece(**p) for p in data["pieces"]))


# ---------------------------------------------------------------- listing


def format_of(uri: str, extensions: Mapping[str, str]) -> str | None:
    """The format of the longest matching suffix (``.jsonl.zst`` before ``.zst``), or None."""
    name = uri.rsplit("/", 1)[-1].lower()
    matches = [ext for ext in extensions if name.endswith(ext.lower())]
    return extensions[max(matches, key=len)] if matches else None


def _local_files(source: str) -> list[str]:
    path = source[len("file://") :] if source.startswith("file://") else source
    path = os.path.expanduser(path)
    if any(c in path for c in _GLOB_CHARS):
        return sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
    if os.path.isdir(path):
        return sorted(str(p) for p in Path(path).rglob("*") if p.is_file())
    if os.path.isfile(path):
        return [path]
    raise ValueError(f"input source {source!r} does not exist")


def _local_inputs(source: str) -> Iterator[InputFile]:
    for path in _local_files(source):
        absolute = Path(path).resolve()
        st = absolute.stat()
        yield InputFile(
            uri="file://" + str(absolute),
            size=st.st_size,
            etag=f"{st.st_mtime_ns}-{st.st_size}",
            mtime=st.st_mtime,
        )


def _s3_inputs(source: str, s3: S3Options | None) -> Iterator[InputFile]:
    bucket, _, pattern = source[len("s3://") :].partition("/")
    store = open_store(f"s3://{bucket}", s3=s3)
    cut = min([pattern.find(c) for c in _GLOB_CHARS if c in pattern] or [len(pattern)])
    prefix = pattern[:cut]
    infos = list(store.list(prefix)) if prefix else list(store.list())
    if cut < len(pattern):
        from fnmatch import fnmatchcase

        infos = [i for i in infos if fnmatchcase(i.key, pattern)]
    elif prefix:  # one object if the key exists, else the "folder" below it (never a mere name prefix)
        exact = [i for i in infos if i.key == prefix]
        infos = exact or [i for i in infos if i.key.startswith(prefix.rstrip("/") + "/")]
    for info in infos:
        yield InputFile(uri=f"s3://{bucket}/{info.key}", size=info.size, etag=info.etag, mtime=info.mtime)


def list_inputs(
    sources: list[str], s3: S3Options | None = None, extensions: Mapping[str, str] = DEFAULT_EXTENSIONS
) -> list[InputFile]:
    """Every supported object under ``sources``, deduplicated and sorted by URI.

    Files with an unknown suffix are skipped with a warning (a folder often holds README/PROVENANCE files);
    a source that matches no supported file at all is an error, so a typo cannot yield an empty corpus.
    """
    found: dict[str, InputFile] = {}
    for source in sources:
        files = list(_s3_inputs(source, s3) if source.startswith("s3://") else _local_inputs(source))
        usable = [f for f in files if format_of(f.uri, extensions) is not None]
        skipped = [f.uri for f in files if format_of(f.uri, extensions) is None]
        if skipped:
            log.warning(
                "ingest: skipping %d file(s) of unknown format under %s: %s",
                len(skipped),
                source,
                ", ".join(s.rsplit("/", 1)[-1] for s in skipped[:5]),
            )
        if not usable:
            raise ValueError(
                f"input source {source!r} holds no file of a known format ({sorted(extensions)})"
            )
        found.update((f.uri, f) for f in usable)
    return [found[uri] for uri in sorted(found)]


# ---------------------------------------------------------------- planning


class _Stores:
    """One store per root URI for the duration of a plan or a part (S3 clients are reused across objects)."""

    def __init__(self, s3: S3Options | None):
        self.s3 = s3
        self.cache: dict[str, ObjectStore] = {}

    def locate(self, uri: str) -> tuple[ObjectStore, str]:
        root, key = split_uri(uri)
        if root not in self.cache:
            local = root[len("file://") :] if root.startswith("file://") else None
            if local is not None and not os.path.isdir(local):  # FileStore would create the folder
                raise FileNotFoundError(f"{uri} does not exist")
            self.cache[root] = open_store(root, s3=self.s3)
        return self.cache[root], key


def _split_bytes(inp: InputFile, fmt: str, target: int) -> list[Piece]:
    count = -(-inp.size // target)
    bounds = [inp.size * i // count for i in range(count + 1)]
    return [
        Piece(
            uri=inp.uri,
            fmt=fmt,
            size=inp.size,
            start=bounds[i],
            end=None if i == count - 1 else bounds[i + 1],
            weight=bounds[i + 1] - bounds[i],
        )
        for i in range(count)
    ]


def _split_row_groups(inp: InputFile, store: ObjectStore, key: str, target: int) -> list[Piece]:
    import pyarrow.parquet as pq

    with streams.open_seekable(store, key, inp.size) as f:
        meta = pq.ParquetFile(f).metadata
    sizes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
    pieces, first, acc = [], 0, 0
    for g, size in enumerate(sizes):
        if acc and acc + size > target:
            pieces.append((first, g, acc))
            first, acc = g, 0
        acc += size
    pieces.append((first, len(sizes), acc))
    return [  # weights: the uncompressed bytes of the row groups
        Piece(
            uri=inp.uri,
            fmt="parquet",
            size=inp.size,
            start=a,
            end=None if b == len(sizes) else b,
            weight=max(w, 1),
        )
        for a, b, w in pieces
    ]


def _pieces_of(inp: InputFile, cfg: IngestConfig, target: int, stores: _Stores) -> list[Piece]:
    fmt = format_of(inp.uri, cfg.extensions)
    if fmt is None:
        raise ValueError(f"{inp.uri}: unknown format (ingest.extensions has {sorted(cfg.extensions)})")
    estimate = inp.size * (COMPRESSION_ESTIMATE if fmt == "parquet" or "." in fmt else 1)
    whole = [Piece(uri=inp.uri, fmt=fmt, size=inp.size, weight=max(estimate, 1))]
    if estimate <= target:
        return whole
    if "." in fmt:
        log.info("ingest: %s (~%d MiB of text) is compressed and read as one piece", inp.uri, estimate >> 20)
        return whole
    try:
        if fmt == "parquet":
            return _split_row_groups(inp, *stores.locate(inp.uri), target)
        if fmt == "jsonl" or (fmt == "txt" and cfg.txt_mode == "paragraph"):
            store, key = stores.locate(inp.uri)
            bom = readers.sniff_bom(store, key)
            if bom is None or is_line_safe(bom):
                return _split_bytes(inp, fmt, target)
    except (OSError, StorageError) as e:  # read at ingest time instead, where the failure is quarantined
        log.warning("ingest: cannot inspect %s for splitting (%s); planning it whole", inp.uri, e)
    return whole


def plan_parts(
    inputs: list[InputFile],
    target_part_bytes: int,
    *,
    cfg: IngestConfig | None = None,
    s3: S3Options | None = None,
) -> list[PartPlan]:
    """Pack inputs, in order, into parts of about ``target_part_bytes`` of text.

    A pure function of the inputs, except that files to be split are peeked at: large parquet files for their
    row-group sizes, large text files for a UTF-16/32 byte-order mark (such files are never split). A
    compressed file is never split: its part holds all of its text (see COMPRESSION_ESTIMATE).
    """
    if target_part_bytes < 1:
        raise ValueError(f"target_part_bytes must be >= 1, got {target_part_bytes}")
    cfg = cfg or IngestConfig()
    stores = _Stores(s3)
    parts: list[list[Piece]] = []
    current: list[Piece] = []
    for inp in inputs:
        for piece in _pieces_of(inp, cfg, target_part_bytes, stores):
            if current and sum(p.weight for p in current) + piece.weight > target_part_bytes:
                parts.append(current)
                current = []
            current.append(piece)
    if current:
        parts.append(current)
    return [PartPlan(index=i, pieces=tuple(pieces)) for i, pieces in enumerate(parts)]


# ---------------------------------------------------------------- reading


# Permanent conditions of one object: quarantined as "read_error" and the part goes on. Any other I/O error
# (a network outage, S3 throttling past the store's retries) propagates, so the unit fails as a whole and
# its task is retried: a transient failure must not become a part that is silently missing records.
UNREADABLE = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def assign_sources(plans: list[PartPlan], entry_of: Mapping[str, int]) -> list[PartPlan]:
    """The plans with every piece marked with the source entry of its object (``entry_of``: URI -> index)."""
    return [
        PartPlan(index=p.index, pieces=tuple(replace(x, entry=entry_of.get(x.uri, 0)) for x in p.pieces))
        for p in plans
    ]


def _piece_context(piece: Piece, cfg: IngestConfig, sources: Sequence[SourceConfig]) -> readers.ReadContext:
    source = sources[piece.entry] if piece.entry < len(sources) else None
    if source is not None and source.text_field:
        cfg = replace(cfg, text_field=source.text_field)
    return readers.ReadContext(uri=piece.uri, fmt=piece.fmt, cfg=cfg, source=source, entry=piece.entry)


def iter_ingest_part(
    plan: PartPlan,
    cfg: IngestConfig,
    stats: StageStats,
    quarantined: list[Quarantined],
    s3: S3Options | None = None,
    sources: Sequence[SourceConfig] = (),
) -> Iterator[Record]:
    """Stream the records of every piece of ``plan``; bad input goes to ``quarantined``, counts to ``stats``.

    Bad or missing input is quarantined, never raised; transient I/O errors are raised (see UNREADABLE).
    ``sources`` are the corpus's configured sources (a piece's ``entry`` indexes them): they name the
    documents and may override the text field.
    """
    stores = _Stores(s3)
    docs = nbytes = 0
    for piece in plan.pieces:
        ctx = _piece_context(piece, cfg, sources)
        try:
            for item in readers.read_piece(piece, ctx, *stores.locate(piece.uri)):
                if isinstance(item, Record):
                    docs += 1
                    nbytes += len(item.text.encode("utf-8", "surrogatepass"))
                    yield item
                else:
                    quarantined.append(item)
        except (*UNREADABLE, pa.ArrowException) as e:  # records read before the failure are kept
            reason = "corrupt_file" if isinstance(e, pa.ArrowException) else "read_error"
            log.warning("ingest: %s %s: %s", reason, piece.uri, e)
            quarantined.append(ctx.quarantine(f"B{piece.start}", reason, f"{type(e).__name__}: {e}"))
        stats.bytes_in += ctx.bytes_read
        for name, value in ctx.extra.items():
            stats.extra[name] = stats.extra.get(name, 0) + value
    for q in quarantined:
        stats.drop(q.reason)
    stats.docs_out = docs
    stats.docs_in = docs + len(quarantined)
    stats.bytes_out = nbytes
    stats.extra["pieces"] = len(plan.pieces)


def ingest_part(
    plan: PartPlan, cfg: IngestConfig, s3: S3Options | None = None, sources: Sequence[SourceConfig] = ()
) -> tuple[list[Record], list[Quarantined], StageStats]:
    """Read every piece of ``plan`` into memory: (records, quarantined, stats). Runners stream instead."""
    stats = StageStats(stage="ingest")
    quarantined: list[Quarantined] = []
    records = list(iter_ingest_part(plan, cfg, stats, quarantined, s3, sources))
    return records, quarantined, stats


def run_ingest_part(
    store: ObjectStore,
    out_folder: str,
    plan: PartPlan,
    cfg: IngestConfig,
    s3: S3Options | None = None,
    sources: Sequence[SourceConfig] = (),
) -> StageStats:
    """The unit of work: ingest one plan into ``out_folder/part-<index>``, streaming (bounded memory however
    large the compressed input); a completed part is not redone."""
    if part_done(store, out_folder, plan.index):
        return read_part_stats(store, out_folder, plan.index)
    stats = StageStats(stage="ingest")
    quarantined: list[Quarantined] = []
    with PartWriter(store, out_folder, plan.index) as writer:
        writer.write(iter_ingest_part(plan, cfg, stats, quarantined, s3, sources))
        writer.finish(stats, quarantined)
    log.info("ingest part %d: %d docs, %d quarantined %s", plan.index, stats.docs_out, len(quarantined),
             dict(stats.dropped))  # fmt: skip
    return stats
