"""Format readers for ingest: raw object bytes -> ``Record`` / ``Quarantined``, streaming, memory-bounded.

Every reader is a generator over one *piece* (a whole object, a byte range of one, or a range of parquet row
groups) that yields a ``Record`` for each good document and a ``Quarantined`` for each bad one, so bad input is
counted where it is found and never stops the good records after it.

A byte range owns the lines that start in it (see :mod:`pipeline.ingest.streams`) and the paragraphs whose
preceding blank line starts in it, so a grid of ranges over a file yields every line/paragraph exactly once.
Ids use byte offsets (``#B<offset>``), which do not depend on how the file was split; compressed streams,
always read whole, use line numbers (``#L<n>``); parquet rows ``#row<n>``; UTF-16/32 paragraphs ``#P<n>``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.config import IngestConfig, Piece
from pipeline.ingest.encoding import (
    MARK_ERRORS,
    UNDECODABLE_MARK,
    FileDecoder,
    InvalidUtf8Error,
    UndecodableError,
    bom_encoding,
    decode_bytes,
    is_line_safe,
    looks_utf8,
    repair_utf8,
)
from pipeline.ingest.streams import DecompressingReader, LineReader, open_seekable
from pipeline.records import QUARANTINE_SAMPLE_BYTES, URL, Quarantined, Record, normalize_url
from pipeline.sources import SOURCE_ENTRY, SOURCE_NAME, USER_META, SourceConfig, source_name
from pipeline.storage import ObjectStore

log = logging.getLogger(__name__)

Item = Record | Quarantined
# One decoder (json.loads with options builds one per call). strict=False accepts raw control characters
# (NUL...) inside strings: removing them is clean's job, not a reason to drop the document.
_JSON = json.JSONDecoder(strict=False)
MAX_META_FIELD_CHARS = 2048  # longer top-level string fields are not copied into meta
HEAD_SNIFF_BYTES = 64 * 1024  # how much of a file's head tells whether the file is UTF-8


@dataclass
class ReadContext:
    """What a reader needs to turn bytes into records for one input object, and the counters it feeds."""

    uri: str
    fmt: str
    cfg: IngestConfig
    extra: Counter[str] = field(default_factory=Counter)
    decoder: FileDecoder | None = None
    bytes_read: int = 0
    utf8_file: bool = False  # the file's head, or an earlier chunk, held valid non-ASCII UTF-8
    # The first HEAD_SNIFF_BYTES of the (decompressed) object, fetched only when a chunk is not strict UTF-8.
    head: Callable[[], bytes] | None = None
    source: SourceConfig | None = None  # the configured source this object belongs to
    entry: int = 0  # its index in the corpus config's sources

    def __post_init__(self) -> None:
        self.decoder = FileDecoder(min_confidence=self.cfg.min_detect_confidence)

    def quarantine(self, location: str, reason: str, detail: str = "", sample: bytes = b"") -> Quarantined:
        return Quarantined(self.uri, location, reason, detail, sample[:QUARANTINE_SAMPLE_BYTES])

    def record(
        self,
        pos: str,
        text: str,
        meta: dict[str, Any],
        encoding: str,
        doc_id: str | None = None,
        web: dict[str, str] | None = None,
    ) -> Item:
        """A Record, or a Quarantined ``empty_doc``; NULs are counted here and left for clean to handle.
        ``web``: the document's URL and crawl date (``pipeline.records.URL``, ``WARC_DATE``), kept beside our provenance."""
        if not text.strip():
            return self.quarantine(
                pos, "empty_doc", "no non-whitespace text", text.encode("utf-8", "replace")
            )
        nuls = text.count("\x00")
        if nuls:
            self.extra["docs_with_nul"] += 1
            self.extra["nul_chars"] += nuls
        self.extra[f"encoding.{encoding}"] += 1
        name = (
            source_name(self.source, meta) if self.source is not None else (meta.get("pile_set_name") or "")
        )
        # Our provenance beside the user's meta (namespaced, so a user key named "offset" or "location"
        # is neither overwritten nor mistaken for ours).
        name = name if isinstance(name, str) and name else "default"
        self.extra[f"source.{name}"] += 1
        if web is None and self.cfg.url_field is not None:
            url = meta.get(self.cfg.url_field)
            url = normalize_url(url) if isinstance(url, str) else ""
            web = {URL: url} if url else None
        ours: dict[str, Any] = {
            "format": self.fmt,
            "encoding": encoding,
            "offset": pos,
            SOURCE_NAME: name,
            SOURCE_ENTRY: self.entry,
            **{k: v for k, v in (web or {}).items() if v},
            USER_META: meta,
        }
        rid = doc_id if doc_id is not None else f"{self.uri}#{pos}"
        return Record(rid, text, self.uri, json.dumps(ours, ensure_ascii=False, default=str))

    def decode(self, data: bytes) -> tuple[str, str]:
        """(text, codec): strict UTF-8 inline (the common case), then UTF-8 with its invalid bytes replaced
        (or refused, ``invalid_utf8="quarantine"``), else the per-file detecting decoder."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            self.utf8_file = self.utf8_file or len(text) != len(data)
            return text, "utf-8"
        if not self.utf8_file and self.head is not None:
            self.utf8_file = looks_utf8(self.head())
            self.head = None
        if bom_encoding(data) is None and (repaired := repair_utf8(data, file_is_utf8=self.utf8_file)):
            if self.cfg.invalid_utf8 == "quarantine":
                raise InvalidUtf8Error(f"{repaired[1]} invalid UTF-8 byte(s) in otherwise valid UTF-8")
            self.extra["repaired_invalid_utf8"] += 1
            self.extra["invalid_utf8_bytes"] += repaired[1]
            return repaired[0], "utf-8"
        assert self.decoder is not None
        decoded = self.decoder.decode(data)
        return decoded.text, decoded.encoding


# ---------------------------------------------------------------- formats


def _meta_of(obj: dict[str, Any], cfg: IngestConfig) -> dict[str, Any]:
    """The record's meta object plus its other top-level fields (url, timestamp...); never the text."""
    raw = obj.get(cfg.meta_field)
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            raw = json.loads(raw)
    meta: dict[str, Any] = dict(raw) if isinstance(raw, dict) else ({} if raw is None else {"meta": raw})
    for key, value in obj.items():  # scalars only: a second big field (raw html...) must not bloat meta
        if key not in (cfg.text_field, cfg.meta_field, cfg.id_field) and _is_small_scalar(value):
            meta.setdefault(key, value)
    return meta


