"""Ingest: raw objects (txt, jsonl[.gz|.zst], parquet on file://, s3://, gs:// or az://) -> docs parts.

Three steps, each a pure function over small serialisable values so a flow can fan out over parts:

1. :func:`list_inputs` expands sources (paths, folders, globs, ``file://``, ``s3://bucket/prefix``, ``gs://``,
   ``az://``) into fingerprinted :class:`InputFile` objects, sorted by URI.
2. :func:`plan_parts` packs them into :class:`PartPlan` units of similar byte size; a large uncompressed
   ``.jsonl``/``.txt`` is split into byte ranges and a large parquet file into row-group ranges.
3. :func:`ingest_part` / :func:`run_ingest_part` read one plan into records (the readers live in
   :mod:`pipeline.ingest.readers`) and write the part. Bad input is quarantined with a reason, never fatal.
"""

from __future__ import annotations

import glob
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from pipeline.ingest import html, readers, streams, warc
from pipeline.ingest.config import (
    COMPRESSION_ESTIMATE,
    DEFAULT_EXTENSIONS,
    WEB_FORMATS,
    IngestConfig,
    InputFile,
    PartPlan,
    Piece,
)
from pipeline.ingest.encoding import is_line_safe
from pipeline.records import PartWriter, Quarantined, Record
from pipeline.sources import DEFAULT_SOURCE, SourceConfig
from pipeline.storage import (
    ObjectStore,
    S3Options,
    StorageError,
    is_remote,
    normalize_key,
    open_store,
    split_uri,
)
from pipeline.units.protocol import UNKNOWN_LANGUAGE, StageStats, done_part_stats, snippet

log = logging.getLogger(__name__)
# A text transform applied to every document as it is read: (text, counters) -> text. A build passes the clean
# stage's normalisation (``pipeline.clean.normalize.normalize_text`` with its config), so the text is normalised
# once, here, and the steps after ingest read it as it is.
Normalizer = Callable[[str, "Counter[str]"], str]
_GLOB_CHARS = ("*", "?", "[")


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
    raise ValueError(f"input {source!r} does not exist: check the path (a glob in quotes: 'data/**/*.jsonl')")


def _is_pattern(source: str) -> bool:
    return any(c in source.split("://", 1)[-1] for c in _GLOB_CHARS)


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


def odd_key_reason(uri: str) -> str | None:
    """Why the object key of a cloud input (``s3://``, ``gs://``, ``az://``...) cannot be used (``..``, absolute, NUL, not canonical), or None.

    Such keys come from a listing (another tool wrote them); they are quarantined as ``bad_key``, and the
    build goes on, rather than read under a key our stores refuse or that resolves to another object.
    """
    if not is_remote(uri):
        return None
    key = uri.split("://", 1)[1].partition("/")[2]
    try:
        canonical = normalize_key(key)
    except ValueError as exc:
        return str(exc)
    if canonical != key:
        return f"object key {key!r} is not canonical (reads as {canonical!r})"
    return None


def _remote_inputs(source: str, s3: S3Options | None) -> Iterator[InputFile]:
    """The objects a cloud source names (``s3://``, ``gs://``, ``az://``, ``abfs[s]://``): a key, a folder, a glob."""
    scheme, _, rest = source.partition("://")
    bucket, _, pattern = rest.partition("/")
    root = f"{scheme}://{bucket}"
    store = open_store(root, s3=s3)
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
        yield InputFile(uri=f"{root}/{info.key}", size=info.size, etag=info.etag, mtime=info.mtime)


# ---------------------------------------------------------------- where the inputs lie: the root and the names


def input_root(source: str, s3: S3Options | None) -> str:
    """The folder URI an input source's objects are named under: the folder itself, a file's or an object's
    parent, a glob's folder before its first wildcard (``/data/web/**/*.jsonl``: ``file:///data/web``)."""
    if is_remote(source):  # s3://, gs://, az://, abfs[s]://: <scheme>://<bucket or container>/<prefix>
        scheme, _, rest = source.partition("://")
        bucket, _, pattern = rest.partition("/")
        cut = min([pattern.find(c) for c in _GLOB_CHARS if c in pattern] or [len(pattern)])
        prefix = pattern[:cut]
        if cut == len(pattern) and prefix and not prefix.endswith("/"):
            if open_store(f"{scheme}://{bucket}", s3=s3).exists(prefix):  # one object: named under its parent
                prefix = prefix.rpartition("/")[0] + "/"
            else:
                prefix += "/"
        folder = prefix.rpartition("/")[0]
        return f"{scheme}://{bucket}/{folder}".rstrip("/")
    path = os.path.abspath(os.path.expanduser(source.removeprefix("file://")))
    if any(c in path for c in _GLOB_CHARS):
        path = path[: min(path.find(c) for c in _GLOB_CHARS if c in path)].rpartition("/")[0] or "/"
    elif not os.path.isdir(path):
        path = os.path.dirname(path)
    return "file://" + str(Path(path).resolve())


