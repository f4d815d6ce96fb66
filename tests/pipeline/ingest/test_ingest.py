"""Ingest over real bytes written in-process: every format, encodings, range splitting, bad input, S3."""

from __future__ import annotations

import gzip
import io
import json
import random
import tracemalloc
import zlib
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.ingest.config import IngestConfig, InputFile, PartPlan
from pipeline.ingest.stage import ingest_part, list_inputs, plan_parts, run_ingest_part
from pipeline.records import Quarantined, Record, read_part, read_quarantine
from pipeline.sample_corpus import sample_corpus_path
from pipeline.storage import open_store
from pipeline.units.protocol import StageStats, read_part_stats
from tests.pipeline.ingest.test_encoding import CHINESE, FRENCH, JAPANESE, RUSSIAN, SPANISH

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "naïve",
    "café",
    "中文",
    "日本語",
    "Ωμέγα",
]


def ingest_all(
    sources: list[str], cfg: IngestConfig | None = None, target: int | None = None, s3=None
) -> tuple[list[Record], list[Quarantined], StageStats]:
    cfg = cfg or IngestConfig()
    plans = plan_parts(
        list_inputs(sources, s3, cfg.extensions), target or cfg.target_part_bytes, cfg=cfg, s3=s3
    )
    records, quarantined, total = [], [], StageStats(stage="ingest")
    for plan in plans:
        r, q, s = ingest_part(PartPlan.from_json(json.loads(json.dumps(plan.to_json()))), cfg, s3)
        records += r
        quarantined += q
        total.merge(s)
    return records, quarantined, total


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_jsonl(path: Path, rows: list[object]) -> bytes:
    data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)
    path.write_bytes(data)
    return data


# ---------------------------------------------------------------- config and listing


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"txt_mode": "lines"}, "txt_mode"),
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"target_part_bytes": 0}, "target_part_bytes"),
        ({"max_doc_bytes": 0}, "max_doc_bytes"),
        ({"min_detect_confidence": 1.5}, "min_detect_confidence"),
        ({"extensions": {".md": "markdown"}}, "extensions"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        IngestConfig(**kwargs)


def test_list_inputs_paths_dirs_globs_and_file_uris(tmp_path: Path) -> None:
    (tmp_path / "a" / "deep").mkdir(parents=True)
    for name in ("a/one.txt", "a/deep/two.jsonl", "a/deep/three.jsonl.zst", "a/README.md", "b.parquet"):
        (tmp_path / name).write_bytes(b"x" * len(name))
    found = list_inputs(
        [str(tmp_path / "a"), f"file://{tmp_path}/b.parquet", str(tmp_path / "a/**/*.jsonl")], None
    )
    names = [f.uri.removeprefix(f"file://{tmp_path.resolve()}/") for f in found]
    assert names == [
        "a/deep/three.jsonl.zst",
        "a/deep/two.jsonl",
        "a/one.txt",
        "b.parquet",
    ]  # sorted, deduped
    assert all(
        isinstance(f, InputFile) and f.size == len(n) and f.etag and f.mtime > 0
        for f, n in zip(found, names, strict=True)
    )
    with pytest.raises(ValueError, match="does not exist"):
        list_inputs([str(tmp_path / "missing")], None)
    with pytest.raises(ValueError, match="no file of a known format"):
        list_inputs([str(tmp_path / "a/README.md")], None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"'.*empty' is empty: check the path"):
        list_inputs([str(tmp_path / "empty")], None)
    with pytest.raises(ValueError, match=r"'.*\*\.nomatch' matches nothing: check the path or pattern"):
        list_inputs([str(tmp_path / "a/**/*.nomatch")], None)


# ---------------------------------------------------------------- formats


def test_every_format(tmp_path: Path) -> None:
    rows = [
        {"text": f"doc {i} " + "é" * i, "meta": {"lang": "fr", "i": i}, "url": f"http://x/{i}"}
        for i in range(5)
    ]
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    (tmp_path / "a.jsonl").write_bytes(raw)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "d.txt").write_text(FRENCH, encoding="utf-8")
    (tmp_path / "e.txt.gz").write_bytes(gzip.compress(SPANISH.encode()))
    table = pa.table({"text": [r["text"] for r in rows], "meta": [json.dumps(r["meta"]) for r in rows]})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=2)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    by_file = Counter(r.source.rsplit("/", 1)[1] for r in records)
    assert by_file == {
        "a.jsonl": 5,
        "b.jsonl.gz": 5,
        "c.jsonl.zst": 5,
        "d.txt": 1,
        "e.txt.gz": 1,
        "f.parquet": 5,
    }
    texts = {name: [r.text for r in records if r.source.endswith(name)] for name in by_file}
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "f.parquet"):
        assert texts[name] == [r["text"] for r in rows]
    assert texts["d.txt"] == [FRENCH] and texts["e.txt.gz"] == [SPANISH]
    first = {r.source.rsplit("/", 1)[1]: r for r in reversed(records)}
    assert first["a.jsonl"].id.endswith("a.jsonl#B0") and first["c.jsonl.zst"].id.endswith("#L1")
    assert first["f.parquet"].id.endswith("#row0") and first["d.txt"].id.endswith("d.txt#B0")
    meta = first["b.jsonl.gz"].meta_dict()
    assert meta == {
        "user": {"lang": "fr", "i": 0, "url": "http://x/0"},
        "format": "jsonl.gz",
        "encoding": "utf-8",
        "offset": "L1",
        "source_name": "default",
        "source_entry": 0,
        "url": "http://x/0",  # ingest.url_field ("url"): the URL rules and docs.parquet read it here
    }
    assert first["f.parquet"].meta_dict()["user"]["lang"] == "fr"
    assert stats.docs_out == 22 and stats.docs_in == 22 and stats.bytes_out > 0
    streamed = sum(p.stat().st_size for p in tmp_path.iterdir() if p.suffix != ".parquet")  # read whole
    meta = pq.ParquetFile(tmp_path / "f.parquet").metadata
    chunks = sum(meta.row_group(g).column(c).total_compressed_size for g in range(3) for c in range(2))
    assert stats.bytes_in == streamed + chunks  # parquet: the column chunks read