def _is_small_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_META_FIELD_CHARS
    return value is None or isinstance(value, (bool, int, float))


def _document(ctx: ReadContext, pos: str, obj: Any, encoding: str) -> Item:
    """One JSON object / parquet row -> Record, or the reason it cannot be one."""
    cfg = ctx.cfg
    if not isinstance(obj, dict):
        return ctx.quarantine(pos, "malformed_json", f"expected a JSON object, got {type(obj).__name__}")
    text = obj.get(cfg.text_field)
    if text is None:
        return ctx.quarantine(
            pos, "missing_text", f"no {cfg.text_field!r} field", json.dumps(obj, default=str)[:4096].encode()
        )
    if isinstance(text, bytes):
        try:
            decoded = decode_bytes(text, min_confidence=cfg.min_detect_confidence)
        except UndecodableError as e:
            return ctx.quarantine(pos, "undecodable", str(e), text)
        text, encoding = decoded.text, decoded.encoding
    if not isinstance(text, str):
        return ctx.quarantine(
            pos, "non_string_text", f"{cfg.text_field!r} is {type(text).__name__}", repr(text).encode()
        )
    if len(text) > cfg.max_doc_bytes // 4 and len(text.encode("utf-8", "surrogatepass")) > cfg.max_doc_bytes:
        return ctx.quarantine(
            pos, "doc_too_large", f"text over max_doc_bytes={cfg.max_doc_bytes}", text[:4096].encode()
        )
    doc_id = obj.get(cfg.id_field) if cfg.id_field else None
    return ctx.record(pos, text, _meta_of(obj, cfg), encoding, None if doc_id is None else str(doc_id))


