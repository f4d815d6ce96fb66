"""Near-dedup steps end to end: planted pairs at known Jaccard, datasketch agreement, crash + rerun, CJK, index."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasketch import MinHashLSH

from pipeline.dedup.audit import format_cluster
from pipeline.dedup.candidates import plan_near_dedup, run_bands_part, run_edges_part
from pipeline.dedup.clusters import run_clusters
from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.lsh import make_refs
from pipeline.dedup.minhash import set_jaccard
from pipeline.dedup.near import run_near_dedup
from pipeline.dedup.signatures import (
    gather_signatures,
    open_index,
    run_signatures_part,
    save_index,
    save_index_parts,
    write_index_meta,
)
from pipeline.records import Record, read_part, write_part
from pipeline.storage import FileStore
from pipeline.units.protocol import StageStats

N_TOKENS = 400


def unique_doc(prefix: str, n: int = N_TOKENS) -> list[str]:
    return [f"{prefix}t{i}" for i in range(n)]


def variant(tokens: list[str], k: int, tag: str) -> list[str]:
    """Replace the last k tokens by fresh ones: with unique tokens the shingle-set Jaccard is exact."""
    return tokens[: len(tokens) - k] + [f"{tag}x{i}" for i in range(k)]


def planted_corpus() -> tuple[list[list[Record]], dict[str, float]]:
    """Two parts: originals in part 0, variants in part 1; returns the planted true Jaccard per variant id."""
    cfg = NearDedupConfig()
    hasher = cfg.hasher()
    part0, part1, planted = [], [], {}
    ks = [4, 6, 8, 10, 12, 14, 16, 18, 20] * 2 + [140, 160, 200, 260, 300, 350]
    for i, k in enumerate(ks):
        base = unique_doc(f"d{i}")
        var = variant(base, k, f"v{i}")
        part0.append(Record(f"orig/{i:03d}", " ".join(base), "books"))
        part1.append(Record(f"var/{i:03d}", " ".join(var), "web"))
        planted[f"var/{i:03d}"] = set_jaccard(
            set(hasher.shingles(part0[-1].text)), set(hasher.shingles(part1[-1].text))
        )
    part1.append(Record("empty/0", "", "web"))
    part1.append(Record("empty/1", "...", "web"))
    return [part0, part1], planted


def write_corpus(store: FileStore, parts: list[list[Record]], folder: str = "in") -> None:
    for i, records in enumerate(parts):
        write_part(store, folder, i, records, StageStats(stage="clean", docs_in=len(records)))


def out_ids(store: FileStore, folder: str, num_parts: int) -> list[str]:
    return [r.id for i in range(num_parts) for r in read_part(store, folder, i)]


def test_planted_pairs_merged_above_090_kept_below_050(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    parts, planted = planted_corpus()
    write_corpus(store, parts)
    assert min(j for j in planted.values() if j >= 0.9) >= 0.9
    assert sum(j >= 0.9 for j in planted.values()) == 18 and sum(j <= 0.5 for j in planted.values()) == 6
    stats = run_near_dedup(store, "in", "work", "out", 2, NearDedupConfig())
    kept = set(out_ids(store, "out", 2))
    for vid, j in planted.items():
        if j >= 0.9:
            assert vid not in kept, (vid, j)  # the shorter-or-later copy goes; originals stay
        elif j <= 0.5:
            assert vid in kept, (vid, j)
    assert {f"orig/{i:03d}" for i in range(24)} <= kept and {"empty/0", "empty/1"} <= kept
    report = stats.extra["report"]
    assert report["removed_near"] == 18 == stats.dropped["near_duplicate"]
    assert report["per_source"]["web"] == {"docs": 26, "removed_near": 18, "rate": round(18 / 26, 6)}
    assert report["cluster_size_histogram"] == {"2": 18}
    assert report["no_shingle_docs"] == 2
    for pair in report["sampled_pairs"]:
        assert pair["true_jaccard"] == pytest.approx(planted[pair["dropped"]], abs=1e-4)
        assert abs(pair["estimated_jaccard"] - pair["true_jaccard"]) < 0.2
    curve = dict(report["s_curve"])
    assert curve[0.0] == 0.0 and curve[1.0] == 1.0 and curve[0.5] < 0.01 < 0.99 < curve[0.95]
    text = format_cluster(store, "work", None)
    assert "KEPT orig/" in text and "dropped var/" in text


def datasketch_clusters(
    store: FileStore, cfg: NearDedupConfig, num_parts: int, verify: bool
) -> set[frozenset]:
    """Clusters from datasketch.MinHashLSH over the same signatures: query every doc, union the results."""
    hasher = cfg.hasher()
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    sketches = {}
    for i in range(num_parts):
        from pipeline.dedup.signatures import load_signatures

        sigs, docs = load_signatures(store, "work/signatures", i)
        for row, (doc_id, count) in enumerate(
            zip(docs.column("id").to_pylist(), docs.column("shingles").to_pylist(), strict=True)
        ):
            if count:
                sketches[doc_id] = hasher.datasketch(sigs[row])
                lsh.insert(doc_id, sketches[doc_id])
    parent = {k: k for k in sketches}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for key, m in sketches.items():
        for other in lsh.query(m):
            if other != key and (not verify or m.jaccard(sketches[other]) >= cfg.threshold):
                parent[find(key)] = find(other)
    groups: dict[str, set[str]] = {}
    for k in sketches:
        groups.setdefault(find(k), set()).add(k)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def our_clusters(store: FileStore) -> set[frozenset]:
    table = pq.read_table(io.BytesIO(store.get_bytes("work/clusters/clusters.parquet")))
    groups: dict[int, set[str]] = {}
    for row in table.to_pylist():
        groups.setdefault(row["cluster"], set()).add(row["id"])
    return {frozenset(g) for g in groups.values()}


def mutated_corpus(seed: int = 3) -> list[list[Record]]:
    """Random near-duplicate families at a range of similarities around the threshold."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(400)]
    parts: list[list[Record]] = [[], [], []]
    for fam in range(40):
        base = list(rng.choice(vocab, size=120))
        for copy in range(int(rng.integers(1, 4))):
            words = list(base)
            for pos in rng.choice(len(words), size=int(rng.integers(0, 7)), replace=False):
                words[pos] = str(rng.choice(vocab))
            parts[int(rng.integers(0, 3))].append(Record(f"f{fam}/c{copy}", " ".join(words), f"s{fam % 3}"))
    return parts


