"""The duplicate graph: connected components of candidate edges (a vectorized union-find) and the rule that
picks the document each cluster keeps.

Pure numpy over doc refs (see ``lsh.make_refs``), so they can be tested over grids of graphs and are cheap enough
for the global step: the work is O(edges * log) and the edges are only the duplicate pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.dedup.lsh import INDEX_FLAG


def connected_labels(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (sorted unique refs of the edges) and each node's component label (the smallest node position).

    Union-find done as min-label propagation with pointer jumping: every round hooks each edge's larger root
    under the smaller one, then compresses paths by jumping; it stops when no label changes (a few rounds for
    the shallow, star-like graphs LSH produces; O(log diameter) rounds in general).
    """
    nodes, inv = np.unique(np.concatenate((u, v)), return_inverse=True)
    a, b = inv[: len(u)], inv[len(u) :]
    labels = np.arange(len(nodes), dtype=np.int64)
    while True:
        la, lb = labels[a], labels[b]
        lo, hi = np.minimum(la, lb), np.maximum(la, lb)
        changed = lo != hi
        if not changed.any():
            break
        np.minimum.at(labels, hi[changed], lo[changed])
        while True:  # pointer jumping until every node points at a root
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
    return nodes, labels


def spanning_forest(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node of the edges ``u``-``v`` paired with the smallest node of its component (roots left out): a forest
    with the components of the edges, in at most one edge per node. Connected components are then computed in
    two rounds: a forest per bucket partition on the workers, then :func:`connected_labels` over the union of the
    forests, whose size grows with the duplicated documents, not with the corpus or the candidate pairs. The
    union has the nodes and the components of the union of the edges, so the same labels."""
    nodes, labels = connected_labels(u, v)
    # every node but the roots, and a root alone in its component (a self-pair) as itself, so no node is lost
    keep = (labels != np.arange(len(nodes))) | (np.bincount(labels, minlength=len(nodes)) == 1)
    return nodes[keep], nodes[labels[keep]]


@dataclass(frozen=True)
class Clusters:
    """Every clustered document: its ref, cluster number (0 = largest), and whether it is kept."""

    refs: np.ndarray  # uint64
    cluster: np.ndarray  # int64, clusters numbered by size (desc) then smallest member
    keep: np.ndarray  # bool; a document of a persisted index is always "kept" (it is not ours to drop)
    sizes: np.ndarray  # int64 size of each cluster, by cluster number

    @property
    def dropped_refs(self) -> np.ndarray:
        return self.refs[~self.keep & ((self.refs & INDEX_FLAG) == 0)]


def choose_keepers(nodes: np.ndarray, labels: np.ndarray, nbytes: np.ndarray, ids: np.ndarray) -> Clusters:
    """Keep one document per cluster: the longest (bytes), ties broken by the smallest id.

    A cluster holding a document of a persisted index keeps only that (those) index documents: everything new
    in it duplicates something already published.
    """
    is_index = (nodes & INDEX_FLAG) != 0
    # Sort members of each cluster: index docs first, then longest, then smallest id.
    order = np.lexsort((ids, -nbytes.astype(np.int64), ~is_index, labels))
    lab = labels[order]
    first = np.ones(len(lab), dtype=bool)
    first[1:] = lab[1:] != lab[:-1]
    keep_sorted = first.copy()
    leader_index = np.maximum.accumulate(np.where(first, np.arange(len(lab)), 0))
    keep_sorted |= is_index[order]  # every index doc stays (it was already published)
    keep_sorted &= ~(is_index[order][leader_index] & ~is_index[order])  # new docs next to an index doc go
    keep = np.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return _number_clusters(nodes, labels, keep)


def _number_clusters(nodes: np.ndarray, labels: np.ndarray, keep: np.ndarray) -> Clusters:
    uniq, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    # Number clusters by size descending, then by smallest member ref (labels are the smallest node position).
    rank_order = np.lexsort((uniq, -counts))
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[rank_order] = np.arange(len(uniq))
    return Clusters(refs=nodes, cluster=rank[inv], keep=keep, sizes=counts[rank_order].astype(np.int64))


def size_histogram(sizes: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(sizes, return_counts=True)
    return {str(int(s)): int(c) for s, c in zip(values, counts, strict=True)}
