"""Held-out check of web ingest on archives that crawlers wrote (issue 42): every HTTP 2xx response that warcio's
``ArchiveIterator`` reads as HTML must become a document or be quarantined for a reason a person agrees with.

For each archive given (files or folders; .warc, .warc.gz, .wet(.gz), .arc, .arc.gz), warcio lists the HTML
responses (2xx, ``text/html`` or ``application/xhtml+xml``, decoded by warcio's ``content_stream``), then
pileworks' ingest reads the same file; the script prints, per file, warcio's count, our documents, our quarantines
by reason with a sample of each, and any page warcio reads that we neither kept nor quarantined (a quarantine's
location is read back with warcio for its URL).

Real archives ship in packages' source distributions, for example pywb's sample archive (wget 1.14, wpull,
webrecorder, Heritrix-style ARC and WARC)::

    pip download --no-binary :all: --no-deps pywb==2.10.0 -d /tmp/sdists && tar xzf /tmp/sdists/pywb-2.10.0.tar.gz -C /tmp/sdists
    .venv/bin/python tests/bench/check_archives.py /tmp/sdists/pywb-2.10.0/sample_archive/warcs
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from collections import Counter
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.ingest.config import DEFAULT_EXTENSIONS, IngestConfig  # noqa: E402
from pipeline.ingest.html import HtmlConfig  # noqa: E402
from tests.pipeline.ingest.test_ingest import ingest_all  # noqa: E402

HTML = ("text/html", "application/xhtml+xml")


def warcio_html(path: Path) -> list[str]:
    """The URLs of the 2xx HTML responses warcio reads in ``path`` (arc2warc, as pywb reads ARC)."""
    urls = []
    with path.open("rb") as f:
        try:
            for rec in ArchiveIterator(f, arc2warc=True):
                if rec.rec_type != "response" or rec.http_headers is None:
                    continue
                status = rec.http_headers.get_statuscode() or ""
                mime = (rec.http_headers.get_header("Content-Type") or "").split(";")[0].strip().lower()
                if status.startswith("2") and mime in HTML:
                    url = rec.rec_headers.get_header("WARC-Target-URI") or ""
                    try:
                        rec.content_stream().read()
                    except Exception as exc:  # its decoder fails on this body: still an HTML page it lists
                        print(f"  warcio cannot decode {url}: {type(exc).__name__}: {str(exc).strip()[:80]}")
                    urls.append(url)
        except Exception as exc:  # warcio refuses some files: say so and go on
            print(f"  warcio stops in {path.name}: {type(exc).__name__}: {str(exc).strip()[:120]}")
    return urls


def quarantined_url(path: Path, location: str) -> str:
    """The target URL of the record a quarantine's location names (``B<offset>`` in the file, ``U<offset>`` in
    the whole-file-decompressed one), "" where there is none to read."""
    if location[:1] not in ("B", "U") or not location[1:].isdigit():
        return ""
    data = path.read_bytes()
    if location[0] == "U":
        data = gzip.decompress(data)
    try:
        rec = next(iter(ArchiveIterator(io.BytesIO(data[int(location[1:]) :]), arc2warc=True)))
    except Exception:  # a record warcio cannot read either
        return ""
    return (rec.rec_headers.get_header("WARC-Target-URI") or "").strip("<>")


def archives(args: list[str]) -> list[Path]:
    out = []
    suffixes = tuple(
        s for s, fmt in DEFAULT_EXTENSIONS.items() if fmt.split(".")[0] in ("warc", "wet", "arc")
    )
    for a in args:
        p = Path(a)
        out += sorted(q for q in p.rglob("*") if q.name.endswith(suffixes)) if p.is_dir() else [p]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--extractor", default="resiliparse")
    args = parser.parse_args()
    cfg = IngestConfig(html=HtmlConfig(extractor=args.extractor))
    totals: Counter[str] = Counter()
    for path in archives(args.paths):
        theirs = warcio_html(path)
        records, quarantined, stats = ingest_all([str(path)], cfg)
        ours = Counter(r.meta_dict().get("url", "") for r in records)
        held = Counter(q.reason for q in quarantined)
        held_urls = Counter(quarantined_url(path, q.location) for q in quarantined)
        lost = [u for u in theirs if not ours[u.strip("<>")] and not held_urls[u.strip("<>")]]
        print(
            f"{path.name:45} warcio HTML {len(theirs):3}  documents {len(records):3}  "
            f"quarantined {dict(held) or '-'}  encoding_mismatch {stats.extra.get('encoding_mismatch', 0)}"
        )
        for q in quarantined:
            print(f"    {q.reason} at {q.location}: {q.detail[:100]!r} sample {q.sample[:80]!r}")
        if lost:
            print(f"    neither kept nor quarantined: {lost[:5]}")
        totals.update(
            warcio=len(theirs), documents=len(records), quarantined=len(quarantined), lost=len(lost)
        )
    print(f"total: {dict(totals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
