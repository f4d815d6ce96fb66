"""Issue 42's done-when: the same web archives give the same ingest output, document by document, at 1 worker and
at 2 workers with another part size, with each HTML extractor (trafilatura's deduplication once kept a cache per
process, and the documents depended on which worker read which page)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fixtures.web_archives import Response, article, html_page, write_warc

pytestmark = pytest.mark.slow
SHARED = " ".join(["Every page of this site repeats this same paragraph about the site and its news."] * 3)


def _crawl(folder: Path) -> None:
    """Four archives of pages that share a paragraph (what a cross-page cache removes from later pages)."""
    rng = random.Random(42)
    folder.mkdir()
    for f in range(4):
        pages = [
            Response(
                f"https://site{f}.example/{i}", html_page(f"P{f}.{i}", [SHARED, *article(rng, 3)]).encode()
            )
            for i in range(4)
        ]
        write_warc(folder / f"crawl-{f}.warc.gz", pages)


def _ingested(store: Path) -> dict[str, tuple[str, str]]:
    """doc id -> (text, URL) of every ingest part under ``store``."""
    out: dict[str, tuple[str, str]] = {}
    parts = [p for p in store.rglob("part-*.parquet") if p.parent.name == "ingest"]
    assert parts, f"no ingest parts under {store}"
    for part in parts:
        for row in pq.read_table(part, columns=["id", "text", "meta"]).to_pylist():
            out[row["id"]] = (row["text"], json.loads(row["meta"]).get("url", ""))
    return out


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura", "justext"])
def test_one_and_two_workers_and_part_sizes_ingest_the_same_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extractor: str
) -> None:
    from flows.cli.main import main

    monkeypatch.setenv("PILEWORKS_MIN_TASK_BYTES", "1")  # several tasks per pass: pages spread over workers
    _crawl(tmp_path / "crawl")
    sets = [
        f"--set=ingest.html.extractor={extractor}",
        "--set=tokenize.vocab_size=300",
        "--set=clean.quality.enabled=false",
        "--set=shard.valid_fraction=0",
    ]
    runs = {"one": ("1", "100000000"), "two": ("2", "2048")}  # workers, ingest.target_part_bytes
    outputs, ids = {}, {}
    for name, (workers, part_bytes) in runs.items():
        argv = ["build", "--input", str(tmp_path / "crawl"), "--output", str(tmp_path / name)]
        argv += [
            "--name",
            "web",
            *sets,
            f"--set=ingest.target_part_bytes={part_bytes}",
            "--json",
            "--workers",
            workers,
        ]
        assert main(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        ids[name] = summary["dataset_id"]
        outputs[name] = _ingested(tmp_path / name)
    one, two = outputs["one"], outputs["two"]
    assert len(one) == 16 and one.keys() == two.keys()
    assert [k for k in one if one[k] != two[k]] == []
    kept_shared = sum(SHARED[:60] in text for text, _ in one.values())
    assert kept_shared == 16  # the shared paragraph kept on every page
