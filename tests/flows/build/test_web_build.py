"""Done-when of web inputs: a build over a folder of ``.warc.gz`` (local and on the moto S3 server) and one of
``.wet.gz`` publishes documents with no HTML left and their ``url``/``warc_date`` in ``docs.parquet``; a
blocklisted domain's pages are dropped as ``url_blocklisted``; every damaged record is counted, none lost. One
WARC of the folder is gzipped as one whole file, as wget >= 1.20 writes URIs (``<https://…>``), one of an IDNA
host: the blocklist meets the bracketed URL, ``inspect mixture --domains`` names the host decoded, and the
document's ``#U`` location (what ``pileworks trace`` prints) leads to its record in the decompressed file."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator

from pipeline.dataset.card import read_card
from pipeline.dataset.manifest import load_manifest
from pipeline.storage import open_store, split_uri
from tests.fixtures.s3_corpus import upload_corpus
from tests.fixtures.web_archives import Response, article, html_page, write_warc, write_wet
from tests.flows.tiny_corpus import TINY_OVERRIDES

pytestmark = pytest.mark.slow
PAGES = 16
BAD = 3  # per WARC file: no HTTP headers, WARC-Truncated, an unknown charset nobody can decode
# wget's bracketed target URIs, in a WARC gzipped as one whole file: the first blocklisted, the second IDNA
WGET = ("<https://spam.host0.example/wget>", "<https://xn--bcher-kva.example/buch>")


def _write_crawl(folder: Path, seed: int = 3) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for f in range(2):
        good = [
            Response(
                f"https://{'spam.' if i % 4 == 0 else ''}host{i}.example/p{f}",
                html_page(f"P{f}.{i}", article(rng, 5)).encode(),
            )
            for i in range(PAGES // 2)
        ]
        bad = [
            Response(f"http://nohttp{f}.example/", b"<html><p>no status line</p></html>", http=False),
            Response(
                f"http://cut{f}.example/",
                html_page("t", article(rng)).encode(),
                warc_headers={"WARC-Truncated": "length"},
            ),
            Response(
                f"http://cs{f}.example/",
                bytes(rng.randrange(128, 256) for _ in range(3000)),
                "text/html; charset=x-none",
            ),
        ]
        write_warc(folder / f"crawl-{f}.warc.gz", good[:3] + bad + good[3:])
    plain = folder / "wget.warc"
    write_warc(plain, [Response(url, html_page(url, article(rng, 5)).encode()) for url in WGET], gz=False)
    (folder / "wget.warc.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()


def _overrides(blocklist: Path) -> dict[str, Any]:
    blocklist.write_text("# spam farm\nspam.host0.example\nhost4.example\n")
    return TINY_OVERRIDES | {
        "clean.quality.enabled": False,
        "dedup.near.enabled": False,
        "clean.boilerplate.enabled": False,
        "clean.url.blocklist": [str(blocklist)],
        "shard.valid_fraction": 0.0,
    }


def _published(summary: dict[str, Any], s3: Any = None) -> tuple[Any, Any, list[dict[str, Any]]]:
    manifest, dstore = load_manifest(summary["manifest_uri"], s3)
    rows = []
    for shard in manifest.shards:
        rows += pq.read_table(io.BytesIO(dstore.get_bytes(shard.docs_key))).to_pylist()
    return manifest, dstore, rows


def _check_warc_build(manifest: Any, dstore: Any, rows: list[dict[str, Any]], s3: Any = None) -> None:
    stats = manifest.stats
    blocked = {f"https://spam.host0.example/p{f}" for f in range(2)} | {
        f"https://spam.host4.example/p{f}" for f in range(2)
    }
    blocked.add(WGET[0].strip("<>"))  # the bracketed URL meets the blocklist
    assert stats["clean"]["dropped"]["url_blocklisted"] == len(blocked)
    assert stats["ingest"]["dropped"] == {"malformed_http": 2, "warc_truncated": 2, "unknown_charset": 2}
    firsts = [r for r in rows if r["piece"] == 0]
    urls = {r["url"] for r in firsts}
    assert len(firsts) == PAGES + len(WGET) - len(blocked) and urls.isdisjoint(blocked)
    assert all(r["warc_date"].startswith("20") for r in firsts)
    assert {r["doc_id"].split("#")[1][0] for r in firsts if r["source"] != "wget.warc.gz"} == {"B"}
    assert stats["ingest"]["docs_in"] == PAGES + 2 * BAD + len(
        WGET
    )  # every response: documents + quarantined
    (idna,) = [r for r in firsts if r["source"] == "wget.warc.gz"]
    assert idna["url"] == WGET[1].strip("<>") and idna["location"].startswith("U")
    # trace's lead (docs.parquet's source and location, the manifest's input URI): the record in `zcat FILE`
    root, key = split_uri(manifest.input_uri(idna["source"]))
    whole = gzip.decompress(open_store(root, s3=s3).get_bytes(key))
    at = whole[int(idna["location"][1:]) :]
    assert f"WARC-Target-URI: {WGET[1]}\r\n".encode() in at.split(b"\r\n\r\n", 1)[0]  # as wget wrote it
    record = next(iter(ArchiveIterator(io.BytesIO(at))))
    assert record.rec_headers.get_header("WARC-Type") == "response" and record.content_stream().read()
    card = read_card(manifest, dstore)  # the data card tallies the URL drops per source like any other drop
    assert "url_blocklisted" in json.dumps(card)


def test_a_warc_folder_builds_with_urls_and_the_blocklist(
    prefect_harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.build.flow import build_corpus
    from flows.cli.inspect import register

    _write_crawl(tmp_path / "crawl")
    summary = build_corpus(
        inputs=[str(tmp_path / "crawl")],
        output=str(tmp_path / "store"),
        overrides=_overrides(tmp_path / "b.txt"),
    )
    manifest, dstore, rows = _published(summary)
    _check_warc_build(manifest, dstore, rows)
    # no HTML left in any published text (the cleaned parts the shards were tokenized from)
    parts = [p for p in (tmp_path / "store").rglob("part-*.parquet") if p.parent.name == "clean"]
    texts = [pq.read_table(p).column("text").to_pylist() for p in parts]
    flat = [t for part in texts for t in part]
    assert flat and all(
        "<p>" not in t and "tracker" not in t and "All rights reserved" not in t for t in flat
    )
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    capsys.readouterr()
    args = parser.parse_args(["inspect", "mixture", summary["manifest_uri"], "--domains", "30"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "top domains per source" in out and "host1.example" in out
    table = out.split("top domains per source", 1)[1].splitlines()[2:]
    named = {line.split()[1]: int(line.split()[-1]) for line in table if line.strip()}
    assert named["bücher.example"] == 1  # the bracketed IDNA URL's host, decoded
    assert sum(named.values()) == len({r["doc_id"] for r in rows})  # every document names a domain


def test_a_wet_folder_builds_with_urls(prefect_harness, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus

    rng = random.Random(4)
    (tmp_path / "wet").mkdir()
    for f in range(2):
        pages = [
            (f"https://{'spam.' if i == 0 else ''}w{i}.example/{f}", "\n\n".join(article(rng, 5)))
            for i in range(6)
        ]
        write_wet(tmp_path / "wet" / f"c-{f}.wet.gz", pages)
    data = (tmp_path / "wet" / "c-1.wet.gz").read_bytes()
    (tmp_path / "wet" / "c-1.wet.gz").write_bytes(data[:-50])  # its last gzip member cut short
    overrides = _overrides(tmp_path / "b.txt")
    (tmp_path / "b.txt").write_text("spam.w0.example\n")
    summary = build_corpus(
        inputs=[str(tmp_path / "wet")], output=str(tmp_path / "store"), overrides=overrides
    )
    manifest, _, rows = _published(summary)
    assert manifest.stats["clean"]["dropped"]["url_blocklisted"] == 2
    assert manifest.stats["ingest"]["dropped"] == {"truncated_record": 1}
    firsts = [r for r in rows if r["piece"] == 0]
    assert len(firsts) == 12 - 2 - 1 and all(r["url"].startswith("https://w") for r in firsts)
    assert all(r["warc_date"] for r in firsts)


@pytest.mark.s3
def test_a_warc_folder_on_s3_builds(prefect_harness, s3_server: str, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus
    from pipeline.storage import S3Options

    _write_crawl(tmp_path / "crawl")
    bucket = f"pw-web-{uuid.uuid4().hex[:8]}"
    inputs = upload_corpus(tmp_path / "crawl", s3_server, bucket)
    overrides = _overrides(tmp_path / "b.txt") | {"s3.endpoint_url": s3_server, "s3.region": "us-east-1"}
    summary = build_corpus(inputs=[inputs], output=f"s3://{bucket}/store", overrides=overrides)
    s3 = S3Options(endpoint_url=s3_server, region="us-east-1")
    manifest, dstore, rows = _published(summary, s3)
    _check_warc_build(manifest, dstore, rows, s3)