def common_root(roots: Sequence[str]) -> str:
    """The deepest folder URI holding every root (all in one bucket or container, or all local); "" when they
    share none (inputs in several buckets, or local and a cloud at once: their names are then their URIs)."""
    if not roots:
        return ""
    split = [r.partition("://") for r in roots]
    heads = {(scheme, rest.split("/", 1)[0] if scheme != "file" else "") for scheme, _, rest in split}
    if len(heads) != 1:
        return ""
    paths = [rest.split("/") for _, _, rest in split]
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    joined = "/".join(common)
    return f"{split[0][0]}://{joined or '/'}"


def relative_name(uri: str, root: str) -> str:
    """``uri``'s path under ``root`` (``a/b.jsonl``), or ``uri`` itself when ``root`` is "" or does not hold it."""
    base = root if root.endswith("/") else root + "/"
    return uri[len(base) :] if root and uri.startswith(base) else uri


def named_inputs(inputs: Sequence[InputFile], root: str) -> list[InputFile]:
    """``inputs`` with their names under ``root``; two objects of one name (a symlink's target outside the root
    named twice) keep their URIs as names, so no two documents share an id."""
    names = [relative_name(i.uri, root) for i in inputs]
    taken = Counter(names)
    return [replace(i, name=n if taken[n] == 1 else i.uri) for i, n in zip(inputs, names, strict=True)]


def relative_source(source: str, root: str) -> str:
    """An input source as written relative to ``root`` (``**/*.jsonl``; ``.`` for the root itself): what a
    config says about its inputs once where they lie is left out (the dataset id hashes this)."""
    if is_remote(source):
        uri = source.rstrip("/")
    else:
        path = os.path.abspath(os.path.expanduser(source.removeprefix("file://")))
        glob_at = min([path.find(c) for c in _GLOB_CHARS if c in path] or [len(path)])
        folder, _, rest = path[:glob_at].rpartition("/")
        uri = "file://" + str(Path(folder or "/").resolve()).rstrip("/") + "/" + rest + path[glob_at:]
        uri = uri.rstrip("/")
    if uri == root.rstrip("/"):
        return "."
    return relative_name(uri, root)


