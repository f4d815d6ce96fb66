"""Signatures equal datasketch's, element by element; banding, planner, union-find and keep rule are exact."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from pipeline.dedup.graph import choose_keepers, connected_labels, spanning_forest
from pipeline.dedup.lsh import (
    INDEX_FLAG,
    band_keys,
    candidate_pairs,
    make_refs,
    optimal_params,
    partition_of,
    plan_partitions,
    split_refs,
)
from pipeline.dedup.minhash import MinHasher, estimated_jaccard

REPO = Path(__file__).resolve().parents[3]

DOCS = [
    "The quick brown fox jumps over the lazy dog; the quick brown fox jumps again!",
    "THE QUICK brown fox -- jumps over the lazy cat. The quick brown fox jumps again.",
    "two words",
    "",
    "   ...,;  ",
    "Ünïcode Wörds — with “quotes”, tabs\tand\nnewlines, digits 12345 and snake_case_names",
    "重复数据删除是语料库构建的关键步骤。我们使用最小哈希来检测近似重复的文档。",
    "日本語のテキストです。重複を検出するために文字のシングルを使います。",
    "surrogate \udcff byte kept",
]


def datasketch_signature(hasher: MinHasher, text: str) -> np.ndarray:
    m = MinHash(num_perm=hasher.num_perm, seed=hasher.seed, hashfunc=hasher.hashfunc, scheme=hasher.scheme)
    for shingle in hasher.shingles(text):
        m.update(shingle)
    return m.hashvalues


@pytest.mark.parametrize(
    ("scheme", "hash_name", "shingle"),
    list(itertools.product(("affine32", "affine64", "legacy"), ("sha1", "xxh64"), ("word", "char"))),
)
def test_signatures_equal_datasketch_update(scheme: str, hash_name: str, shingle: str) -> None:
    hasher = MinHasher(num_perm=64, seed=7, ngram=3, shingle=shingle, hash=hash_name, scheme=scheme)
    sigs, counts = hasher.signatures(DOCS)
    assert sigs.shape == (len(DOCS), 64)
    for text, row, count in zip(DOCS, sigs, counts, strict=True):
        expected = datasketch_signature(hasher, text)
        assert expected.dtype == row.dtype
        np.testing.assert_array_equal(row, expected)
        assert count == len(hasher.shingles(text))
    assert counts[3] == 0  # nothing to shingle: an all-max row, flagged
    assert (counts[4] == 0) == (shingle == "word")  # punctuation separates words but is a character


def test_sha1_affine32_equals_plain_default_minhash() -> None:
    """hash="sha1" is datasketch's default hash: a plain MinHash() (no hashfunc given) agrees bit for bit."""
    hasher = MinHasher(hash="sha1")
    sigs, _ = hasher.signatures(DOCS[:3])
    for text, row in zip(DOCS[:3], sigs, strict=True):
        m = MinHash()
        m.update_batch(hasher.shingles(text))
        np.testing.assert_array_equal(row, m.hashvalues)


def test_default_fast_path_matches_datasketch_with_its_hashfunc_on_long_docs() -> None:
    rng = np.random.default_rng(0)
    words = [f"tok{i}" for i in range(3000)]
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 3000, size=12)]
    hasher = MinHasher()
    sigs, _ = hasher.signatures(texts)
    for text, row in zip(texts, sigs, strict=True):
        np.testing.assert_array_equal(row, datasketch_signature(hasher, text))


def test_signature_loads_into_datasketch_and_jaccard_agrees() -> None:
    hasher = MinHasher()
    sigs, _ = hasher.signatures(DOCS[:2])
    a, b = hasher.datasketch(sigs[0]), hasher.datasketch(sigs[1])
    assert a.jaccard(b) == pytest.approx(float(estimated_jaccard(sigs[0], sigs[1])))


def test_shingling_rules() -> None:
    word = MinHasher(ngram=2)
    assert word.shingles("A b, C!") == [b"a b", b"b c"]
    assert word.shingles("solo") == [b"solo"]
    char = MinHasher(ngram=3, shingle="char")
    assert char.shingles("重复 数据\n删") == [s.encode() for s in ("重复数", "复数据", "数据删")]