def test_ids_offsets_point_at_the_raw_bytes(tmp_path: Path) -> None:
    rows = [{"text": random_text(random.Random(i), i + 1)} for i in range(20)]
    raw = write_jsonl(tmp_path / "x.jsonl", rows)
    records, _, _ = ingest_all([str(tmp_path)])
    for record in records:
        offset = int(record.id.rsplit("#B", 1)[1])
        line = raw[offset:].split(b"\n", 1)[0]
        assert json.loads(line)["text"] == record.text


def test_id_field_and_non_pile_fields(tmp_path: Path) -> None:
    row = {
        "id": "doc-7",
        "content": "hello world",
        "meta": "not json",
        "url": "u",
        "html": "<p>" * 1000,
        "n": [1],
    }
    write_jsonl(tmp_path / "x.jsonl", [row])
    cfg = IngestConfig(text_field="content", id_field="id")
    records, quarantined, _ = ingest_all([str(tmp_path)], cfg)
    assert quarantined == [] and records[0].id == "doc-7" and records[0].text == "hello world"
    # small scalar fields join meta; the text, the id, big strings and nested values do not
    assert records[0].meta_dict() == {
        "user": {"meta": "not json", "url": "u"},
        "format": "jsonl",
        "encoding": "utf-8",
        "offset": "B0",
        "source_name": "default",
        "source_entry": 0,
        "url": "u",
    }