def list_inputs(
    sources: list[str], s3: S3Options | None, extensions: Mapping[str, str] = DEFAULT_EXTENSIONS
) -> list[InputFile]:
    """Every supported object under ``sources``, deduplicated and sorted by URI.

    Files with an unknown suffix are skipped with a warning (a folder often holds README/PROVENANCE files);
    a source that matches no supported file at all is an error, so a typo cannot yield an empty corpus.
    """
    found: dict[str, InputFile] = {}
    for source in sources:
        files = list(_remote_inputs(source, s3) if is_remote(source) else _local_inputs(source))
        usable = [f for f in files if format_of(f.uri, extensions) is not None]
        skipped = [f.uri for f in files if format_of(f.uri, extensions) is None]
        if skipped:  # INFO: a folder often holds a README; a source of nothing usable is an error below
            log.info(
                "ingest: skipping %d file(s) of unknown format under %s: %s",
                len(skipped),
                source,
                ", ".join(s.rsplit("/", 1)[-1] for s in skipped[:5]),
            )
        if not files:
            what = "matches nothing" if _is_pattern(source) else "is empty"
            raise ValueError(f"input {source!r} {what}: check the path or pattern")
        if not usable:
            raise ValueError(
                f"input {source!r} holds no file of a known format: give files ending in "
                f"{', '.join(sorted(extensions))} (or add the suffix to ingest.extensions)"
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
            name=inp.name,
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
            name=inp.name,
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
    whole = [Piece(uri=inp.uri, name=inp.name, fmt=fmt, size=inp.size, weight=max(estimate, 1))]
    if estimate <= target or odd_key_reason(inp.uri) is not None:  # an odd key is quarantined, never read
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
    s3: S3Options | None,
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
    # ids and the source column hold the object's name under the input root, not where it lies
    name = piece.name or piece.uri
    return readers.ReadContext(uri=name, fmt=piece.fmt, cfg=cfg, source=source, entry=piece.entry)


def iter_ingest_part(
    plan: PartPlan,
    cfg: IngestConfig,
    stats: StageStats,
    quarantined: list[Quarantined],
    s3: S3Options | None,
    sources: Sequence[SourceConfig] = (),
    normalize: Normalizer | None = None,
) -> Iterator[Record]:
    """Stream the records of every piece of ``plan``; bad input goes to ``quarantined``, counts to ``stats``.

    Bad or missing input is quarantined, never raised; transient I/O errors are raised (see UNREADABLE).
    ``sources`` are the corpus's configured sources (a piece's ``entry`` indexes them): they name the
    documents and may override the text field.
    """
    stores = _Stores(s3)
    docs = nbytes = chars_read = chars_kept = 0
    counts: Counter[str] = Counter()
    names: dict[str, str] = {}  # the source name of each object, for its quarantined records
    for piece in plan.pieces:
        ctx = _piece_context(piece, cfg, sources)
        names[ctx.uri] = ctx.source.name if ctx.source is not None and ctx.source.name else DEFAULT_SOURCE
        if (odd := odd_key_reason(piece.uri)) is not None:
            log.warning("ingest: bad_key %r: %s", piece.uri, odd)
            quarantined.append(ctx.quarantine("B0", "bad_key", odd))
            continue
        items = 0
        try:
            for item in _read_piece(piece, ctx, stores):
                items += 1
                if isinstance(item, Record):
                    docs += 1
                    if normalize is not None:
                        text = normalize(item.text, counts)
                        chars_read, chars_kept = chars_read + len(item.text), chars_kept + len(text)
                        item = Record(item.id, text, item.source, item.meta)
                    nbytes += (
                        len(item.text)
                        if item.text.isascii()
                        else len(item.text.encode("utf-8", "surrogatepass"))
                    )
                    yield item
                else:
                    quarantined.append(item)
            if items == 0 and piece.start == 0:  # a 0-byte file, an empty .gz/.zst, a parquet with no rows
                log.warning("ingest: empty_input %s holds no document", piece.uri)
                ctx.extra["empty_input"] = ctx.extra.get("empty_input", 0) + 1
        except (*UNREADABLE, pa.ArrowException) as e:  # records read before the failure are kept
            reason = "corrupt_file" if isinstance(e, pa.ArrowException) else "read_error"
            log.warning("ingest: %s %s: %s", reason, piece.uri, e)
            quarantined.append(ctx.quarantine(f"B{piece.start}", reason, f"{type(e).__name__}: {e}"))
        stats.bytes_in += ctx.bytes_read
        for name, value in ctx.extra.items():
            stats.extra[name] = stats.extra.get(name, 0) + value
    for q in quarantined:
        stats.drop(q.reason)
        _tally_quarantined(stats, q, names.get(q.source, DEFAULT_SOURCE))
    stats.docs_out = docs
    stats.docs_in = docs + len(quarantined)
    stats.bytes_out = nbytes
    stats.extra["pieces"] = len(plan.pieces)
    if normalize is not None:  # the repairs, counted as the clean stage counts them when it normalises
        stats.extra["normalized_parts"] = 1
        stats.extra["normalize_chars_removed"] = chars_read - chars_kept
        for name in sorted(counts):
            stats.extra[name] = stats.extra.get(name, 0) + counts[name]


def _read_piece(piece: Piece, ctx: readers.ReadContext, stores: _Stores) -> Iterator[Record | Quarantined]:
    """The items of one piece: WARC/WET/ARC through :mod:`pipeline.ingest.warc`, the other formats through
    :mod:`pipeline.ingest.readers`."""
    store, key = stores.locate(piece.uri)
    if piece.fmt not in WEB_FORMATS:
        yield from readers.read_piece(piece, ctx, store, key)
        return
    wet, arc = piece.fmt.startswith("wet"), piece.fmt.startswith("arc")
    if not wet:  # a missing extractor package is the user's to fix: fail before reading, not per record
        html.build_extractor(ctx.cfg.html)
    with streams.open_seekable(store, key, piece.size) as f:
        yield from warc.read_warc(ctx, f, piece.size, wet=wet, gz=piece.fmt.endswith(".gz"), arc=arc)


def _tally_quarantined(stats: StageStats, q: Quarantined, name: str) -> None:
    """A quarantined record in the data card's tally: its bytes are its sample's (at most
    ``QUARANTINE_SAMPLE_BYTES``: a lower bound), its id ``<object URI>#<location>`` as a record's would be."""
    stats.count_doc(q.reason, name, UNKNOWN_LANGUAGE, len(q.sample))
    doc_id = f"{q.source}#{q.location}"
    if stats.wants_example(q.reason, doc_id):
        text = snippet(q.sample.decode("utf-8", "replace")) or snippet(q.detail)
        stats.add_example(
            q.reason,
            {
                "id": doc_id,
                "source": q.source,
                "source_name": name,
                "language": UNKNOWN_LANGUAGE,
                "text": text,
                "detail": snippet(q.detail),
            },
        )


def ingest_part(
    plan: PartPlan, cfg: IngestConfig, s3: S3Options | None, sources: Sequence[SourceConfig] = ()
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
    s3: S3Options | None,
    sources: Sequence[SourceConfig] = (),
    normalize: Normalizer | None = None,
) -> StageStats:
    """The unit of work: ingest one plan into ``out_folder/part-<index>``, streaming (bounded memory however
    large the compressed input); a completed part is not redone. With ``normalize`` every document's text is
    written normalised, and the repairs are counted in ``stats.extra`` (``normalized_parts`` is 1)."""
    if (done := done_part_stats(store, out_folder, plan.index)) is not None:
        return done
    stats = StageStats(stage="ingest")
    quarantined: list[Quarantined] = []
    with PartWriter(store, out_folder, plan.index) as writer:
        writer.write(iter_ingest_part(plan, cfg, stats, quarantined, s3, sources, normalize))
        writer.finish(stats, quarantined)
    log.info(
        "ingest part %d: %d docs, %d quarantined %s",
        plan.index,
        stats.docs_out,
        len(quarantined),
        dict(stats.dropped),
    )
    return stats
