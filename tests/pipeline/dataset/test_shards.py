"""Shard planning, the MMIDIDX format (checked by an independent reader written here from the spec), the
streaming writer, and the shards of a real tiny dataset built by the pipeline."""

from __future__ import annotations

import filecmp
import io
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.dataset.publish import (
    count_source_tokens,
    iter_token_batches,
    part_source_tokens,
    run_split_count_part,
    write_shards,
)
from pipeline.dataset.shards import (
    DOCS_SCHEMA,
    IndexedShard,
    ShardConfig,
    ShardWriter,
    dtype_code,
    dtype_for_vocab,
    plan_shards,
    read_idx,
    split_of,
    write_idx,
)
from pipeline.records import Record
from pipeline.storage import FileStore
from pipeline.tokenize.stage import tokens_table, write_token_part
from pipeline.units.protocol import StageStats
from tests.fixtures.tiny_dataset import NUM_PARTS, build_tiny_dataset

CODES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


def read_mmidx(bin_path: Path, idx_path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Independent MMIDIDX reader (from the format description, not from pipeline.dataset.shards): sequences, doc_idx."""
    data = idx_path.read_bytes()
    assert data[:9] == b"MMIDIDX\x00\x00"
    version, code = struct.unpack("<QB", data[9:18])
    n_seq, n_doc = struct.unpack("<QQ", data[18:34])
    assert version == 1 and code in CODES
    sizes = np.frombuffer(data[34 : 34 + 4 * n_seq], dtype="<i4")
    pointers = np.frombuffer(data[34 + 4 * n_seq : 34 + 12 * n_seq], dtype="<i8")
    doc_idx = np.frombuffer(data[34 + 12 * n_seq :], dtype="<i8")
    assert len(doc_idx) == n_doc
    raw = bin_path.read_bytes()
    dtype = np.dtype(CODES[code]).newbyteorder("<")
    seqs = [
        np.frombuffer(raw, dtype=dtype, count=int(n), offset=int(p))
        for n, p in zip(sizes, pointers, strict=True)
    ]
    return seqs, doc_idx


# ---------------------------------------------------------------- planning


@pytest.mark.parametrize("target", [1, 2, 3, 7, 10, 64, 1000])
def test_plan_shards_grid_conserves_balances_and_counts(target: int) -> None:
    for total in range(0, 2500):
        sizes = plan_shards(total, target)
        assert sum(sizes) == total
        assert len(sizes) == -(-total // target)
        if sizes:
            assert max(sizes) - min(sizes) <= 1
            assert max(sizes) <= target
            assert sizes == sorted(sizes, reverse=True)


def test_plan_shards_large_and_errors() -> None:
    sizes = plan_shards(10**12 + 7, 32 * 2**20)
    assert sum(sizes) == 10**12 + 7 and max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="total_tokens"):
        plan_shards(-1, 10)
    with pytest.raises(ValueError, match="target_tokens"):
        plan_shards(10, 0)


def test_dtype_for_vocab_follows_megatron_and_never_uint32() -> None:
    assert dtype_for_vocab(512) == np.uint16 and dtype_code(dtype_for_vocab(512)) == 8
    assert dtype_for_vocab(50257) == np.uint16
    assert dtype_for_vocab(65499) == np.uint16
    assert dtype_for_vocab(65500) == np.int32 and dtype_code(dtype_for_vocab(65500)) == 4
    assert dtype_for_vocab(128256) == np.int32
    with pytest.raises(ValueError):
        dtype_for_vocab(0)
    with pytest.raises(ValueError, match="no MMIDIDX code"):
        dtype_code(np.uint32)


def test_split_of_is_deterministic_and_near_fraction() -> None:
    ids = [f"s3://b/file-{i}.jsonl#{i * 7}" for i in range(20000)]
    first = [split_of(i, 0.1) for i in ids]
    assert first == [split_of(i, 0.1) for i in ids]
    assert 0.09 < first.count("valid") / len(ids) < 0.11
    assert all(split_of(i, 0.0) == "train" for i in ids[:100])
    assert [split_of(i, 0.1, seed=1) for i in ids] != first


def test_shard_config_validates() -> None:
    with pytest.raises(ValueError, match="valid_fraction"):
        ShardConfig(valid_fraction=1.0)
    with pytest.raises(ValueError, match="target_bytes"):
        ShardConfig(target_bytes=1)
    assert ShardConfig(target_bytes=100).target_tokens(np.int32) == 25


# ---------------------------------------------------------------- the index format


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_write_idx_matches_independent_reader(tmp_path: Path, dtype) -> None:
    rng = np.random.default_rng(0)
    seqs = [
        rng.integers(0, 60000, size=int(n), dtype=np.int64).astype(dtype) for n in rng.integers(0, 50, 40)
    ]
    (tmp_path / "a.bin").write_bytes(
        b"".join(s.astype(np.dtype(dtype).newbyteorder("<")).tobytes() for s in seqs)
    )
    write_idx(tmp_path / "a.idx", [len(s) for s in seqs], dtype)
    got, doc_idx = read_mmidx(tmp_path / "a.bin", tmp_path / "a.idx")
    assert [g.tolist() for g in got] == [s.tolist() for s in seqs]
    assert doc_idx.tolist() == list(range(len(seqs) + 1))
    shard = IndexedShard(tmp_path / "a.bin")
    assert len(shard) == len(seqs) and shard.num_tokens == sum(len(s) for s in seqs)
    assert all(shard[i].tolist() == s.tolist() for i, s in enumerate(seqs))
    with pytest.raises(IndexError):
        shard[len(seqs)]


def test_write_idx_to_file_object_and_empty(tmp_path: Path) -> None:
    buf = io.BytesIO()
    write_idx(buf, [], np.uint16)
    index = read_idx(buf.getvalue())
    assert len(index.sizes) == 0 and index.doc_idx.tolist() == [0]


def test_read_idx_rejects_corrupt_files(tmp_path: Path) -> None:
    buf = io.BytesIO()
    write_idx(buf, [3, 4], np.uint16)
    good = buf.getvalue()
    with pytest.raises(ValueError, match="magic"):
        read_idx(b"XXXXXXXXX" + good[9:])
    with pytest.raises(ValueError, match="bytes"):
        read_idx(good[:-1])
    with pytest.raises(ValueError, match="version"):
        read_idx(good[:9] + struct.pack("<Q", 2) + good[17:])
    (tmp_path / "s.bin").write_bytes(b"\x00" * 12)  # index says 7 tokens = 14 bytes
    (tmp_path / "s.idx").write_bytes(good)
    with pytest.raises(ValueError, match="14"):
        IndexedShard(tmp_path / "s.bin")


# ---------------------------------------------------------------- the writer


def _docs(n: int, seed: int, eos: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for n_tok in rng.integers(0, 40, n):
        out.append(np.append(rng.integers(2, 500, int(n_tok)), eos).astype(np.uint32))
    return out


@pytest.mark.parametrize(("n_docs", "target"), [(1, 1), (5, 3), (50, 7), (50, 100), (200, 1000), (30, 10**6)])
def test_shard_writer_balances_splits_and_reassembles(tmp_path: Path, n_docs: int, target: int) -> None:
    docs = _docs(n_docs, seed=n_docs + target)
    sizes = plan_shards(sum(len(d) for d in docs), target)
    writer = ShardWriter(tmp_path, "train", sizes, np.uint16)
    for i, d in enumerate(docs):
        writer.add(f"doc-{i}", "src", str(i), d)
    shards = writer.close()
    assert [s.tokens for s in shards] == sizes
    assert sum(s.docs for s in shards) == n_docs
    pieces: dict[str, list[np.ndarray]] = {}
    offset = 0
    for s in shards:
        seqs, doc_idx = read_mmidx(tmp_path / s.key, tmp_path / s.idx_key)
        table = pq.read_table(tmp_path / s.docs_key)
        assert table.schema.equals(DOCS_SCHEMA)
        rows = table.to_pylist()
        assert len(rows) == len(seqs) == s.sequences == len(doc_idx) - 1
        assert s.token_offset == offset
        offset += s.tokens
        for row, seq in zip(rows, seqs, strict=True):
            assert row["tokens"] == len(seq)
            assert row["piece"] == len(pieces.get(row["doc_id"], []))
            pieces.setdefault(row["doc_id"], []).append(seq)
    assert {k: np.concatenate(v).tolist() for k, v in pieces.items()} == {
        f"doc-{i}": d.tolist() for i, d in enumerate(docs)
    }


def test_shard_writer_refuses_wrong_totals_and_out_of_range_ids(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, "train", [5], np.uint16)
    writer.add("a", "s", "0", np.arange(3, dtype=np.uint32))
    with pytest.raises(ValueError, match="planned 5"):
        writer.close()
    writer = ShardWriter(tmp_path / "b", "train", [2], np.uint16)
    with pytest.raises(ValueError, match="exceeds the planned"):
        writer.add("a", "s", "0", np.arange(3, dtype=np.uint32))
    writer = ShardWriter(tmp_path / "c", "train", [2], np.uint16)
    with pytest.raises(ValueError, match="outside uint16"):
        writer.add("a", "s", "0", np.array([1, 70000], dtype=np.uint32))
    with pytest.raises(ValueError, match="no tokens"):
        writer.add("empty", "s", "0", np.zeros(0, dtype=np.uint32))
    with pytest.raises(ValueError, match="> 0"):
        ShardWriter(tmp_path, "train", [3, 0], np.uint16)


# ---------------------------------------------------------------- shards of a real pipeline run


def _token_parts(root: Path) -> dict[str, list[int]]:
    store = FileStore(root)
    docs: dict[str, list[int]] = {}
    for i in range(NUM_PARTS):
        for batch in iter_token_batches(store, "work/tiny/tokens", i, columns=("id", "tokens")):
            docs.update(zip(batch.column("id").to_pylist(), batch.column("tokens").to_pylist(), strict=True))
    return docs


def test_tiny_dataset_shards_conserve_and_reassemble_every_document(tmp_path: Path) -> None:
    uri = build_tiny_dataset(tmp_path, n_docs=120, shard_tokens=300, valid_fraction=0.2)
    folder = Path(uri.removeprefix("file://")).parent
    manifest = json.loads((folder / "manifest.json").read_text())
    eos = manifest["tokenizer"]["eos_id"]
    expected = _token_parts(tmp_path)
    assert all(t[-1] == eos for t in expected.values())
    rebuilt: dict[str, list[int]] = {}
    for split in ("train", "valid"):
        shards = [s for s in manifest["shards"] if s["split"] == split]
        assert len(shards) == manifest["splits"][split]["shards"] >= 1
        assert max(s["tokens"] for s in shards) - min(s["tokens"] for s in shards) <= 1
        stream = []
        for s in shards:
            seqs, _ = read_mmidx(folder / s["key"], folder / s["idx_key"])
            rows = pq.read_table(folder / s["docs_key"]).to_pylist()
            for row, seq in zip(rows, seqs, strict=True):
                rebuilt.setdefault(row["doc_id"], []).extend(seq.tolist())
                stream.extend(seq.tolist())
        assert len(stream) == manifest["splits"][split]["tokens"]
        assert stream.count(eos) == manifest["splits"][split]["docs"]
    assert rebuilt == expected
    assert sum(len(t) for t in expected.values()) == sum(s["tokens"] for s in manifest["shards"])


def test_same_inputs_give_same_id_and_byte_identical_shards(tmp_path: Path) -> None:
    a = Path(build_tiny_dataset(tmp_path / "a", n_docs=80).removeprefix("file://")).parent
    b = Path(build_tiny_dataset(tmp_path / "b", n_docs=80).removeprefix("file://")).parent
    assert a.name == b.name
    files = sorted(
        p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and p.name != "manifest.json"
    )
    assert len(files) > 5
    _match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert (mismatch, errors) == ([], [])
    c = Path(build_tiny_dataset(tmp_path / "c", n_docs=80, seed=1).removeprefix("file://")).parent
    assert c.name != a.name


def test_write_shards_streams_parts_across_row_group_batches(tmp_path: Path) -> None:
    # 9000 documents per part: more than one 4096-row batch, so batch offsets must be handled.
    store = FileStore(tmp_path / "store")
    all_docs: dict[str, list[int]] = {}
    for part in range(2):
        docs = _docs(9000, seed=part)
        records = [
            Record(id=f"p{part}-{i}", text="", source="src", meta=f'{{"location": "{i}"}}')
            for i in range(len(docs))
        ]
        write_token_part(store, "tokens", part, [tokens_table(records, docs)], StageStats(stage="tokenize"))
        all_docs.update({r.id: d.tolist() for r, d in zip(records, docs, strict=True)})
    cfg = ShardConfig(target_bytes=2 * 50_000, valid_fraction=0.05)
    written = write_shards(store, "tokens", 2, tmp_path / "out", np.dtype(np.uint16), cfg)
    rebuilt: dict[str, list[int]] = {}
    for s in written:
        seqs, _ = read_mmidx(tmp_path / "out" / s.key, tmp_path / "out" / s.idx_key)
        for row, seq in zip(pq.read_table(tmp_path / "out" / s.docs_key).to_pylist(), seqs, strict=True):
            rebuilt.setdefault(row["doc_id"], []).extend(seq.tolist())
            assert split_of(row["doc_id"], 0.05) == s.split
    assert rebuilt == all_docs
    assert {s.split for s in written} == {"train", "valid"}
    assert sum(s.docs for s in written) == len(all_docs)


def test_shards_planned_from_per_part_split_counts_are_byte_identical(tmp_path: Path) -> None:
    """The build counts each token part's tokens per source and split on the workers; the shard step adds the
    counts up instead of reading every part twice, and writes the same bytes. Counts made under another split
    rule are not used."""
    store = FileStore(tmp_path / "store")
    for part in range(3):
        docs = _docs(500, seed=10 + part)
        records = [
            Record(id=f"p{part}-{i}", text="", source="src", meta=json.dumps({"source_name": f"s{i % 2}"}))
            for i in range(len(docs))
        ]
        write_token_part(store, "tokens", part, [tokens_table(records, docs)], StageStats(stage="tokenize"))
    cfg = ShardConfig(target_bytes=2 * 30_000, valid_fraction=0.1)
    for part in range(3):
        stats = run_split_count_part(store, "tokens", "counts", part, cfg)
        assert stats.extra["source_tokens"] == part_source_tokens(store, "tokens", part, cfg)
        assert set(stats.extra["source_tokens"]) == {"s0", "s1"}
    assert count_source_tokens(store, "tokens", 3, cfg, "counts") == count_source_tokens(
        store, "tokens", 3, cfg
    )

    def shard_bytes(out: str, **kw: str) -> dict[str, bytes]:
        write_shards(store, "tokens", 3, tmp_path / out, np.dtype(np.uint16), cfg, **kw)
        root = tmp_path / out
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            "pipeline.dataset.publish.part_source_tokens", lambda *a: pytest.fail("a part was read to count")
        )
        counted = shard_bytes("counted", counts_folder="counts")
    assert counted == shard_bytes("read") and len(counted) >= 6
    other_rule = ShardConfig(target_bytes=2 * 30_000, valid_fraction=0.3)
    assert (
        count_source_tokens(store, "tokens", 3, other_rule, "counts")
        == count_source_tokens(store, "tokens", 3, other_rule)
        != count_source_tokens(store, "tokens", 3, cfg)
    )


@pytest.mark.parametrize("target", [7, 37, 400, 10**5])
def test_add_batch_writes_the_same_bytes_as_one_document_at_a_time(tmp_path: Path, target: int) -> None:
    docs = _docs(60, seed=target)
    sizes = plan_shards(sum(len(d) for d in docs), target)
    one = ShardWriter(tmp_path / "one", "train", sizes, np.uint16)
    for i, d in enumerate(docs):
        one.add(f"d{i}", "s", str(i), d)
    many = ShardWriter(tmp_path / "many", "train", sizes, np.uint16)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    flat = np.concatenate(docs)
    for lo, hi in ((0, 7), (7, 8), (8, 60)):  # uneven batches, one of a single document
        ids = [f"d{i}" for i in range(lo, hi)]
        many.add_batch(
            ids,
            ["s"] * len(ids),
            [str(i) for i in range(lo, hi)],
            offsets[lo : hi + 1] - offsets[lo],
            flat[offsets[lo] : offsets[hi]],
        )
    assert one.close() == many.close()  # same sizes and sha256 of every file
    files = sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*.*"))
    assert filecmp.cmpfiles(tmp_path / "one", tmp_path / "many", files, shallow=False)[1:] == ([], [])


def test_docs_parquet_holds_url_and_date_and_top_domains_count_them(tmp_path: Path) -> None:
    from pipeline.sources import domain_tokens, format_top_domains

    metas = [
        json.dumps(
            {"source_name": "web", "url": "https://www.a.example/x", "warc_date": "2024-01-01T00:00:00Z"}
        ),
        json.dumps({"source_name": "web", "url": "http://b.example/y"}),
        json.dumps({"source_name": "web", "url": "https://a.example/z", "warc_date": "2024-02-01T00:00:00Z"}),
        json.dumps({"source_name": "books"}),
    ]
    writer = ShardWriter(tmp_path, "train", [14], np.uint16)
    for i, meta in enumerate(metas):
        name = json.loads(meta)["source_name"]
        writer.add(f"d{i}", "s", "B0", np.arange(2 + i, dtype=np.uint16), (name, "en", meta))
    (shard,) = writer.close()
    rows = pq.read_table(tmp_path / shard.docs_key).to_pylist()
    assert [r["url"] for r in rows] == [
        "https://www.a.example/x",
        "http://b.example/y",
        "https://a.example/z",
        "",
    ]
    assert [r["warc_date"] for r in rows] == ["2024-01-01T00:00:00Z", "", "2024-02-01T00:00:00Z", ""]
    top = domain_tokens([tmp_path / shard.docs_key])
    assert top == {"web": [("a.example", 2 + 4, 2), ("b.example", 3, 1)]}  # books has no URL: left out
    assert "a.example" in format_top_domains(top)