@pytest.mark.parametrize("verify", [False, True])
def test_clusters_equal_datasketch_minhashlsh(tmp_path: Path, verify: bool) -> None:
    store = FileStore(tmp_path)
    parts = mutated_corpus()
    write_corpus(store, parts)
    cfg = NearDedupConfig(verify=verify, ngram=3)
    run_near_dedup(store, "in", "work", "out", 3, cfg)
    expected = datasketch_clusters(store, cfg, 3, verify)
    assert len(expected) >= 10
    assert our_clusters(store) == expected


def test_partitions_do_not_change_the_result(tmp_path: Path) -> None:
    parts = mutated_corpus(seed=5)
    results = []
    for partitions in (1, 4):
        store = FileStore(tmp_path / str(partitions))
        write_corpus(store, parts)
        cfg = NearDedupConfig(ngram=3)
        b, r = cfg.bands()
        plan = {
            "bands": b,
            "rows": r,
            "num_parts": 3,
            "index_parts": 0,
            "docs": 0,
            "index_docs": 0,
            "num_partitions": partitions,
            "partition_bytes": 0,
            "memory_budget_mb": 16,
        }
        store.put_bytes("work/plan.json", json.dumps(plan).encode())
        run_near_dedup(store, "in", "work", "out", 3, cfg)
        assert len(list(store.list("work/edges/"))) == 5 * partitions  # edges, forest, nodes, stats, marker
        results.append((our_clusters(store), out_ids(store, "out", 3)))
    assert results[0] == results[1]


def snapshot(store: FileStore) -> tuple:
    report = json.loads(store.get_bytes("work/clusters/dedup_report.json"))
    return out_ids(store, "out", 3), our_clusters(store), report


