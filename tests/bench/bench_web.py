"""Web ingest per core: WARC reading and HTML extraction on real HTML, against datatrove (WarcReader + Trafilatura).

The pages are the HTML documentation Debian packages install on this machine (``/usr/share/doc/**/*.html``),
each wrapped into a WARC ``response`` record with real HTTP headers (status line, Content-Type with the page's
charset, Content-Length, Date, Server) and a ``WARC-Identified-Payload-Type`` as Common Crawl writes it.
For each reader and extractor: records/s and MB/s of HTML per core (CPU seconds of the process and of the
children it waited for: datatrove extracts in a sandbox subprocess), and how often our text equals datatrove's
text for the same record. Quality, with no gold text at hand: the share of each page's visible words (lxml's
text of ``<body>`` without script/style) the extractor keeps, pages with no text out, and pages whose text still
holds an HTML tag of the page's own markup.

    .venv/bin/python tests/bench/bench_web.py [--limit N] [--extractors resiliparse,trafilatura,justext]

Measured on the 2-core build machine (295 pages, 25.4 MB of HTML; per core):

    read: pileworks (fastwarc + HTTP + charset)   1698 records/s  146 MB/s
    read: datatrove WarcReader (warcio)           1723 records/s  148 MB/s
    read+extract: pileworks resiliparse            156 records/s   13.4 MB/s
    read+extract: pileworks trafilatura            7.3 records/s   0.63 MB/s   99.3% texts = datatrove's
    read+extract: pileworks justext               23.3 records/s   2.0 MB/s
    read+extract: datatrove Trafilatura            7.0 records/s   0.60 MB/s
    visible words kept / pages without text: resiliparse 78.8% / 1, trafilatura 72.8% / 17, justext 49.2% / 97

Needs the extras (``pip install 'pileworks[trafilatura,justext]'``) and, benchmark-only, datatrove with
faust-cchardet and python-magic (its WARC reader imports them).
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import re
import resource
import tempfile
from email.utils import formatdate
from pathlib import Path

from fastwarc.warc import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from pipeline.ingest import html as web_html
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.encoding import UndecodableError
from pipeline.ingest.html import HtmlConfig
from pipeline.ingest.readers import ReadContext
from pipeline.ingest.warc import decode_html, read_warc, split_http
from pipeline.records import Record

_TAG = re.compile(r"</?(?:div|span|p|a|table|td|tr|li|ul|body|html|head|script|style)\b[^>]*>", re.I)


def cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def make_warc(out: Path, limit: int) -> tuple[int, int]:
    """The pages as one ``.warc.gz`` of responses; (records, HTML bytes)."""
    paths = sorted(p for p in glob.glob("/usr/share/doc/**/*.htm*", recursive=True) if os.path.isfile(p))[
        :limit
    ]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    total = 0
    for i, path in enumerate(paths):
        body = Path(path).read_bytes()
        total += len(body)
        charset = web_html.meta_charset(body) or "utf-8"
        headers = [
            ("Date", formatdate(1_700_000_000 + i, usegmt=True)),
            ("Server", "Apache/2.4.62 (Debian)"),
            ("Content-Type", f"text/html; charset={charset}"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        http = StatusAndHeaders("200 OK", headers, protocol="HTTP/1.1")
        url = "https://docs.example.org" + path.removeprefix("/usr/share/doc")
        rec = writer.create_warc_record(
            url,
            "response",
            payload=io.BytesIO(body),
            http_headers=http,
            warc_headers_dict={"WARC-Identified-Payload-Type": "text/html"},
        )
        writer.write_record(rec)
    out.write_bytes(buf.getvalue())
    return len(paths), total


def ours(path: Path, extractor: str | None) -> tuple[dict[str, str], float]:
    """url -> text through pileworks' reader (``extractor`` None: read, HTTP-parse and decode only)."""
    cfg = IngestConfig(html=HtmlConfig(extractor=extractor or "resiliparse"))
    start = cpu()
    out: dict[str, str] = {}
    if extractor is None:
        ctx = ReadContext(uri=str(path), fmt="warc.gz", cfg=cfg)
        with open(path, "rb") as f:
            for rec in ArchiveIterator(f, parse_http=False):
                parsed = split_http(rec.reader.read())
                if parsed is not None:
                    declared = web_html.header_charset(parsed[1].get("content-type", ""))
                    try:
                        text, _ = decode_html(ctx, parsed[2], declared)
                    except UndecodableError:  # quarantined by the reader, as in a build
                        continue
                    out[rec.headers.get("WARC-Target-URI") or ""] = text
        return out, cpu() - start
    web_html.build_extractor(cfg.html)  # the import is a one-off, not per record
    start = cpu()
    ctx = ReadContext(uri=str(path), fmt="warc.gz", cfg=cfg)
    with open(path, "rb") as f:
        for item in read_warc(ctx, f, path.stat().st_size, wet=False, gz=True):
            if isinstance(item, Record):
                out[item.meta_dict()["url"]] = item.text
    return out, cpu() - start


def datatrove(path: Path, extract: bool) -> tuple[dict[str, str], float]:
    import trafilatura  # noqa: F401  (imported before the clock starts, as for ours)
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    start = cpu()
    docs = WarcReader(str(path.parent), glob_pattern=path.name).run()
    if extract:  # a generous timeout: the comparison is of texts, not of which pages time out
        docs = Trafilatura(timeout=600).run(docs)
    out = {d.metadata["url"]: d.text for d in docs}
    return out, cpu() - start