@pytest.mark.parametrize(("threshold", "num_perm"), [(0.8, 128), (0.5, 64), (0.9, 256), (0.7, 32)])
def test_optimal_params_equal_minhashlsh(threshold: float, num_perm: int) -> None:
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    assert optimal_params(threshold, num_perm, 0.5, 0.5) == (lsh.b, lsh.r)


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.3, 0.7), (0.8, 0.2)])
def test_optimal_params_agree_with_datasketch_across_thresholds(weights: tuple[float, float]) -> None:
    """Computed without datasketch (exact Gauss-Legendre areas): the same (b, r) as ``MinHashLSH`` picks."""
    for num_perm in (16, 64, 100):
        for threshold in (0.3, 0.45, 0.6, 0.75, 0.85, 0.95):
            try:
                lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=weights)
            except ValueError:  # datasketch's optimum has one band, which it refuses: so do we
                with pytest.raises(ValueError, match="fewer than 2 bands"):
                    optimal_params(threshold, num_perm, *weights)
            else:
                assert optimal_params(threshold, num_perm, *weights) == (lsh.b, lsh.r)


def test_optimal_params_import_neither_datasketch_nor_scipy() -> None:
    """The near-dedup plan runs on the critical path of every build: importing datasketch (and scipy through
    it) there cost ~0.7 CPU-s per process."""
    code = (
        "import sys; from pipeline.dedup.lsh import optimal_params; optimal_params(0.8, 128, 0.5, 0.5); "
        "print(sorted(m for m in ('datasketch', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_band_keys_equal_iff_band_values_equal() -> None:
    rng = np.random.default_rng(1)
    sigs = rng.integers(0, 2**32, size=(50, 24), dtype=np.uint64).astype(np.uint32)
    sigs[1, :8] = sigs[0, :8]  # doc 1 shares band 0 with doc 0
    sigs[2, 8:16] = sigs[0, :8]  # same values in a different band must not collide
    keys = band_keys(sigs, 3, 8)
    assert keys[0, 0] == keys[1, 0]
    assert keys[0, 1] != keys[1, 1]
    assert keys[2, 1] != keys[0, 0]
    assert len(np.unique(keys)) == keys.size - 1


def brute_pairs(keys: np.ndarray, refs: np.ndarray) -> set[tuple[int, int]]:
    out = set()
    for i, j in itertools.combinations(range(len(keys)), 2):
        if keys[i] == keys[j] and refs[i] != refs[j]:
            a, b = sorted((int(refs[i]), int(refs[j])))
            if not (a & int(INDEX_FLAG) and b & int(INDEX_FLAG)):
                out.add((a, b))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_candidate_pairs_equal_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 12, size=60).astype(np.uint64)
    refs = make_refs(0, rng.permutation(60)[:60])
    refs[:5] |= INDEX_FLAG  # index-index pairs are never candidates
    u, v, big = candidate_pairs(keys, refs, window=64)
    assert set(zip(u.tolist(), v.tolist(), strict=True)) == brute_pairs(keys, refs)
    assert big == 0
    # A window smaller than a bucket still connects it, and the oversized buckets are counted.
    u2, v2, big2 = candidate_pairs(keys, refs, window=2)
    assert big2 == sum(1 for k in np.unique(keys) if (keys == k).sum() > 3)
    assert set(zip(u2.tolist(), v2.tolist(), strict=True)) <= brute_pairs(keys, refs)


def test_refs_round_trip() -> None:
    refs = np.concatenate((make_refs(3, np.array([0, 7])), make_refs(5, np.array([2**32 - 1]), index=True)))
    is_index, part, row = split_refs(refs)
    assert is_index.tolist() == [False, False, True]
    assert part.tolist() == [3, 3, 5] and row.tolist() == [0, 7, 2**32 - 1]