StreamError = Callable[[], "tuple[str, str] | None"]


def no_stream_error() -> tuple[str, str] | None:
    return None


def read_jsonl(
    ctx: ReadContext, lines: LineReader, compressed: bool, stream_error: StreamError = no_stream_error
) -> Iterator[Item]:
    """One JSON object per line. A damaged compressed stream costs only its last, incomplete line."""
    number = 0
    for number, line in enumerate(lines, start=1):
        pos = f"L{number}" if compressed else f"B{line.offset}"
        complete = line.data.endswith(b"\n") or line.too_large
        if not complete and (error := stream_error()) is not None:
            yield ctx.quarantine(pos, error[0], error[1], line.data)
            return
        if line.too_large:
            yield ctx.quarantine(
                pos, "doc_too_large", f"line over max_doc_bytes={ctx.cfg.max_doc_bytes}", line.data
            )
        elif not line.data.strip():
            ctx.extra["blank_lines"] += 1
        else:
            yield _json_line(ctx, pos, line.data)
    if (error := stream_error()) is not None:
        yield ctx.quarantine(f"L{number + 1}", error[0], error[1] + " (after the last complete line)")


def _json_line(ctx: ReadContext, pos: str, data: bytes) -> Item:
    try:
        text, encoding = ctx.decode(data)
    except UndecodableError as e:
        return ctx.quarantine(pos, e.code, str(e), data)
    try:
        obj = _JSON.decode(text.lstrip("\ufeff"))  # a UTF-8 BOM (Windows tools) before the first line
    except (ValueError, RecursionError) as e:
        return ctx.quarantine(pos, "malformed_json", str(e)[:200], data)
    return _document(ctx, pos, obj, encoding)