def test_crash_between_steps_then_rerun_equals_clean_run(tmp_path: Path) -> None:
    parts = mutated_corpus(seed=9)
    cfg = NearDedupConfig(ngram=3)
    clean = FileStore(tmp_path / "clean")
    write_corpus(clean, parts)
    run_near_dedup(clean, "in", "work", "out", 3, cfg)

    crashed = FileStore(tmp_path / "crashed")
    write_corpus(crashed, parts)
    for i in range(3):
        run_signatures_part(crashed, "in", "work/signatures", i, cfg)
    plan = plan_near_dedup(crashed, "work", 3, cfg)
    run_bands_part(crashed, "work", 0, cfg, plan)
    # Crash inside bands of part 1: an output file written, no stats, no marker.
    crashed.put_bytes("work/bands/part-00001/p-00000.npz", b"partial garbage")
    # Crash inside signatures of part 2 on a rerun: its marker is gone, its matrix is truncated.
    crashed.delete("work/signatures/part-00002.done")
    crashed.put_bytes("work/signatures/part-00002.sig.npz", b"trunc")
    with pytest.raises(FileNotFoundError, match="done"):
        run_edges_part(crashed, "work", 0, cfg, plan)  # never reads units without a marker
    with pytest.raises(FileNotFoundError):
        run_clusters(crashed, "in", "work", 3, cfg)
    run_near_dedup(crashed, "in", "work", "out", 3, cfg)
    assert snapshot(crashed) == snapshot(clean)
    before = crashed.stat("work/signatures/part-00000.sig.npz").mtime
    run_near_dedup(crashed, "in", "work", "out", 3, cfg)  # a rerun of a finished build redoes nothing
    assert crashed.stat("work/signatures/part-00000.sig.npz").mtime == before