@pytest.mark.parametrize("docs", [0, 1, 1000, 10**6, 10**8])
@pytest.mark.parametrize("budget", [16, 256, 4096])
def test_plan_partitions_fits_budget(docs: int, budget: int) -> None:
    if docs * 9 * 64 * 1.25 / (budget << 20) > 4096:
        with pytest.raises(ValueError, match="memory_budget_mb"):
            plan_partitions(docs, 9, budget)
        return
    plan = plan_partitions(docs, 9, budget)
    p = plan.num_partitions
    assert p & (p - 1) == 0
    assert plan.partition_bytes * 1.25 <= (budget << 20) or p == 1
    if p > 1:  # the smallest such power of two
        assert docs * 9 * 64 * 1.25 > (budget << 20) * (p // 2)
    keys = np.random.default_rng(0).integers(0, 2**63, size=1000, dtype=np.uint64) * np.uint64(2)
    parts = partition_of(keys, p)
    assert parts.min() >= 0 and parts.max() < p


def brute_components(n: int, edges: list[tuple[int, int]]) -> set[frozenset[int]]:
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in edges:
        parent[find(a)] = find(b)
    groups: dict[int, set[int]] = {}
    for a, b in edges:
        for x in (a, b):
            groups.setdefault(find(x), set()).add(x)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("seed", range(8))
def test_connected_labels_equal_union_find(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = 200, int(rng.integers(1, 300))
    edges = [tuple(int(x) for x in rng.integers(0, n, size=2)) for _ in range(m)]
    edges.append((0, n - 1))
    u = np.array([a for a, _ in edges], dtype=np.uint64)
    v = np.array([b for _, b in edges], dtype=np.uint64)
    nodes, labels = connected_labels(u, v)
    got: dict[int, set[int]] = {}
    for node, label in zip(nodes.tolist(), labels.tolist(), strict=True):
        got.setdefault(label, set()).add(node)
    assert {frozenset(g) for g in got.values()} == brute_components(n, edges)
    # A long path (worst case for label propagation) still converges.
    path = np.arange(1000, dtype=np.uint64)
    _, labels = connected_labels(path[:-1], path[1:])
    assert set(labels.tolist()) == {0}


def test_keep_rule_longest_then_smallest_id_and_index_wins() -> None:
    nodes = np.concatenate((make_refs(0, np.arange(6)), make_refs(0, np.array([0]), index=True)))
    labels = np.array([0, 0, 0, 3, 3, 5, 5])  # clusters {0,1,2}, {3,4}, {5, index doc}
    nbytes = np.array([10, 30, 30, 5, 5, 100, 1])
    ids = np.array(["c", "b", "a", "z", "y", "x", "i"])
    cl = choose_keepers(nodes, labels, nbytes, ids)
    assert cl.keep.tolist() == [False, False, True, False, True, False, True]
    assert sorted(cl.dropped_refs.tolist()) == [0, 1, 3, 5]
    assert cl.sizes.tolist() == [3, 2, 2]
    assert cl.cluster.tolist()[:3] == [0, 0, 0]


@pytest.mark.parametrize("seed", range(8))
def test_forests_of_any_split_of_the_edges_give_the_same_labels_and_keepers(seed: int) -> None:
    """Clustering in two rounds (a spanning forest per bucket partition, then the components of their union) gives
    the nodes, labels and keepers of the components of all the edges at once, however the edges are split."""
    rng = np.random.default_rng(seed)
    n, m = 300, int(rng.integers(1, 400))
    u = rng.integers(0, n, size=m).astype(np.uint64) * np.uint64(7) + np.uint64(3)
    v = rng.integers(0, n, size=m).astype(np.uint64) * np.uint64(7) + np.uint64(3)
    nodes, labels = connected_labels(u, v)
    for splits in (1, 2, 5):
        which = rng.integers(0, splits, size=m)
        forests = [spanning_forest(u[which == k], v[which == k]) for k in range(splits)]
        assert all(len(f[0]) <= int((which == k).sum()) for k, f in enumerate(forests))
        fu, fv = np.concatenate([f[0] for f in forests]), np.concatenate([f[1] for f in forests])
        got_nodes, got_labels = connected_labels(fu, fv)
        assert np.array_equal(got_nodes, nodes) and np.array_equal(got_labels, labels)
        nbytes, ids = rng.integers(1, 50, size=len(nodes)), np.array([f"d{k:04d}" for k in range(len(nodes))])
        a, b = choose_keepers(nodes, labels, nbytes, ids), choose_keepers(got_nodes, got_labels, nbytes, ids)
        assert np.array_equal(a.cluster, b.cluster) and np.array_equal(a.keep, b.keep)
