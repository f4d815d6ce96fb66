"""Training data: a view of a split's concatenated token stream as fixed-length samples, and its DataLoader.

Sample ``i`` of a :class:`ShardDataset` is tokens ``[i*L, i*L + L + 1)`` of the split's stream (shards in index
order, each at its manifest ``token_offset``), crossing shard boundaries where needed: ``input_ids`` is the
first ``L`` tokens and ``labels`` the last ``L`` (next-token targets). Shards come from a :class:`ShardCache`
and are read by ``np.memmap``, opened lazily in each process (DataLoader workers fork with the dataset).

The sampler's order is known ahead, so :class:`ShardPrefetchSampler` (used by :func:`build_dataloader`) asks the
cache to download the shards of the next samples in the background, in the main process, while the workers read.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from pipeline.dataset.manifest import Manifest
from pipeline.dataset.shards import ShardInfo
from pipeline.storage import ObjectStore
from training.cache import ShardCache
from training.preempt import loader_worker_init
from training.sampler import samples_per_rank

log = logging.getLogger(__name__)

_REPREFETCH_AFTER_S = 30.0  # ask again for a shard requested this long ago (it may have been evicted since)
# Bumped in every forked child, so a dataset notices it is in a new DataLoader worker without an os.getpid()
# per sample (a syscall, and syscalls are slow in sandboxed containers).
_fork_generation = [0]
os.register_at_fork(after_in_child=lambda: _fork_generation.__setitem__(0, _fork_generation[0] + 1))


class ShardDataset(Dataset):
    """Fixed-length samples over the ``split`` shards of a published dataset (see the module docstring)."""

    def __init__(
        self,
        manifest: Manifest,
        store: ObjectStore,
        seq_len: int,
        split: str = "train",
        cache: ShardCache | None = None,
        *,
        max_open_shards: int = 64,
        check_token_ids: bool = True,
    ):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if cache is None:
            raise ValueError("cache is required: ShardCache(store, root=<node-local dir>, max_bytes=...)")
        if cache.store.uri != store.uri:
            raise ValueError(f"cache reads {cache.store.uri} but the dataset is {store.uri}")
        if max_open_shards < 1:
            raise ValueError(f"max_open_shards must be >= 1, got {max_open_shards}")
        self.manifest, self.store, self.cache = manifest, store, cache
        self.seq_len, self.split = seq_len, split
        self.max_open_shards, self.check_token_ids = max_open_shards, check_token_ids
        self.dtype = np.dtype(manifest.dtype).newbyteorder("<")
        self.vocab_size = manifest.tokenizer.vocab_size
        self.shards = _split_shards(manifest, split, self.dtype)
        self.offsets = np.array([s.token_offset for s in self.shards] + [self.total_tokens], dtype=np.int64)
        self._offsets_list = self.offsets.tolist()
        self._len = (self.total_tokens - 1) // seq_len
        if self._len < 1:
            raise ValueError(
                f"split {split!r} has {self.total_tokens} tokens: fewer than seq_len+1={seq_len + 1}, "
                "so not one sample; lower seq_len or build a larger dataset"
            )
        self._reset_process_state()

    @property
    def total_tokens(self) -> int:
        last = self.shards[-1]
        return last.token_offset + last.tokens

    def __len__(self) -> int:
        return self._len

    # ------------------------------------------------------------ pure sample -> shard arithmetic

    def sample_to_shards(self, i: int) -> list[tuple[int, int, int]]:
        """``[(shard_index, start, end)]``: the token ranges within shards that make up sample ``i`` (L+1 tokens)."""
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} out of range for {self._len} samples")
        offsets = self._offsets_list
        lo, hi = i * self.seq_len, i * self.seq_len + self.seq_len + 1
        k = bisect.bisect_right(offsets, lo) - 1
        pieces = []
        while lo < hi:
            end = min(hi, offsets[k + 1])
            pieces.append((k, lo - offsets[k], end - offsets[k]))
            lo, k = end, k + 1
        return pieces

    def shards_of_samples(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """Sorted unique shard indexes touched by the given samples (vectorized, for prefetching)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        first = np.searchsorted(self.offsets, idx * self.seq_len, side="right") - 1
        last = np.searchsorted(self.offsets, idx * self.seq_len + self.seq_len, side="right") - 1
        return np.unique(np.concatenate([first, last]))

    def documents_of_sample(self, i: int) -> list[dict]:
        """Lineage: the document pieces sample ``i`` holds, in order, from each shard's ``docs.parquet``.

        Each entry is a docs row (doc_id, source, location, piece, ...) plus ``shard`` and the overlapping
        token range ``[start, end)`` within the shard. The parquet files are fetched through the cache.
        """
        found = []
        for k, start, end in self.sample_to_shards(i):
            table = self._docs_table(k)
            starts, lengths = table["token_start"], table["tokens"]
            first = max(0, bisect.bisect_right(starts, start) - 1)
            for row in range(first, len(starts)):
                if starts[row] >= end:
                    break
                if starts[row] + lengths[row] > start:
                    entry = {name: column[row] for name, column in table.items()}
                    entry.update(
                        shard=k, start=max(start, starts[row]), end=min(end, starts[row] + lengths[row])
                    )
                    found.append(entry)
        return found

    def _docs_table(self, k: int) -> dict[str, list]:
        import pyarrow.parquet as pq  # only lineage needs pyarrow here

        shard = self.shards[k]
        size = shard.docs_bytes or self.store.stat(shard.docs_key).size
        path = self.cache.path(shard.docs_key, shard.docs_sha256, size)
        try:
            return pq.read_table(path).to_pydict()
        finally:
            self.cache.release(shard.docs_key)

    # ------------------------------------------------------------ reading

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        self._read(int(i), out)
        self._check_ids(out, f"sample {i}")
        tokens = torch.from_numpy(out)
        return {"input_ids": tokens[:-1], "labels": tokens[1:], "index": torch.tensor(int(i))}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """A whole micro batch (the DataLoader's fetcher calls this) read into one buffer.

        Returns the per-sample dicts any collate function understands, carrying the batch already stacked
        for :func:`collate_batch` to pass through without a copy.
        """
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(indices):
            self._read(int(i), out[row])
        self._check_ids(out, f"samples {list(indices)[:8]}")
        tokens = torch.from_numpy(out)
        stacked = {
            "input_ids": tokens[:, :-1].contiguous(),
            "labels": tokens[:, 1:].contiguous(),
            "index": torch.as_tensor(np.asarray(indices, dtype=np.int64)),  # the sample ids, for audits
        }
        return _StackedBatch(stacked, len(indices))

    def _read(self, i: int, out: np.ndarray) -> None:
        filled = 0
        for shard_index, start, end in self.sample_to_shards(i):
            out[filled : filled + end - start] = self._tokens(shard_index)[start:end]
            filled += end - start

    def _check_ids(self, tokens: np.ndarray, what: str) -> None:
        if self.check_token_ids and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(
                f"{what} of {self.split!r} has token ids outside [0, {self.vocab_size}): the shards do not "
                "match the manifest's tokenizer/dtype"
            )

    def _tokens(self, shard_index: int) -> np.ndarray:
        if self._generation != _fork_generation[0]:
            self._reset_process_state()  # a forked worker: open its own maps and pins
        tokens = self._open.get(shard_index)
        if tokens is not None:
            self._open.move_to_end(shard_index)
            return tokens
        shard = self.shards[shard_index]
        path = self.cache.path(shard.key, shard.sha256, shard.bytes)
        # A plain ndarray view of the map: slicing np.memmap costs a Python-level __array_finalize__ per call.
        tokens = np.memmap(path, dtype=self.dtype, mode="r", shape=(shard.tokens,)).view(np.ndarray)
        self._open[shard_index] = tokens
        while len(self._open) > self.max_open_shards:
            old, _ = self._open.popitem(last=False)
            self.cache.release(self.shards[old].key)
        return tokens

    def _reset_process_state(self) -> None:
        self._generation = _fork_generation[0]
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()
        self._requested: dict[int, float] = {}

    def close(self) -> None:
        """Drop this process's memmaps and unpin their shards."""
        for shard_index in list(self._open):
            del self._open[shard_index]
            self.cache.release(self.shards[shard_index].key)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_open", None)
        state.pop("_requested", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    # ------------------------------------------------------------ prefetch

    def prefetch(self, indices: np.ndarray | Sequence[int]) -> int:
        """Ask the cache to fetch, in the background, the shards of these samples; returns how many it asked."""
        now = time.monotonic()
        items = []
        for k in self.shards_of_samples(indices).tolist():
            if now - self._requested.get(k, -np.inf) < _REPREFETCH_AFTER_S:
                continue
            self._requested[k] = now
            shard = self.shards[k]
            items.append((shard.key, shard.sha256, shard.bytes))
        if items:
            self.cache.prefetch(items)
        return len(items)


def _split_shards(manifest: Manifest, split: str, dtype: np.dtype) -> list[ShardInfo]:
    shards = manifest.split_shards(split)
    if not shards:
        splits = sorted({s.split for s in manifest.shards})
        raise ValueError(f"dataset {manifest.dataset_id} has no {split!r} shards (splits: {splits})")
    offset = 0
    for position, shard in enumerate(shards):
        if shard.index != position or shard.token_offset != offset:
            raise ValueError(
                f"{split}/shard {shard.index}: index/token_offset do not continue the stream at "
                f"{position}/{offset}; the manifest is inconsistent"
            )
        if shard.bytes != shard.tokens * dtype.itemsize:
            raise ValueError(
                f"{split}/shard {shard.index}: {shard.bytes} bytes != {shard.tokens} tokens of {dtype.name}"
            )
        offset += shard.tokens
    return shards


class ShardPrefetchSampler(Sampler[int]):
    """Yields the wrapped sampler's indices unchanged, asking for the shards of the next ``lookahead`` first.

    It runs where the DataLoader iterates its sampler (the main process), ``lookahead`` to ``2*lookahead``
    samples ahead of what it has handed out, on top of the DataLoader's own read-ahead.
    """

    def __init__(self, sampler: Sampler[int], dataset: ShardDataset, lookahead: int):
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self.sampler, self.dataset, self.lookahead = sampler, dataset, lookahead

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def _chunks(self) -> Iterator[np.ndarray]:
        blocks = getattr(self.sampler, "iter_blocks", None)
        source = blocks() if blocks is not None else _batched(iter(self.sampler), self.lookahead)
        for block in source:
            for lo in range(0, len(block), self.lookahead):
                yield block[lo : lo + self.lookahead]

    def __iter__(self) -> Iterator[int]:
        pending: np.ndarray | None = None
        for chunk in self._chunks():
            self.dataset.prefetch(chunk)
            if pending is not None:
                yield from pending.tolist()
            pending = chunk
        if pending is not None:
            yield from pending.tolist()


def _batched(indices: Iterator[int], size: int) -> Iterator[np.ndarray]:
    batch: list[int] = []
    for i in indices:
        batch.append(i)
        if len(batch) == size:
            yield np.array(batch, dtype=np.int64)
            batch = []
    if batch:
        yield np.array(batch, dtype=np.int64)


class _StackedBatch(list):
    """The samples of a batch as a list of dicts (rows of ``stacked``), plus the stacked batch itself."""

    def __init__(self, stacked: dict[str, torch.Tensor], rows: int):
        super().__init__({name: t[r] for name, t in stacked.items()} for r in range(rows))
        self.stacked = stacked


def collate_batch(data: list) -> dict[str, torch.Tensor]:
    """Pass through the batch :meth:`ShardDataset.__getitems__` already stacked; otherwise torch's default."""
    return data.stacked if isinstance(data, _StackedBatch) else default_collate(data)


def build_dataloader(
    dataset: ShardDataset,
    sampler: Sampler[int],
    micro_batch: int,
    num_workers: int = 2,
    pin_memory: bool | None = None,
    prefetch_factor: int = 4,
    lookahead_samples: int | None = None,
    persistent_workers: bool | None = None,
    multiprocessing_context: str | None = None,
) -> DataLoader:
    """A DataLoader of ``{"input_ids", "labels"}`` batches ``[micro_batch, L]`` (plus ``index``, the sample
    ids ``[micro_batch]``) that never yields a short batch.

    ``pin_memory`` defaults to CUDA being available. ``lookahead_samples`` (default: four DataLoader read-aheads)
    is how far ahead shards are prefetched; 0 disables shard prefetching.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if lookahead_samples is None:
        lookahead_samples = 4 * micro_batch * max(1, num_workers) * prefetch_factor
    if lookahead_samples < 0:
        raise ValueError(f"lookahead_samples must be >= 0, got {lookahead_samples}")
    wrapped = ShardPrefetchSampler(sampler, dataset, lookahead_samples) if lookahead_samples else sampler
    workers = num_workers > 0
    return DataLoader(
        dataset,
        batch_size=micro_batch,
        sampler=wrapped,
        collate_fn=collate_batch,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=workers if persistent_workers is None else persistent_workers,
        multiprocessing_context=multiprocessing_context if workers else None,
        worker_init_fn=loader_worker_init if workers else None,  # a SIGTERM to the group spares them
    )


def check_ranks_agree(reports: Sequence[Any], *, what: str) -> None:
    """ValueError naming the ranks unless every rank reported the same value (e.g. its dataset id)."""
    if len({repr(r) for r in reports}) > 1:
        by_value: dict[str, list[int]] = {}
        for rank, value in enumerate(reports):
            by_value.setdefault(repr(value), []).append(rank)
        listing = "; ".join(f"ranks {ranks}: {value}" for value, ranks in by_value.items())
        raise ValueError(
            f"ranks disagree on the {what}: {listing}; every rank must read the same manifest (check the "
            "manifest URI, latest.json and the shard cache of each node)"
        )


def preflight_steps(
    n_samples: int,
    world: int,
    micro_batch: int,
    grad_accum: int,
    start: int = 0,
    *,
    rank_samples: Sequence[int] | None = None,
) -> int:
    """Optimizer steps per rank left in this epoch; ValueError unless every rank gets the same, at least one.

    Each rank's share of positions ``[start, usable_end)`` is counted separately (rank ``r`` takes every
    ``world``-th from ``start + r``). ``rank_samples``, when given, are the sampler lengths the ranks actually
    report (e.g. all-gathered ``len(sampler)``); they must agree with the computed share.
    """
    for name, value in (("world", world), ("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    per_rank = samples_per_rank(n_samples, world, start, drop_last=True)
    usable_end = start + per_rank * world
    counts = [len(range(start + r, usable_end, world)) for r in range(world)]
    if rank_samples is not None:
        if len(rank_samples) != world:
            raise ValueError(f"rank_samples has {len(rank_samples)} entries for world size {world}")
        reported = [int(x) for x in rank_samples]
        if reported != counts:
            raise ValueError(
                f"ranks report {reported} samples left this epoch but the layout gives {counts}: "
                "the ranks disagree on dataset, world size or start offset"
            )
    steps = [c // (micro_batch * grad_accum) for c in counts]
    if len(set(steps)) != 1:
        raise ValueError(
            f"ranks would run different numbers of steps per epoch ({steps}): the job would hang "
            f"at the first collective after the shortest rank stops; check every rank uses the "
            f"same dataset, world size and start offset"
        )
    if steps[0] < 1:
        raise ValueError(
            f"{n_samples - start} remaining samples give no optimizer step of world*micro_batch*"
            f"grad_accum = {world * micro_batch * grad_accum} samples; use a larger dataset or a "
            "smaller batch"
        )
    return steps[0]