def test_cjk_character_shingles(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    zh = (
        "近似重复文档的删除是构建大规模语料库时最重要的步骤之一，因为重复的文本会让模型记住训练数据而不是学习语言本身的规律。"
        * 3
    )
    ja = (
        "日本語の文書には単語の間に空白がないので、文字の連続をシングルとして使う必要があります。これは重要です。"
        * 3
    )
    near = zh[:-3] + "之规律"  # three characters changed at the end
    parts = [[Record("zh/0", zh, "zh"), Record("ja/0", ja, "ja"), Record("zh/1", near, "zh")]]
    write_corpus(store, parts)
    stats = run_near_dedup(store, "in", "work", "out", 1, NearDedupConfig(shingle="char", ngram=5))
    assert out_ids(store, "out", 1) == ["zh/0", "ja/0"]
    assert stats.extra["report"]["per_source"]["zh"]["removed_near"] == 1
    # With word shingles a whole CJK run is one token: the edit makes the docs look unrelated.
    store2 = FileStore(tmp_path / "word")
    write_corpus(store2, parts)
    run_near_dedup(store2, "in", "work", "out", 1, NearDedupConfig(shingle="word"))
    assert out_ids(store2, "out", 1) == ["zh/0", "ja/0", "zh/1"]


def test_persisted_index_drops_duplicates_of_a_previous_build(tmp_path: Path) -> None:
    cfg = NearDedupConfig()
    first = FileStore(tmp_path / "build1")
    old = [Record(f"old/{i}", " ".join(unique_doc(f"o{i}")), "old") for i in range(6)]
    write_corpus(first, [old])
    run_near_dedup(first, "in", "work", "out", 1, cfg)
    index_uri = f"file://{tmp_path / 'index'}"
    assert save_index(first, "work", 1, cfg, index_uri) == 6

    second = FileStore(tmp_path / "build2")
    new = [
        Record("new/dup0", " ".join(variant(unique_doc("o0"), 5, "n0")), "web"),
        Record("new/dup3", " ".join(unique_doc("o3")), "web"),
        Record("new/fresh", " ".join(unique_doc("fresh")), "web"),
    ]
    write_corpus(second, [new])
    stats = run_near_dedup(second, "in", "work", "out", 1, NearDedupConfig(index_uri=index_uri))
    assert out_ids(second, "out", 1) == ["new/fresh"]
    assert stats.dropped["near_duplicate_of_index"] == 2 and stats.dropped["near_duplicate"] == 0
    report = stats.extra["report"]
    assert report["removed_near_of_index"] == 2 and report["params"]["index_docs"] == 6
    assert all(c["with_index"] for c in report["largest_clusters"])
    # Signatures of index docs are served from the index store.
    sig = gather_signatures(
        second, "work", make_refs(0, np.array([0]), index=True), NearDedupConfig(index_uri=index_uri)
    )
    assert sig.shape == (1, 128)
    with pytest.raises(ValueError, match="not comparable"):
        third = FileStore(tmp_path / "build3")
        write_corpus(third, [new])
        run_near_dedup(third, "in", "work", "out", 1, NearDedupConfig(index_uri=index_uri, ngram=3))


def test_saving_the_index_part_by_part_resumes_and_is_usable_only_once_its_meta_is_written(
    tmp_path: Path,
) -> None:
    """A build's workers save the index parts, then the flow writes index.json: an interrupted save redoes only
    the parts whose unit is not done, and no build can use the index before its meta exists."""
    store = FileStore(tmp_path / "build")
    docs = [Record(f"d/{i}", " ".join(unique_doc(f"d{i}")), "s") for i in range(5)]
    dup = Record("d/dup", " ".join(variant(unique_doc("d1"), 3, "x")), "s")
    write_corpus(store, [docs[:3], [*docs[3:], dup]])
    run_near_dedup(store, "in", "work", "out", 2, NearDedupConfig())
    uri, index = f"file://{tmp_path / 'index'}", tmp_path / "index"
    kept = save_index_parts(store, "work", [1, 0], NearDedupConfig(), uri)
    assert sorted(kept) == [2, 3] and sum(kept) == 5  # the near duplicate is not indexed
    with pytest.raises(FileNotFoundError, match=r"no index\.json"):
        open_index(store, NearDedupConfig(index_uri=uri))

    first = (index / "part-00000.sig.npz").stat().st_mtime_ns
    (index / "part-00001.done").unlink()  # part 1 was interrupted before its marker
    (index / "part-00001.sig.npz").unlink()
    assert save_index_parts(store, "work", [1, 0], NearDedupConfig(), uri) == kept
    assert (index / "part-00000.sig.npz").stat().st_mtime_ns == first  # done: read back, not rewritten
    assert (index / "part-00001.sig.npz").is_file() and (index / "part-00001.done").is_file()

    assert write_index_meta(store, 2, NearDedupConfig(), uri, sum(kept)) == 5
    opened = open_index(store, NearDedupConfig(index_uri=uri))
    assert opened is not None and opened[1] == 2
    assert json.loads((index / "index.json").read_text())["docs"] == 5


def test_report_warns_on_zero_removal(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    write_corpus(store, [[Record(f"u/{i}", " ".join(unique_doc(f"u{i}", 50)), "s") for i in range(5)]])
    stats = run_near_dedup(store, "in", "work", "out", 1, NearDedupConfig())
    report = stats.extra["report"]
    assert report["removed_near"] == 0 and report["clusters"] == 0
    assert any("0%" in w for w in report["warnings"])
    assert format_cluster(store, "work") == "no near-duplicate clusters in this run"


def test_disabled_passes_documents_through(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    parts = mutated_corpus()
    write_corpus(store, parts)
    stats = run_near_dedup(store, "in", "work", "out", 3, NearDedupConfig(enabled=False))
    assert stats.docs_in == stats.docs_out == sum(len(p) for p in parts)
    assert out_ids(store, "out", 3) == [r.id for p in parts for r in p]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", 0.0),
        ("num_perm", 1),
        ("shingle", "bpe"),
        ("hash", "md5"),
        ("scheme", "x"),
        ("fp_weight", 0.9),
        ("memory_budget_mb", 1),
        ("ngram", 0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        NearDedupConfig(**{field: value})


def test_report_warns_on_implausibly_high_removal(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    base = unique_doc("b")
    docs = [Record(f"copy/{i}", " ".join(variant(base, i, f"c{i}")), "s") for i in range(4)]
    docs.append(Record("other/0", " ".join(unique_doc("o")), "s"))
    write_corpus(store, [docs])
    report = run_near_dedup(store, "in", "work", "out", 1, NearDedupConfig()).extra["report"]
    assert report["removed_near"] == 3 and report["removal_rate_near"] == 0.6
    assert any("implausibly high" in w for w in report["warnings"])
    assert report["largest_clusters"][0]["kept"] == ["copy/0"]  # the longest copy (edits are shorter tokens)
    with pytest.raises(ValueError, match="cluster 7 does not exist"):
        format_cluster(store, "work", 7)


def single_process_clusters(store: FileStore, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The clusters and keepers as one process computes them from every verified edge at once (before the
    clustering was split into a forest per partition): per clustered ref, in clusters.parquet's order."""
    from pipeline.dedup.graph import choose_keepers, connected_labels
    from pipeline.dedup.lsh import unique_pairs

    edges = [
        dict(np.load(io.BytesIO(store.get_bytes(f"work/edges/p-{p:05d}.npz")))) for p in range(num_partitions)
    ]
    u, v = unique_pairs(np.concatenate([e["u"] for e in edges]), np.concatenate([e["v"] for e in edges]))
    nodes, labels = connected_labels(u, v)
    table = pq.read_table(io.BytesIO(store.get_bytes("work/clusters/clusters.parquet")))
    assert np.array_equal(table.column("ref").to_numpy(), nodes)
    ids = np.array(table.column("id").to_pylist(), dtype=str)
    whole = choose_keepers(nodes, labels, table.column("nbytes").to_numpy(), ids)
    return whole.cluster, whole.keep


@pytest.mark.parametrize(
    ("corpus", "partitions"),
    [("planted", 1), ("planted", 2), ("mutated-3", 1), ("mutated-3", 4), ("mutated-5", 2), ("mutated-9", 4)],
)
def test_clusters_from_partition_forests_equal_the_single_process_clusters(
    tmp_path: Path, corpus: str, partitions: int
) -> None:
    """The test corpora of this module, clustered from each bucket partition's forest (on the workers in a build),
    give the clusters and keepers of the single-process clustering of all the edges."""
    parts = planted_corpus()[0] if corpus == "planted" else mutated_corpus(seed=int(corpus.split("-")[1]))
    store = FileStore(tmp_path)
    write_corpus(store, parts)
    cfg = NearDedupConfig() if corpus == "planted" else NearDedupConfig(ngram=3)
    b, r = cfg.bands()
    plan = {"bands": b, "rows": r, "num_parts": len(parts), "index_parts": 0, "docs": 0, "index_docs": 0}
    plan |= {"num_partitions": partitions, "partition_bytes": 0, "memory_budget_mb": 16}
    store.put_bytes("work/plan.json", json.dumps(plan).encode())
    run_near_dedup(store, "in", "work", "out", len(parts), cfg)
    assert all(store.exists(f"work/edges/p-{p:05d}.forest.npz") for p in range(partitions))
    table = pq.read_table(io.BytesIO(store.get_bytes("work/clusters/clusters.parquet")))
    cluster, keep = single_process_clusters(store, partitions)
    assert (
        table.column("cluster").to_pylist() == cluster.tolist()
        and table.column("keep").to_pylist() == keep.tolist()
    )
    assert (~keep).sum() >= 3  # real clusters, not a vacuous equality


class RecordingReads(FileStore):
    """A folder store that records the key of every whole read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.keys: list[str] = []

    def get_bytes(self, key: str) -> bytes:
        self.keys.append(key)
        return super().get_bytes(key)


@pytest.mark.parametrize(("corpus", "partitions"), [("planted", 2), ("mutated-3", 4), ("mutated-9", 1)])
def test_the_clustering_reads_the_forests_documents_not_every_docs_table(
    tmp_path: Path, corpus: str, partitions: int
) -> None:
    """The clustering takes the clustered documents' ids and sizes from the node tables the edges units wrote
    (their size grows with the duplicated documents, not the corpus): no docs table is read, and the clusters,
    keepers and drop lists are those of the clustering that reads every docs table (edges units of before)."""
    parts = planted_corpus()[0] if corpus == "planted" else mutated_corpus(seed=int(corpus.split("-")[1]))
    # no sampled pairs: the report reads their parts' signatures, a fixed number, whatever the corpus
    cfg = NearDedupConfig(pair_samples=0) if corpus == "planted" else NearDedupConfig(ngram=3, pair_samples=0)
    b, r = cfg.bands()
    plan = {"bands": b, "rows": r, "num_parts": len(parts), "index_parts": 0, "docs": 0, "index_docs": 0}
    plan |= {"num_partitions": partitions, "partition_bytes": 0, "memory_budget_mb": 16}
    store = RecordingReads(tmp_path)
    write_corpus(store, parts)
    store.put_bytes("work/plan.json", json.dumps(plan).encode())
    run_near_dedup(store, "in", "work", "out", len(parts), cfg)
    files = ["clusters.parquet", *(f"drop/part-{i:05d}.npz" for i in range(len(parts)))]
    outputs = [[store.get_bytes(f"work/clusters/{f}") for f in files]]
    for older in (False, True):
        for info in store.list("work/clusters/"):
            store.delete(info.key)
        if older:
            for p in range(partitions):
                store.delete(f"work/edges/p-{p:05d}.nodes.parquet")
        store.keys.clear()
        run_clusters(store, "in", "work", len(parts), cfg)
        docs_read = [k for k in store.keys if k.endswith(".docs.parquet")]
        assert (len(docs_read) > 0) == older, docs_read
        outputs.append([store.get_bytes(f"work/clusters/{f}") for f in files])
    assert outputs[0] == outputs[1] == outputs[2]
    table = pq.read_table(io.BytesIO(outputs[0][0]))
    assert (~np.array(table.column("keep").to_pylist())).sum() >= 3
