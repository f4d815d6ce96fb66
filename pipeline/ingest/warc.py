"""Web archives (``.warc``, ``.warc.gz``, ``.wet``, ``.wet.gz``, ``.arc``, ``.arc.gz``): records -> documents,
streamed.

Parsed with FastWARC (resiliparse's project; ~2x warcio's records/s here, ``tests/bench/bench_web.py``) where it
can: WARC and WET files whose record headers end their lines with CRLF, as the standard says. Two layouts it
cannot read go through warcio's ``ArchiveIterator``, which reads them: ARC files (the Internet Archive's format
before WARC, read with their URL and date) and archives whose record headers end lines with LF alone (cc_net's WET
samples, some older crawlers). A WARC gzipped as one whole file (not one gzip member per record) is read through
a decompressing stream. A WARC ``response`` record (an ARC record) with an HTML payload becomes a document through
the configured extractor (:mod:`pipeline.ingest.html`); a WET ``conversion`` record is text already. Other record
types (``warcinfo``, ``request``, ``metadata``) are counted and skipped, and so are non-HTML payloads (by content
type) and non-2xx responses, which are never decoded as text.

HTTP messages are read as crawlers store them (:func:`split_http`, :func:`decoded_body`): header sections that end
with LF alone (ClueWeb09), and ``Transfer-Encoding``/``Content-Encoding`` headers kept over a body the crawler
already decoded (pywb/webrecorder, ClueWeb09): the decoding is tried and, when the body does not follow the
header, the body is used as stored and counted as ``encoding_mismatch``. gzip, deflate, brotli and zstd bodies are
decoded. URLs are stored as :func:`pipeline.records.normalize_url` gives them (``<https://…>`` without brackets).

A document's id is ``<name>#B<offset>`` (``name``: the file under the input root): the byte offset of its record in
the file (of its gzip member in a ``.gz``, the offset Common Crawl's index gives), so ``pileworks trace`` leads
back to the raw record. In a WARC gzipped as one whole file no record has a member of its own: the id is
``<name>#U<offset>``, the record's offset in the decompressed file (``zcat FILE | tail -c +$((OFFSET + 1))`` starts
with it).

Bad input is quarantined with its reason and offset, and the rest of the file goes on: a record cut short
(a gzip member or a file that ends before the record's declared length: ``truncated_record``), ``WARC-Truncated``
records (``warc_truncated``), a record over ``ingest.max_record_bytes`` (``record_too_large``), an HTTP response
without a status line or headers (``malformed_http``), a body that is encoded and that no decoder reads
(``bad_content_encoding``), a page that no codec decodes (``unknown_charset`` when its declared charset is
unknown, else ``undecodable``). Where the parser cannot go on (corrupt gzip data, bytes that are no WARC record:
``corrupt_record``), the reader looks for the next record (gzip member or ``WARC/`` line) and starts again there.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import brotli  # FastWARC's dependency
import zstandard
from fastwarc.warc import ArchiveIterator
from warcio.archiveiterator import ArchiveIterator as WarcioIterator
from warcio.exceptions import ArchiveLoadFailed

from pipeline.ingest import html
from pipeline.ingest.encoding import UndecodableError, bom_encoding, decode_bytes
from pipeline.ingest.readers import Item, ReadContext
from pipeline.ingest.streams import DecompressingReader
from pipeline.records import URL, WARC_DATE, normalize_url

_GZIP_MAGIC = b"\x1f\x8b\x08"
_WARC_MAGIC = b"WARC/"
_SCAN_CHUNK = 1 << 20
_SNIFF_CHUNK = 16 * 1024
_SNIFF_LIMIT = 8 << 20  # decompressed bytes looked at to tell a whole-file gzip from one member per record
_HEADER_END = re.compile(rb"\r?\n\r?\n")
HTML_TYPES = ("text/html", "application/xhtml+xml")
_MAX_TYPE_CHARS = 64  # a content type longer than this is counted as "other"
_WARCIO_ERRORS = (ArchiveLoadFailed, EOFError, ValueError, OSError, zlib.error)


@dataclass(slots=True)
class _Record:
    """One record as either parser gives it. ``offset()`` is called once the record's block has been read
    (warcio knows where a record of a gzip member file starts only then)."""

    type: str
    length: int
    header: Callable[[str], str | None]
    read: Callable[[int], bytes]
    offset: Callable[[], int]


@dataclass(frozen=True, slots=True)
class _Layout:
    whole_gzip: bool  # one gzip stream over many records
    lf: bool  # record headers end their lines with LF alone


def read_warc(
    ctx: ReadContext, f: BinaryIO, size: int, *, wet: bool, gz: bool, arc: bool = False
) -> Iterator[Item]:
    """Every document of a WARC/WET/ARC file opened as the seekable ``f`` of ``size`` bytes."""
    layout = _sniff(f, gz)
    counted = [0]
    if layout.whole_gzip:
        yield from _read_whole_gzip(ctx, f, wet=wet, counted=counted)
    else:
        yield from _read_members(ctx, f, wet=wet, gz=gz, warcio=arc or layout.lf, counted=counted)
    ctx.extra["warc_records"] += counted[0]
    ctx.bytes_read += size


def _records(f: BinaryIO, warcio: bool) -> Iterator[_Record]:
    """The records of ``f`` from its current position."""
    if not warcio:
        for rec in ArchiveIterator(f, parse_http=False, stream_detect=True):
            yield _Record(
                str(rec.record_type),
                rec.content_length,
                rec.headers.get,
                rec.reader.read,
                _at(rec.stream_pos),
            )
        return
    it = WarcioIterator(f, no_record_parse=True, arc2warc=True)
    for rec in it:
        yield _Record(
            rec.rec_type,
            rec.length or 0,
            rec.rec_headers.get_header,
            rec.raw_stream.read,
            it.get_record_offset,
        )


def _at(pos: int) -> Callable[[], int]:
    return lambda: pos


def _read_members(
    ctx: ReadContext, f: BinaryIO, *, wet: bool, gz: bool, warcio: bool, counted: list[int]
) -> Iterator[Item]:
    next_start: int | None = 0
    while next_start is not None:
        start = next_start
        f.seek(start)
        last = None
        try:
            for rec in _records(f, warcio):
                counted[0] += 1
                item = _record_item(ctx, rec, wet, "B")
                last = rec.offset()
                if item is not None:
                    yield item
            next_start = None
        except (OSError, ValueError, *_WARCIO_ERRORS) as exc:  # corrupt gzip data, no record header
            if last is None:  # the parser fails where it started: the record there is bad
                yield ctx.quarantine(
                    f"B{start}", "corrupt_record", f"{type(exc).__name__}: {exc}", _sample(f, start)
                )
                next_start = _next_record(f, start + 1, gz)
            else:  # it failed after a good record: start again at the next record start, which is tried as
                # it is (a Content-Length one byte short, as in pywb's sample, leaves bytes before a good one)
                ctx.extra["warc_resynced"] += 1
                next_start = _next_record(f, last + 1, gz)


def _read_whole_gzip(ctx: ReadContext, f: BinaryIO, *, wet: bool, counted: list[int]) -> Iterator[Item]:
    """A WARC gzipped as one stream: read decompressed, ids at offsets in the decompressed file (``U``). Through
    warcio, which reads a stream it cannot seek (FastWARC seeks)."""
    f.seek(0)
    dec = DecompressingReader(
        f, "gz"
    )  # done with once this generator is: closing it closes f, as the caller would
    stream = io.BufferedReader(dec, buffer_size=1 << 20)
    last = 0
    try:
        for rec in _records(stream, warcio=True):
            counted[0] += 1
            item = _record_item(ctx, rec, wet, "U")
            last = rec.offset()
            if item is not None:
                yield item
    except (OSError, ValueError, *_WARCIO_ERRORS) as exc:  # no way to the next record inside one gzip stream
        yield ctx.quarantine(f"U{last}", "corrupt_record", f"{type(exc).__name__}: {exc}")
    if dec.error is not None:  # a stream cut short cut its last record short: that record says so
        code, detail = dec.error
        ctx.extra[f"gzip_{code}"] += 1
        if code == "corrupt_stream":
            yield ctx.quarantine(f"U{last}", "corrupt_record", detail)


def _sniff(f: BinaryIO, gz: bool) -> _Layout:
    """How the file is laid out, from its first record: one gzip stream over many records, LF-only headers."""
    f.seek(0)
    if not gz:
        head = f.read(_SNIFF_CHUNK)
        f.seek(0)
        return _Layout(whole_gzip=False, lf=_lf_only(head))
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    whole = False
    try:
        while len(out) <= _SNIFF_LIMIT and (chunk := f.read(_SNIFF_CHUNK)):
            out += d.decompress(chunk)
            end = _first_record_end(bytes(out[:_SNIFF_LIMIT]))
            if end is not None and len(out) > end + 8:  # the first member holds more than the first record
                whole = True
                break
            if d.eof:  # the first member ends with the first record: one member per record
                break
    except zlib.error:  # no gzip data at the head: the reader quarantines what it finds
        pass
    f.seek(0)
    return _Layout(whole_gzip=whole, lf=_lf_only(bytes(out[:_SNIFF_CHUNK])))


def _lf_only(head: bytes) -> bool:
    line = head.split(b"\n", 1)[0]
    return head.startswith(_WARC_MAGIC) and b"\n" in head and not line.endswith(b"\r")


def _first_record_end(out: bytes) -> int | None:
    """Where the first record of a decompressed WARC (or ARC) ends, once its header is in ``out``."""
    if out.startswith(b"filedesc://"):  # ARC: the version block's length ends the first line
        eol = out.find(b"\n")
        if eol < 0:
            return None
        fields = out[:eol].split()
        return eol + 1 + int(fields[-1]) if fields and fields[-1].isdigit() else None
    m = _HEADER_END.search(out)
    if m is None or not out.startswith(_WARC_MAGIC):
        return None
    for line in out[: m.start()].split(b"\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length" and value.strip().isdigit():
            return m.end() + int(value.strip())
    return None


def _next_record(f: BinaryIO, after: int, gz: bool) -> int | None:
    """The offset of the first record start (gzip member, else a ``WARC/`` line) at or after ``after``."""
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


def _record_item(ctx: ReadContext, rec: _Record, wet: bool, mark: str) -> Item | None:
    """The document of one record, its quarantine entry, or None (a record type or payload we skip)."""
    wanted = "conversion" if wet else "response"
    if rec.type != wanted:
        ctx.extra[f"warc_skipped.{rec.type}"] += 1
        return None
    url = normalize_url(rec.header("WARC-Target-URI") or "")
    length = rec.length
    if length > ctx.cfg.max_record_bytes:
        sample = rec.read(4096)
        detail = f"record of {length} bytes over ingest.max_record_bytes={ctx.cfg.max_record_bytes}"
        return ctx.quarantine(f"{mark}{rec.offset()}", "record_too_large", detail, sample)
    block = rec.read(length)
    pos = f"{mark}{rec.offset()}"
    if (truncated := rec.header("WARC-Truncated")) is not None:
        return ctx.quarantine(pos, "warc_truncated", f"WARC-Truncated: {truncated}", block)
    if len(block) < length:
        detail = f"record declares {length} bytes, the file holds {len(block)} (cut short)"
        return ctx.quarantine(pos, "truncated_record", detail, block)
    if not wet and url and not url.lower().startswith(("http:", "https:")):  # ARC's dns:, filedesc:
        ctx.extra["warc_skipped.not_http"] += 1
        return None
    web = {URL: url, WARC_DATE: rec.header("WARC-Date") or ""}
    meta = {"warc_record_id": rec.header("WARC-Record-ID") or ""}
    if wet:
        return _text_item(ctx, pos, block, web, meta)
    return _response_item(ctx, pos, block, web, meta, rec.header("WARC-Identified-Payload-Type"))


def _text_item(ctx: ReadContext, pos: str, block: bytes, web: dict[str, str], meta: dict[str, str]) -> Item:
    try:
        text, encoding = ctx.decode(block)
    except UndecodableError as exc:
        return ctx.quarantine(pos, exc.code, str(exc), block)
    return ctx.record(pos, text, {**meta, "content_type": "text/plain"}, encoding, web=web)


def split_http(block: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """(status, lower-cased headers, body) of an HTTP response block, or None when it has no status line and
    header section. The header section ends at the first empty line, CRLF or LF alone (ClueWeb09 and other
    crawlers store LF-only headers: looking for CRLF CRLF there finds one inside the page)."""
    if not block.startswith(b"HTTP/"):
        return None
    m = _HEADER_END.search(block)
    if m is None:
        return None
    lines = block[: m.start()].decode("latin-1").splitlines()
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip().lower()] = value.strip()
    return int(parts[1]), headers, block[m.end() :]


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
        body, mismatch = decoded_body(body, headers)
    except ValueError as exc:
        return ctx.quarantine(pos, "bad_content_encoding", str(exc)[:200], body)
    if mismatch:
        ctx.extra["encoding_mismatch"] += 1
    meta = {**meta, "content_type": mime or "text/html"}
    return _html_item(ctx, pos, body, html.header_charset(content_type), web, meta)


def _looks_html(body: bytes) -> bool:
    head = body[:512].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _gunzip(body: bytes) -> bytes:
    if not body.startswith(b"\x1f\x8b"):
        raise ValueError("no gzip header")
    return zlib.decompressobj(wbits=47).decompress(body)


def _inflate(body: bytes) -> bytes:
    try:  # zlib-wrapped, as the standard says; raw deflate, as some servers send
        return zlib.decompressobj().decompress(body)
    except zlib.error:
        return zlib.decompressobj(wbits=-15).decompress(body)


def _unzstd(body: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(body)


_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gunzip,
    "x-gzip": _gunzip,
    "deflate": _inflate,
    "br": brotli.decompress,
    "zstd": _unzstd,
}
_DECODE_ERRORS = (zlib.error, brotli.error, zstandard.ZstdError, ValueError, EOFError)


def decoded_body(body: bytes, headers: dict[str, str]) -> tuple[bytes, bool]:
    """(body, mismatch): the body with its chunked transfer coding and its content codings (gzip, deflate, br,
    zstd) undone. Crawlers store bodies decoded or as the server sent them, and many keep the headers either way;
    a coding the body does not follow is skipped and ``mismatch`` is True. Raises ValueError when the body is
    encoded (not text) in a way no decoder here reads."""
    mismatch = False
    if "chunked" in headers.get("transfer-encoding", "").lower():
        try:
            body = _dechunk(body)
        except ValueError:
            mismatch = True
    codings = [c.strip() for c in headers.get("content-encoding", "").lower().split(",")]
    for coding in reversed([c for c in codings if c and c != "identity"]):
        decoder = _DECODERS.get(coding)
        try:
            if decoder is None:
                raise ValueError(f"unsupported Content-Encoding {coding!r}")
            body = decoder(body)
        except _DECODE_ERRORS as exc:
            if _binary(body):
                raise ValueError(f"Content-Encoding {coding!r}: {exc}") from exc
            mismatch = True
            break
    return body, mismatch


def _binary(data: bytes) -> bool:
    """Whether the head of ``data`` is compressed or binary bytes rather than text in some charset: a NUL, or
    more than 2% C0 control bytes other than whitespace and ESC (text in any ASCII-compatible charset has
    almost none; compressed data has about 10%)."""
    head = data[:4096]
    if not head:
        return False
    controls = sum(head.count(bytes([b])) for b in _CONTROLS)
    return b"\x00" in head or controls > len(head) * 0.02


_CONTROLS = [b for b in range(32) if b not in (9, 10, 12, 13, 27)]


def _dechunk(body: bytes) -> bytes:
    """The body of a chunked message. A body that does not start with a chunk-size line is not chunked
    (ValueError); one cut short after whole chunks keeps what it has."""
    out: list[bytes] = []
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0 or eol - pos > 64:
            if out and pos >= len(body):
                return b"".join(out)
            raise ValueError("chunked body without its chunk size line")
        size_field = body[pos:eol].split(b";")[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            raise ValueError(f"chunk size {size_field[:20]!r} is no hex number") from None
        if size == 0:
            return b"".join(out)
        chunk = body[eol + 2 : eol + 2 + size]
        out.append(chunk)
        pos = eol + 2 + size
        if pos >= len(body):  # cut short: whole chunks kept
            return b"".join(out)
        if body[pos : pos + 2] != b"\r\n":
            raise ValueError("chunk not followed by CRLF")
        pos += 2


def decode_html(ctx: ReadContext, body: bytes, declared: str | None) -> tuple[str, str]:
    """(text, codec) of a page: its byte-order mark, else the HTTP header's charset (``declared``), else the
    page's ``<meta>``, else our detection. Raises UndecodableError (``code`` ``unknown_charset`` when the declared
    charset is unknown)."""
    if (
        bom_encoding(body) is not None
    ):  # the HTML standard's first rule, over the header: the mark is not text
        decoded = decode_bytes(body)  # (kept, a U+FEFF before <!DOCTYPE> puts the <title> in the body's text)
        return decoded.text, decoded.encoding
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