def test_utf16_paragraphs_are_numbered_and_never_split(tmp_path: Path) -> None:
    paragraphs = [f"{i}: " + JAPANESE.strip() for i in range(40)]
    data = "\r\n\r\n".join(paragraphs).encode("utf-16")
    (tmp_path / "u16.txt").write_bytes(data)
    (tmp_path / "bad16.txt").write_bytes(
        "ok\n\nfine\n\n".encode("utf-16") + b"\x00\xd8" + "tail".encode("utf-16-le")
    )
    cfg = IngestConfig(txt_mode="paragraph")
    plans = plan_parts(list_inputs([str(tmp_path)], None), len(data) // 7, cfg=cfg, s3=None)
    assert len(plans) == 2  # one piece each: UTF-16 has no byte-level newline to split at
    records, quarantined, stats = ingest_all([str(tmp_path)], cfg, target=len(data) // 7)
    assert [r.text for r in records if r.source.endswith("u16.txt")] == paragraphs
    assert [r.id.rsplit("#", 1)[1] for r in records if r.source.endswith("u16.txt")] == [
        f"P{i}" for i in range(40)
    ]
    assert [r.text for r in records if r.source.endswith("bad16.txt")] == ["ok", "fine"]
    assert [(q.reason, q.location) for q in quarantined] == [("undecodable", "P2")]
    assert stats.bytes_in == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_txt_paragraph_mode(tmp_path: Path) -> None:
    paragraphs = [FRENCH.strip(), "second\nparagraph with two lines", "third"]
    (tmp_path / "p.txt").write_bytes(("\n\n".join(paragraphs) + "\n\n\n").encode())
    records, quarantined, _ = ingest_all([str(tmp_path)], IngestConfig(txt_mode="paragraph"))
    assert quarantined == [] and [r.text for r in records] == paragraphs
    second = len(paragraphs[0].encode()) + 2
    third = second + len(paragraphs[1].encode()) + 2
    assert [r.id.rsplit("#", 1)[1] for r in records] == ["B0", f"B{second}", f"B{third}"]


# ---------------------------------------------------------------- encodings


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        (CHINESE, "gbk"),
        (CHINESE, "gb18030"),
        (JAPANESE, "shift_jis"),
        (FRENCH, "cp1252"),
        (SPANISH, "latin-1"),
        (RUSSIAN, "cp1251"),
        (JAPANESE, "utf-16"),
        (CHINESE, "utf-8-sig"),
        (CHINESE * 3, "utf-8"),
    ],
)
@pytest.mark.parametrize("mode", ["file", "paragraph"])
def test_txt_encodings(tmp_path: Path, text: str, codec: str, mode: str) -> None:
    (tmp_path / "doc.txt").write_bytes(text.encode(codec))
    records, quarantined, stats = ingest_all([str(tmp_path)], IngestConfig(txt_mode=mode))
    assert quarantined == []
    assert [r.text for r in records] == [text if mode == "file" else text.rstrip("\n")]
    encoding = records[0].meta_dict()["encoding"]
    assert stats.extra[f"encoding.{encoding}"] == 1
    assert (encoding == "utf-8") == codec.startswith("utf-8")


def test_jsonl_with_a_utf8_bom(tmp_path: Path) -> None:
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n{"text": "second"}\n')
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == [] and [r.text for r in records] == ["first", "second"]


def test_jsonl_with_a_legacy_encoded_file(tmp_path: Path) -> None:
    """JSON should be UTF-8, but a GBK-encoded dump is detected per file, not dropped."""
    lines = [json.dumps({"text": CHINESE + str(i)}, ensure_ascii=False) for i in range(3)]
    (tmp_path / "gbk.jsonl").write_bytes("\n".join(lines).encode("gbk") + b"\n")
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == [] and [r.text for r in records] == [CHINESE + str(i) for i in range(3)]
    assert {r.meta_dict()["encoding"] for r in records} == {"gb18030"}


# ---------------------------------------------------------------- range splitting