def _paragraphs(lines: LineReader, end: int | None, max_doc: int) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, bytes, too_large) of the blank-line separated blocks this range owns.

    A paragraph belongs to the range holding the blank line just before it (the file start counts as one,
    owned by the range starting at 0), so the reader sees the owning line and may read past ``end`` to
    finish the paragraph. ``lines`` must be unbounded (end=None); ``end`` is applied here.
    """
    prev_blank = lines.start == 0
    para: list[bytes] | None = None
    offset, size, too_large = 0, 0, False
    for line in lines:
        blank = not line.too_large and not line.data.removeprefix(b"\xef\xbb\xbf").strip()
        if para is not None and not blank:
            size += len(line.data)
            too_large = too_large or line.too_large or size > max_doc
            if not too_large:
                para.append(line.data)
            continue
        if para is not None:
            yield offset, b"".join(para), too_large
            para = None
        if not blank and prev_blank:
            offset, size, too_large = line.offset, len(line.data), line.too_large or len(line.data) > max_doc
            para = [line.data]
        elif end is not None and line.offset >= end:
            return
        prev_blank = blank
    if para is not None:
        yield offset, b"".join(para), too_large


def read_txt_paragraphs(
    ctx: ReadContext, lines: LineReader, end: int | None, stream_error: StreamError = no_stream_error
) -> Iterator[Item]:
    held: tuple[int, bytes, bool] | None = None  # one behind: a damaged stream's last paragraph may be cut
    for para in _paragraphs(lines, end, ctx.cfg.max_doc_bytes):
        if held is not None:
            yield _paragraph_item(ctx, *held)
        held = para
    if (error := stream_error()) is not None:
        where, sample = (f"B{held[0]}", held[1]) if held is not None else ("end", b"")
        yield ctx.quarantine(where, error[0], error[1] + " (the last paragraph may be cut)", sample)
    elif held is not None:
        yield _paragraph_item(ctx, *held)


def _paragraph_item(ctx: ReadContext, offset: int, data: bytes, too_large: bool) -> Item:
    pos = f"B{offset}"
    if too_large:
        return ctx.quarantine(
            pos, "doc_too_large", f"paragraph over max_doc_bytes={ctx.cfg.max_doc_bytes}", data
        )
    try:
        text, encoding = ctx.decode(data)
    except UndecodableError as e:
        return ctx.quarantine(pos, e.code, str(e), data)
    return ctx.record(pos, text.lstrip("\ufeff").rstrip("\r\n"), {}, encoding)


def read_txt_file(
    ctx: ReadContext, f: BinaryIO, stream_error: StreamError = no_stream_error
) -> Iterator[Item]:
    """The whole object is one document (read at most max_doc_bytes + 1 bytes of it)."""
    data = f.read(ctx.cfg.max_doc_bytes + 1)
    ctx.bytes_read += len(data)
    if len(data) > ctx.cfg.max_doc_bytes:
        yield ctx.quarantine("B0", "doc_too_large", f"file over max_doc_bytes={ctx.cfg.max_doc_bytes}", data)
        return
    if (error := stream_error()) is not None:
        yield ctx.quarantine("B0", error[0], error[1], data)
        return
    try:
        decoded = decode_bytes(data, min_confidence=ctx.cfg.min_detect_confidence)
    except UndecodableError as e:
        yield ctx.quarantine("B0", "undecodable", str(e), data)
        return
    yield ctx.record("B0", decoded.text, {}, decoded.encoding)


def _text_blocks(text: io.TextIOWrapper, limit: int) -> Iterator[tuple[str, bool]]:
    """(paragraph, too_large) from decoded lines; a paragraph over ``limit`` characters keeps only a sample."""
    para: list[str] = []
    size, too_large = 0, False
    for line in iter(lambda: text.readline(limit), ""):
        if line.strip():
            size += len(line)
            too_large = too_large or size > limit
            if not too_large or not para:
                para.append(line if not too_large else line[:QUARANTINE_SAMPLE_BYTES])
            continue
        if para:
            yield "".join(para), too_large
            para, size, too_large = [], 0, False
    if para:
        yield "".join(para), too_large


def read_text_paragraphs_unsafe(ctx: ReadContext, f: BinaryIO, encoding: str) -> Iterator[Item]:
    """Paragraphs of a UTF-16/32 file (newline is not one byte, so no byte ranges): numbered ``#P<n>``."""
    text = io.TextIOWrapper(f, encoding=encoding, errors=MARK_ERRORS, newline=None)
    try:
        for number, (para, too_large) in enumerate(_text_blocks(text, ctx.cfg.max_doc_bytes)):
            pos = f"P{number}"
            if too_large:
                detail = f"paragraph over {ctx.cfg.max_doc_bytes} characters"
                yield ctx.quarantine(pos, "doc_too_large", detail, para.encode("utf-8", "replace"))
            elif UNDECODABLE_MARK in para:
                detail = f"invalid {encoding} at character {para.index(UNDECODABLE_MARK)} of the paragraph"
                yield ctx.quarantine(pos, "undecodable", detail, para.encode("utf-8", "replace"))
            else:
                yield ctx.record(pos, para.rstrip("\n"), {}, encoding)
    finally:
        text.detach()  # the caller closes the byte stream


def sniff_bom(store: ObjectStore, key: str) -> str | None:
    return bom_encoding(store.get_range(key, 0, 4))


