"""WARC and WET inputs (``.warc``, ``.warc.gz``, ``.wet``, ``.wet.gz``): records -> documents, streamed.

Parsed with FastWARC (resiliparse's project; ~2x warcio's records/s here, ``tests/bench/bench_web.py``). A WARC
``response`` record with an HTML payload becomes a document through the configured extractor
(:mod:`pipeline.ingest.html`); a WET ``conversion`` record is text already. Other record types (``warcinfo``,
``request``, ``metadata``) are counted and skipped, and so are non-HTML payloads (by content type) and non-2xx
responses, which are never decoded as text.

A document's id is ``<uri>#B<offset>``: the byte offset of its record in the file (of its gzip member in a
``.gz``, the offset Common Crawl's index gives), so ``pileworks trace`` leads back to the raw record.

Bad input is quarantined with its reason and offset, and the rest of the file goes on: a record cut short
(a gzip member or a file that ends before the record's declared length: ``truncated_record``), ``WARC-Truncated``
records (``warc_truncated``), a record over ``ingest.max_record_bytes`` (``record_too_large``), an HTTP response
without a status line or headers (``malformed_http``), a page that no codec decodes (``unknown_charset`` when its
declared charset is unknown, else ``undecodable``). Where the parser cannot go on (corrupt gzip data, bytes that
are no WARC record: ``corrupt_record``), the reader looks for the next record (gzip member or ``WARC/1.x`` line)
and starts again there.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import BinaryIO

from fastwarc.warc import ArchiveIterator, WarcRecord, WarcRecordType

from pipeline.ingest import html
from pipeline.ingest.encoding import UndecodableError
from pipeline.ingest.readers import Item, ReadContext
from pipeline.records import URL, WARC_DATE

_GZIP_MAGIC = b"\x1f\x8b\x08"
_WARC_MAGIC = b"WARC/1."
_SCAN_CHUNK = 1 << 20
HTML_TYPES = ("text/html", "application/xhtml+xml")
_MAX_TYPE_CHARS = 64  # a content type longer than this is counted as "other"


def read_warc(ctx: ReadContext, f: BinaryIO, size: int, *, wet: bool, gz: bool) -> Iterator[Item]:
    """Every document of a WARC/WET file opened as the seekable ``f`` of ``size`` bytes."""
    next_start: int | None = 0
    records = 0
    while next_start is not None:
        start = next_start
        f.seek(start)
        last = None
        try:
            for rec in ArchiveIterator(f, parse_http=False, stream_detect=True):
                last = rec.stream_pos
                records += 1
                item = _record_item(ctx, rec, last, wet)
                if item is not None:
                    yield item
            next_start = None
        except (OSError, ValueError) as exc:  # FastWARC's errors: corrupt gzip data, no WARC header
            after = start if last is None else last + 1
            bad = _next_record(f, after, gz)
            where = bad if bad is not None else after
            yield ctx.quarantine(
                f"B{where}", "corrupt_record", f"{type(exc).__name__}: {exc}", _sample(f, where)
            )
            next_start = _next_record(f, where + 1, gz) if bad is not None else None
    ctx.extra["warc_records"] += records
    ctx.bytes_read += size


def _next_record(f: BinaryIO, after: int, gz: bool) -> int | None:
    """The offset of the first record start (gzip member, else a ``WARC/1.`` line) at or after ``after``."""
    magic = _GZIP_MAGIC if gz else _WARC_MAGIC
    pos = after
    f.seek(pos)
    tail = b""
    while chunk := f.read(_SCAN_CHUNK):
        data = tail + chunk
        base = pos - len(tail)
        i = data.find(magic)
        while i >= 0:
            if gz or base + i == 0 or data[i - 1 : i] == b"\n":
                return base + i
            i = data.find(magic, i + 1)
        tail = data[-(len(magic) - 1) :]
        pos += len(chunk)
    return None


def _sample(f: BinaryIO, where: int) -> bytes:
    f.seek(where)
    return f.read(4096)


def _record_item(ctx: ReadContext, rec: WarcRecord, offset: int, wet: bool) -> Item | None:
    """The document of one record, its quarantine entry, or None (a record type or payload we skip)."""
    pos = f"B{offset}"
    wanted = WarcRecordType.conversion if wet else WarcRecordType.response
    if rec.record_type != wanted:
        ctx.extra[f"warc_skipped.{rec.record_type}"] += 1
        return None
    length = rec.content_length
    if length > ctx.cfg.max_record_bytes:
        detail = f"record of {length} bytes over ingest.max_record_bytes={ctx.cfg.max_record_bytes}"
        return ctx.quarantine(pos, "record_too_large", detail, rec.reader.read(4096))
    block = rec.reader.read(length)
    if (truncated := rec.headers.get("WARC-Truncated")) is not None:
        return ctx.quarantine(pos, "warc_truncated", f"WARC-Truncated: {truncated}", block)
    if len(block) < length:
        detail = f"record declares {length} bytes, the file holds {len(block)} (cut short)"
        return ctx.quarantine(pos, "truncated_record", detail, block)
    web = {URL: rec.headers.get("WARC-Target-URI") or "", WARC_DATE: rec.headers.get("WARC-Date") or ""}
    meta = {"warc_record_id": rec.headers.get("WARC-Record-ID") or ""}
    if wet:
        return _text_item(ctx, pos, block, web, meta)
    return _response_item(ctx, pos, block, web, meta, rec.headers.get("WARC-Identified-Payload-Type"))


def _text_item(ctx: ReadContext, pos: str, block: bytes, web: dict[str, str], meta: dict[str, str]) -> Item:
    try:
        text, encoding = ctx.decode(block)
    except UndecodableError as exc:
        return ctx.quarantine(pos, exc.code, str(exc), block)
    return ctx.record(pos, text, {**meta, "content_type": "text/plain"}, encoding, web=web)


def split_http(block: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """(status, lower-cased headers, body) of an HTTP response block, or None when it has no status line and
    header section."""
    end = block.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = block.find(b"\n\n"), 2
    if not block.startswith(b"HTTP/") or end < 0:
        return None
    lines = block[:end].decode("latin-1").splitlines()
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip().lower()] = value.strip()
    return int(parts[1]), headers, block[end + sep :]


def _response_item(
    ctx: ReadContext,
    pos: str,
    block: bytes,
    web: dict[str, str],
    meta: dict[str, str],
    identified: str | None,
) -> Item | None:
    http = split_http(block)
    if http is None:
        return ctx.quarantine(pos, "malformed_http", "no HTTP status line and headers", block)
    status, headers, body = http
    if not 200 <= status < 300:
        ctx.extra[f"skipped_http_status.{status // 100}xx"] += 1
        return None
    content_type = headers.get("content-type") or identified or ""
    mime = content_type.split(";")[0].strip().lower()
    if mime not in HTML_TYPES and (mime or not _looks_html(body)):
        ctx.extra[f"skipped_content_type.{mime if 0 < len(mime) <= _MAX_TYPE_CHARS else 'other'}"] += 1
        return None
    try:
        body = _decoded_body(body, headers)
    except (zlib.error, ValueError) as exc:
        return ctx.quarantine(pos, "bad_content_encoding", str(exc)[:200], body)
    meta = {**meta, "content_type": mime or "text/html"}
    return _html_item(ctx, pos, body, html.header_charset(content_type), web, meta)


def _looks_html(body: bytes) -> bool:
    head = body[:512].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _decoded_body(body: bytes, headers: dict[str, str]) -> bytes:
    """The body with chunked transfer coding and gzip/deflate content coding undone (most crawlers store it
    decoded; some keep the server's bytes)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body)
    coding = headers.get("content-encoding", "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(wbits=47).decompress(body)
    if coding == "deflate":
        return zlib.decompressobj().decompress(body)
    if coding not in ("", "identity"):
        raise ValueError(f"unsupported Content-Encoding {coding!r}")
    return body


def _dechunk(body: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            raise ValueError("chunked body without its chunk size line")
        size = int(body[pos:eol].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return b"".join(out)
        out.append(body[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2


def decode_html(ctx: ReadContext, body: bytes, declared: str | None) -> tuple[str, str]:
    """(text, codec) of a page: the HTTP header's charset (``declared``), else the page's ``<meta>``, else our
    detection. Raises UndecodableError (``code`` ``unknown_charset`` when the declared charset is unknown)."""
    label = declared or html.meta_charset(body)
    codec = html.known_charset(label)
    if codec is not None:
        try:
            return body.decode(codec), codec
        except UnicodeDecodeError:
            ctx.extra["charset_mismatch"] += 1  # the declared charset is wrong: detect instead
    elif label:
        ctx.extra["unknown_charset"] += 1
    try:
        return ctx.decode(body)
    except UndecodableError as exc:
        if label and codec is None:
            exc.code = "unknown_charset"
        raise


def _html_item(
    ctx: ReadContext, pos: str, body: bytes, declared: str | None, web: dict[str, str], meta: dict[str, str]
) -> Item:
    """Decode (:func:`decode_html`), then extract the main text."""
    try:
        text, encoding = decode_html(ctx, body, declared)
    except UndecodableError as exc:
        return ctx.quarantine(pos, exc.code, f"charset {declared or html.meta_charset(body)!r}: {exc}", body)
    extracted = html.build_extractor(ctx.cfg.html)(text)
    if not extracted.strip():
        return ctx.quarantine(pos, "no_text_extracted", f"{ctx.cfg.html.extractor} found no main text", body)
    return ctx.record(pos, extracted, meta, encoding, web=web)