def make_jsonl_corpus(path: Path, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts, out = [], io.BytesIO()
    for i in range(n):
        text = f"{i}: " + random_text(rng, rng.choice([0, 1, 3, 20, 200]))
        texts.append(text)
        out.write(json.dumps({"text": text}, ensure_ascii=rng.random() < 0.5).encode())
        out.write(rng.choice([b"\n", b"\r\n", b"\n\n"]))  # CRLF and blank lines too
    path.write_bytes(out.getvalue())
    return texts


@pytest.mark.parametrize("target", [1, 2, 7, 64, 333, 1000, 4096, 10**9])
def test_jsonl_ranges_conserve_every_line(tmp_path: Path, target: int) -> None:
    # tiny targets make one range per byte: a smaller file keeps them fast
    texts = make_jsonl_corpus(tmp_path / "big.jsonl", 12 if target < 64 else 150, seed=1)
    cfg = IngestConfig(target_part_bytes=target)
    records, quarantined, stats = ingest_all([str(tmp_path)], cfg)
    assert quarantined == []
    assert sorted(r.text for r in records) == sorted(texts)
    assert len({r.id for r in records}) == len(texts)
    assert stats.bytes_in == (tmp_path / "big.jsonl").stat().st_size  # ranges share out the bytes exactly
    assert stats.extra["pieces"] == -(-stats.bytes_in // target)


@pytest.mark.parametrize("target", [1, 5, 40, 256, 999, 10**9])
def test_txt_paragraph_ranges_conserve_every_paragraph(tmp_path: Path, target: int) -> None:
    rng = random.Random(2)
    paragraphs = [
        "\n".join(random_text(rng, rng.choice([1, 5, 40])) for _ in range(rng.choice([1, 2, 4])))
        for _ in range(8 if target < 40 else 80)
    ]
    data = "".join(p + rng.choice(["\n\n", "\n\n\n", "\n \n", "\n\n\n\n"]) for p in paragraphs)
    (tmp_path / "p.txt").write_bytes(("\n\n" + data).encode())
    cfg = IngestConfig(txt_mode="paragraph")
    whole, _, _ = ingest_all([str(tmp_path)], cfg)
    records, quarantined, _ = ingest_all([str(tmp_path)], cfg, target=target)
    assert quarantined == []
    assert [r.text for r in records] == paragraphs
    assert [r.id for r in records] == [r.id for r in whole]  # ids do not depend on the split


def test_parquet_row_group_ranges(tmp_path: Path) -> None:
    texts = [random_text(random.Random(i), 30) for i in range(200)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=16)
    size = (tmp_path / "t.parquet").stat().st_size
    plans = plan_parts(list_inputs([str(tmp_path)], None), size // 5, s3=None)
    assert len(plans) >= 3
    records, quarantined, _ = ingest_all([str(tmp_path)], target=size // 5)
    assert quarantined == [] and [r.text for r in records] == texts
    assert [r.id.rsplit("#", 1)[1] for r in records] == [f"row{i}" for i in range(200)]


def test_plan_parts_packs_small_files_and_round_trips(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}.txt").write_bytes(b"x" * 100)
    inputs = list_inputs([str(tmp_path)], None)
    plans = plan_parts(inputs, 350, s3=None)
    assert [len(p.pieces) for p in plans] == [3, 3, 3, 1]
    assert [PartPlan.from_json(json.loads(json.dumps(p.to_json()))) for p in plans] == plans
    assert plan_parts(inputs, 350, s3=None) == plans  # deterministic
    for i in range(2):
        (tmp_path / f"z{i}.jsonl.zst").write_bytes(b"z" * 100)
    plans = plan_parts(list_inputs([str(tmp_path / "z*")], None), 500, s3=None)
    assert [len(p.pieces) for p in plans] == [1, 1]  # weighed as ~400 bytes of text each, not 100


# ---------------------------------------------------------------- bad input


def test_bad_jsonl_lines_are_quarantined_and_good_ones_kept(tmp_path: Path) -> None:
    good = [f"good document number {i}" for i in range(6)]
    junk = bytes(b for b in random.Random(0).randbytes(3000) if b not in b"\r\n")
    lines = [
        json.dumps({"text": good[0]}).encode(),
        junk,  # undecodable
        b'{"text": "unterminated',  # malformed
        json.dumps({"text": good[1] + "\x00 escaped NUL"}).encode(),
        b'{"text": "' + good[2].encode() + b'\x00 raw NUL"}',
        json.dumps({"meta": {"a": 1}}).encode(),  # missing text
        json.dumps({"text": 42}).encode(),  # non-string
        json.dumps({"text": "  \n\t "}).encode(),  # empty
        json.dumps([1, 2]).encode(),  # not an object
        json.dumps({"text": good[3]}).encode(),
        json.dumps({"text": "x" * 5000}).encode(),  # over max_doc_bytes below
        json.dumps({"text": good[4]}).encode(),
        json.dumps({"text": good[5]}).encode(),
    ]
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    records, quarantined, stats = ingest_all([str(tmp_path)], IngestConfig(max_doc_bytes=4096))
    assert [r.text.split("\x00")[0] for r in records] == good
    assert stats.dropped == {
        "undecodable": 1,
        "malformed_json": 2,
        "missing_text": 1,
        "non_string_text": 1,
        "empty_doc": 1,
        "doc_too_large": 1,
    }
    assert stats.extra["docs_with_nul"] == 2 and stats.extra["nul_chars"] == 2
    assert stats.docs_in == len(good) + 7 and stats.docs_out == len(good)
    too_large = next(q for q in quarantined if q.reason == "doc_too_large")
    assert too_large.location == f"B{sum(len(x) + 1 for x in lines[:10])}" and too_large.sample.startswith(
        b'{"text"'
    )


def test_50mb_single_line_is_streamed_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "before"}\n{"text": "')
        for _ in range(50):
            f.write(b"y" * (1 << 20))
        f.write(b'"}\n{"text": "after"}\n')
    tracemalloc.start()
    try:
        records, quarantined, stats = ingest_all([str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r.text for r in records] == ["before", "after"]
    assert [q.reason for q in quarantined] == ["doc_too_large"] and len(quarantined[0].sample) == 4096
    assert peak < 3 * IngestConfig().max_doc_bytes, f"peak {peak / 2**20:.0f} MiB: the long line was buffered"
    assert stats.bytes_in == path.stat().st_size


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_truncated_streams_keep_every_complete_line(tmp_path: Path, compression: str) -> None:
    rng = random.Random(3)
    rows = [{"text": f"{i} " + random_text(rng, 50)} for i in range(3000)]
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    packed = gzip.compress(raw) if compression == "gz" else zstandard.ZstdCompressor().compress(raw)
    cut = packed[: len(packed) * 2 // 3]
    (tmp_path / f"t.jsonl.{compression}").write_bytes(cut)
    dec = (
        zlib.decompressobj(wbits=31) if compression == "gz" else zstandard.ZstdDecompressor().decompressobj()
    )
    recoverable = dec.decompress(cut).count(b"\n")  # complete lines in the surviving bytes
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert 0 < recoverable < len(rows) and stats.bytes_in == len(cut)
    assert [r.text for r in records] == [r["text"] for r in rows[:recoverable]]
    assert [q.reason for q in quarantined] == ["truncated_stream"]
    assert quarantined[0].location == f"L{recoverable + 1}"


def test_corrupt_gzip_and_parquet_and_missing_objects(tmp_path: Path) -> None:
    rng = random.Random(4)
    lines = [f"line {i} " + random_text(rng, 30) for i in range(2000)]
    raw = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in lines)
    packed = bytearray(gzip.compress(raw))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = b"\xff" * 64
    (tmp_path / "corrupt.jsonl.gz").write_bytes(bytes(packed))
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"body": ["no text column"]}), tmp_path / "notext.parquet")
    pq.write_table(pa.table({"text": pa.array([None, "ok"], pa.string())}), tmp_path / "null.parquet")
    (tmp_path / "gone.txt").write_text("soon deleted")
    (tmp_path / "random.txt").write_bytes(random.Random(0).randbytes(4096))
    (tmp_path / "empty.txt").write_bytes(b"")
    plans = plan_parts(list_inputs([str(tmp_path)], None), 1 << 30, s3=None)
    (tmp_path / "gone.txt").unlink()
    records, quarantined, stats = ingest_part(plans[0], IngestConfig(), None)
    # Deflate cannot tell where damage starts (the CRC is at the end): lines decoded from the bytes before
    # the damage are intact and kept; lines after it may be garbage that still parses, and are kept too.
    intact = zlib.decompressobj(wbits=31).decompress(bytes(packed[: len(packed) // 2])).count(b"\n")
    kept = [r.text for r in records if r.source.endswith("/corrupt.jsonl.gz")]
    assert intact > 100 and kept[:intact] == lines[:intact] and len(kept) < len(lines)
    assert [r.text for r in records if r.source.endswith("/null.parquet")] == ["ok"]
    by_file = Counter((q.source.rsplit("/", 1)[1], q.reason) for q in quarantined)
    assert by_file[("corrupt.jsonl.gz", "corrupt_stream")] == 1
    assert {k: v for k, v in by_file.items() if k[0] != "corrupt.jsonl.gz"} == {
        ("garbage.parquet", "corrupt_file"): 1,
        ("notext.parquet", "missing_text"): 1,
        ("null.parquet", "missing_text"): 1,
        ("gone.txt", "read_error"): 1,
        ("random.txt", "undecodable"): 1,
        ("empty.txt", "empty_doc"): 1,
    }
    assert sum(stats.dropped.values()) == len(quarantined) and stats.docs_in == len(records) + len(
        quarantined
    )


def test_permanent_read_errors_are_quarantined_transient_ones_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.storage import FileStore, StorageError

    write_jsonl(tmp_path / "a.jsonl", [{"text": "kept"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "locked"}])
    plan = plan_parts(list_inputs([str(tmp_path)], None), 1 << 20, s3=None)[0]
    real_open = FileStore.open_read

    def denied(self, key):
        if key == "b.jsonl":
            raise PermissionError(f"{key}: permission denied")
        return real_open(self, key)

    monkeypatch.setattr(FileStore, "open_read", denied)
    records, quarantined, stats = ingest_part(plan, IngestConfig(), None)
    assert [r.text for r in records] == ["kept"] and stats.dropped == {"read_error": 1}
    assert quarantined[0].source.endswith("/b.jsonl") and "permission denied" in quarantined[0].detail

    def outage(self, key):
        raise StorageError("S3 get failed: SlowDown after 8 attempts")

    monkeypatch.setattr(FileStore, "open_read", outage)
    with pytest.raises(StorageError, match="SlowDown"):  # the unit fails and is retried, nothing half-written
        ingest_part(plan, IngestConfig(), None)


# ---------------------------------------------------------------- determinism, the unit runner, the sample


def test_ids_are_stable_across_runs_and_part_sizes(tmp_path: Path) -> None:
    make_jsonl_corpus(tmp_path / "a.jsonl", 100, seed=5)
    (tmp_path / "b.txt").write_text(JAPANESE)
    runs = [ingest_all([str(tmp_path)], target=t)[0] for t in (10**9, 10**9, 300)]
    assert [r.id for r in runs[0]] == [r.id for r in runs[1]]
    assert sorted((r.id, r.text, r.meta) for r in runs[0]) == sorted((r.id, r.text, r.meta) for r in runs[2])


def test_run_ingest_part_writes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "x.jsonl", [{"text": "a"}, {"nope": 1}, {"text": "b"}])
    store = open_store(str(tmp_path / "store"), None)
    plan = plan_parts(list_inputs([str(tmp_path / "in")], None), 1 << 20, s3=None)[0]
    stats = run_ingest_part(store, "work/b/ingest", plan, IngestConfig(), None)
    assert [r.text for r in read_part(store, "work/b/ingest", 0)] == ["a", "b"]
    assert [q.reason for q in read_quarantine(store, "work/b/ingest")] == ["missing_text"]
    assert read_part_stats(store, "work/b/ingest", 0).to_json() == stats.to_json()
    monkeypatch.setattr(
        "pipeline.ingest.stage.ingest_part", lambda *a, **k: pytest.fail("a done part was redone")
    )
    assert run_ingest_part(store, "work/b/ingest", plan, IngestConfig(), None).to_json() == stats.to_json()


def _original_texts() -> dict[str, str]:
    data = (
        zstandard.ZstdDecompressor()
        .decompressobj()
        .decompress((sample_corpus_path() / "debian-reference.jsonl.zst").read_bytes())
    )
    rows = [json.loads(line) for line in data.splitlines()]
    return {r["meta"]["path"].rsplit("/", 1)[1]: r["text"] for r in rows}


def test_sample_corpus_ingests() -> None:
    records, quarantined, stats = ingest_all([str(sample_corpus_path())], target=1 << 20)
    assert quarantined == [] and stats.docs_out == len(records) > 250
    langs = Counter(r.meta_dict()["user"].get("lang") for r in records)
    assert {"en", "de", "fr", "ja", "zh-cn", "ru"} <= set(langs)
    assert stats.extra["encoding.shift_jis"] == 1 and stats.extra["encoding.gb18030"] == 1
    originals = _original_texts()
    legacy = [r for r in records if "/legacy/" in r.source]
    assert len(legacy) == 4
    for record in legacy:  # each re-encoded preface decodes to exactly its UTF-8 original
        lang = record.source.rsplit("/", 1)[1].split("-pr01")[0]
        assert record.text == originals[f"pr01.{lang}.html"], record.source
    gpl = [r.text for r in records if r.source.endswith(("/GPL-2.txt", "/GPL-3.txt"))]
    assert len(gpl) == 2 and all("GNU GENERAL PUBLIC LICENSE" in t for t in gpl)


@pytest.mark.s3
def test_ingest_from_s3(s3_bucket, tmp_path: Path) -> None:
    texts = make_jsonl_corpus(tmp_path / "big.jsonl", 300, seed=9)
    raw = (tmp_path / "big.jsonl").read_bytes()
    store = open_store(s3_bucket.uri, s3=s3_bucket.options)
    store.put_bytes("raw/big.jsonl", raw)
    store.put_bytes("raw/sub/small.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"text": "zst doc"}\n'))
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=50)
    store.put_file("raw/t.parquet", tmp_path / "t.parquet")
    store.put_bytes("raw-other/not-me.jsonl", b'{"text": "outside the folder"}\n')
    source = f"{s3_bucket.uri}/raw"
    inputs = list_inputs([source], s3_bucket.options)
    assert [i.uri.removeprefix(source) for i in inputs] == [
        "/big.jsonl",
        "/sub/small.jsonl.zst",
        "/t.parquet",
    ]
    assert inputs[0].size == len(raw) and inputs[0].etag
    globbed = list_inputs([f"{source}/*.parquet", f"{source}/big.jsonl"], s3_bucket.options)
    assert [i.uri for i in globbed] == [f"{source}/big.jsonl", f"{source}/t.parquet"]
    records, quarantined, stats = ingest_all([source], target=len(raw) // 4, s3=s3_bucket.options)
    assert quarantined == [] and stats.extra["pieces"] > 3
    assert sorted(r.text for r in records) == sorted([*texts, *texts, "zst doc"])
    local, _, _ = ingest_all([str(tmp_path / "big.jsonl")])
    assert {r.id.rsplit("#", 1)[1] for r in records if r.source.endswith("big.jsonl")} == {
        r.id.rsplit("#", 1)[1] for r in local
    }


@pytest.mark.s3
def test_odd_keys_in_an_s3_listing_are_quarantined_and_the_build_goes_on(s3_bucket) -> None:
    import boto3

    admin = boto3.client("s3", endpoint_url=s3_bucket.options.endpoint_url, region_name="us-east-1")
    good = b'{"text": "a good document"}\n'
    odd = ["odd/../escape.jsonl", "odd//double.jsonl", "odd/nul\x00.jsonl", "odd/./dot.jsonl"]
    for key in ["odd/good.jsonl", *odd]:
        admin.put_object(Bucket=s3_bucket.bucket, Key=key, Body=good)
    admin.put_object(Bucket=s3_bucket.bucket, Key="/absolute.jsonl", Body=good)
    source = f"s3://{s3_bucket.bucket}/"  # the whole bucket: the absolute key is listed too
    records, quarantined, stats = ingest_all([source], s3=s3_bucket.options)
    assert [r.source for r in records] == [f"s3://{s3_bucket.bucket}/odd/good.jsonl"]
    assert sorted(q.source for q in quarantined) == sorted(
        f"s3://{s3_bucket.bucket}/{k}" for k in ["/absolute.jsonl", *odd]
    )
    assert {q.reason for q in quarantined} == {"bad_key"} and stats.dropped["bad_key"] == 5
    details = " ".join(q.detail for q in quarantined)
    assert "'..'" in details and "NUL" in details and "relative" in details and "not canonical" in details


def test_empty_inputs_are_counted(tmp_path: Path) -> None:
    (tmp_path / "zero.jsonl").write_bytes(b"")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    (tmp_path / "empty.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))
    (tmp_path / "zero.txt").write_bytes(b"")
    (tmp_path / "one.jsonl").write_bytes(b'{"text": "one document"}\n')
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert [r.text for r in records] == ["one document"]
    # a .txt file is one document: an empty one is already an empty_doc in the quarantine
    assert [(q.source.rsplit("/", 1)[1], q.reason) for q in quarantined] == [("zero.txt", "empty_doc")]
    assert stats.extra["empty_input"] == 3  # the files that hold no document at all