def read_parquet(ctx: ReadContext, f: BinaryIO, first_group: int, end_group: int | None) -> Iterator[Item]:
    """Rows of row groups ``[first_group, end_group)``, ids ``#row<n>`` counted from the start of the file."""
    pf = pq.ParquetFile(f)
    cfg = ctx.cfg
    names = set(pf.schema_arrow.names)
    if cfg.text_field not in names:
        yield ctx.quarantine(
            "row0", "missing_text", f"no column {cfg.text_field!r} (columns: {sorted(names)})"
        )
        return
    columns = [c for c in (cfg.text_field, cfg.meta_field, cfg.id_field) if c and c in names]
    end = pf.num_row_groups if end_group is None else min(end_group, pf.num_row_groups)
    row = sum(pf.metadata.row_group(g).num_rows for g in range(first_group))
    for group in range(first_group, end):
        meta = pf.metadata.row_group(group)
        ctx.bytes_read += sum(  # the column chunks read (a struct column has one chunk per leaf)
            meta.column(i).total_compressed_size
            for i in range(meta.num_columns)
            if meta.column(i).path_in_schema.split(".")[0] in columns
        )
        for batch in pf.iter_batches(row_groups=[group], columns=columns, batch_size=1024):
            for obj in pa.Table.from_batches([batch]).to_pylist():
                yield _document(ctx, f"row{row}", obj, "utf-8")
                row += 1


# ---------------------------------------------------------------- pieces


def read_piece(piece: Piece, ctx: ReadContext, store: ObjectStore, key: str) -> Iterator[Item]:
    """Records and quarantined items of one piece, by format; I/O errors propagate to the caller."""
    base, _, compression = piece.fmt.partition(".")
    if base == "parquet":
        with open_seekable(store, key, piece.size) as f:
            yield from read_parquet(ctx, f, piece.start, piece.end)
        return
    if compression:
        dec = DecompressingReader(store.open_read(key), compression)
        with io.BufferedReader(dec, buffer_size=1 << 20) as f:
            head = f.peek(HEAD_SNIFF_BYTES)[:HEAD_SNIFF_BYTES]  # bytes still unread: nothing is lost
            ctx.head = lambda: head
            try:
                yield from _read_text_stream(piece, ctx, f, lambda: dec.error)
            finally:  # compressed bytes, replacing the decompressed count _read_text_stream added
                ctx.bytes_read = dec.compressed_bytes
        return
    ctx.head = lambda: store.get_range(key, 0, min(HEAD_SNIFF_BYTES, piece.size))
    bom = sniff_bom(store, key) if piece.start > 0 else None
    with store.open_read(key) if piece.start == 0 else open_seekable(store, key, piece.size) as f:
        if piece.start > 0:
            if bom is not None and not is_line_safe(bom):
                log.warning(
                    "ingest: %s is %s and cannot be read from byte %d; skipped", piece.uri, bom, piece.start
                )
                return
            f.seek(piece.start - 1)
        yield from _read_text_stream(piece, ctx, f, no_stream_error)


def _read_text_stream(piece: Piece, ctx: ReadContext, f: Any, stream_error: StreamError) -> Iterator[Item]:
    cfg = ctx.cfg
    base = piece.fmt.partition(".")[0]
    if base == "txt" and cfg.txt_mode == "file":
        yield from read_txt_file(ctx, f, stream_error)
        return
    if base == "txt" and piece.start == 0:
        bom = bom_encoding(f.peek(4)[:4])
        if bom is not None and not is_line_safe(bom):
            yield from read_text_paragraphs_unsafe(ctx, f, bom)
            ctx.bytes_read += piece.size
            return
    end = piece.end
    lines = LineReader(f, piece.start, None if base == "txt" else end, cfg.max_doc_bytes)
    try:
        if base == "txt":
            yield from read_txt_paragraphs(ctx, lines, end, stream_error)
        else:
            yield from read_jsonl(ctx, lines, compressed="." in piece.fmt, stream_error=stream_error)
    finally:  # the bytes this range owns (its last line may run past `end`: that is the next range's share)
        owned_end = lines.pos if piece.end is None else min(lines.pos, piece.end)
        ctx.bytes_read += max(owned_end - piece.start, 0)