def built(path: Path, extractor: str) -> dict[str, str]:
    """url -> text as a build publishes it: ``build_corpus`` on the WARC with ``extractor`` and its default
    config otherwise (ingest's normalisation, PII redaction of web inputs, the quality rules, dedup); the texts of
    its clean parts, which the shards are tokenized from. Documents the build drops are absent."""
    import json

    import pyarrow.parquet as pq

    from flows.build.flow import build_corpus

    store = path.parent / f"store-{extractor}"
    build_corpus(
        inputs=[str(path)], output=str(store), overrides={"name": "web", "ingest.html.extractor": extractor}
    )
    out: dict[str, str] = {}
    for part in store.rglob("part-*.parquet"):
        if part.parent.name != "clean":
            continue
        for row in pq.read_table(part, columns=["text", "meta"]).to_pylist():
            out[json.loads(row["meta"]).get("url", "")] = row["text"]
    return out


def visible_words(page: str) -> set[str]:
    import lxml.html

    try:
        tree = lxml.html.fromstring(page)
    except Exception:
        return set()
    for bad in tree.xpath("//script|//style|//head"):
        bad.drop_tree()
    return set(tree.text_content().split())


def row(name: str, texts: dict[str, str], seconds: float, records: int, mb: float) -> str:
    return f"{name:34} {records / seconds:9.1f} {mb / seconds:9.2f} {seconds:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=400, help="at most this many pages (default 400)")
    parser.add_argument("--extractors", default="resiliparse,trafilatura,justext")
    parser.add_argument(
        "--no-build", action="store_true", help="skip the comparison on a build's output (it runs a build)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.warc.gz"
        records, nbytes = make_warc(path, args.limit)
        mb = nbytes / 1e6
        print(f"{records} pages, {mb:.1f} MB of HTML, {path.stat().st_size / 1e6:.1f} MB .warc.gz")
        print(f"{'per core':34} {'records/s':>9} {'MB/s':>9} {'cpu s':>8}")
        pages, _ = ours(path, None)
        results: dict[str, tuple[dict[str, str], float]] = {}
        results["read: pileworks (fastwarc)"] = ours(path, None)
        datatrove(path, extract=False)  # its lazy imports, outside the measured run
        results["read: datatrove WarcReader (warcio)"] = datatrove(path, extract=False)
        for name in args.extractors.split(","):
            results[f"read+extract: pileworks {name}"] = ours(path, name)
        results["read+extract: datatrove Trafilatura"] = datatrove(path, extract=True)
        for name, (texts, seconds) in results.items():
            print(row(name, texts, seconds, records, mb))
        reference = results["read+extract: datatrove Trafilatura"][0]
        visible = {url: visible_words(page) for url, page in pages.items()}
        print(f"\n{'extractor':34} {'=datatrove':>10} {'kept words':>10} {'no text':>8} {'tags left':>9}")
        for name, (texts, _) in results.items():
            if not name.startswith("read+extract"):
                continue
            equal = sum(1 for url, text in reference.items() if texts.get(url) == text)
            recall = [len(set(texts.get(u, "").split()) & w) / len(w) for u, w in visible.items() if w]
            empty = sum(1 for u in pages if not texts.get(u, "").strip())
            tags = sum(1 for u, page in pages.items() if _tag_left(texts.get(u, ""), page))
            print(
                f"{name.removeprefix('read+extract: '):34} {equal / max(len(reference), 1):>10.1%} "
                f"{sum(recall) / len(recall):>10.1%} {empty:>8} {tags:>9}"
            )
        if not args.no_build:
            compare_build(path, reference)


def compare_build(path: Path, reference: dict[str, str]) -> None:
    """The texts a build publishes with ``ingest.html.extractor: trafilatura`` against datatrove's
    WarcReader + Trafilatura as it ships; beside it, labelled, the same after datatrove's text goes through the
    normalisation a build applies (encoding repair, NFC, control characters, whitespace: differences of definition,
    not of extraction; PII redaction and what the quality rules drop remain differences)."""
    from collections import Counter

    from pipeline.clean.config import CleanConfig
    from pipeline.clean.normalize import normalize_text

    texts = built(path, "trafilatura")
    kept = [u for u in reference if u in texts]
    same = sum(1 for u in kept if texts[u] == reference[u])
    cfg, counts = CleanConfig(), Counter[str]()
    norm = sum(1 for u in kept if normalize_text(reference[u], cfg, counts) == texts[u])
    print(
        f"\nbuild output (trafilatura) against datatrove WarcReader + Trafilatura: {len(kept)} documents the build "
        f"kept of {len(reference)}; identical text {same / max(len(kept), 1):.1%}; adjusted (datatrove's text "
        f"through the build's normalisation, clean steps 0-4) {norm / max(len(kept), 1):.1%}"
    )


def _tag_left(text: str, page: str) -> bool:
    """Whether ``text`` holds a tag that is markup of the page (not a tag the page shows as text)."""
    shown = set(_TAG.findall(page.replace("&lt;", "<").replace("&gt;", ">"))) - set(_TAG.findall(page))
    return any(tag not in shown for tag in _TAG.findall(text))


if __name__ == "__main__":
    main()
