"""ShardDataset over a real (tiny) published dataset: exact slices across shard boundaries, loaders, S3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import FileStore, open_store
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.cache import ShardCache
from training.data import ShardDataset, ShardPrefetchSampler, build_dataloader, collate_batch
from training.sampler import ResumableDistributedSampler

from .test_cache import CountingStore


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """(manifest, store, manifest_uri) of a tiny dataset with 4 train shards and 1 valid shard."""
    uri = build_tiny_dataset(tmp_path_factory.mktemp("tiny"), n_docs=200, vocab_size=512, seed=3)
    manifest, store = load_manifest(uri, None)
    return manifest, store, uri


def stream_of(manifest, store, split: str) -> np.ndarray:
    """The split's concatenated tokens, read independently of ShardDataset (whole objects, no cache)."""
    parts = [
        np.frombuffer(store.get_bytes(s.key), dtype="<" + np.dtype(manifest.dtype).str[1:])
        for s in manifest.split_shards(split)
    ]
    return np.concatenate(parts).astype(np.int64)


def make_dataset(tiny, tmp_path: Path, seq_len: int, split: str = "train", store=None) -> ShardDataset:
    manifest, default_store, _ = tiny
    store = store or default_store
    return ShardDataset(manifest, store, seq_len, split, ShardCache(store, tmp_path / "cache", 1 << 30))


@pytest.mark.parametrize("seq_len", [1, 7, 64, 2000, 3000])
@pytest.mark.parametrize("split", ["train", "valid"])
def test_samples_are_the_slices_of_the_concatenated_stream(
    tiny, tmp_path: Path, seq_len: int, split: str
) -> None:
    manifest, store, _ = tiny
    stream = stream_of(manifest, store, split)
    if len(stream) < seq_len + 1:
        with pytest.raises(ValueError, match="not one sample"):
            make_dataset(tiny, tmp_path, seq_len, split)
        return
    ds = make_dataset(tiny, tmp_path, seq_len, split)
    assert len(ds) == (len(stream) - 1) // seq_len
    crossing = 0
    for i in range(len(ds)):
        item = ds[i]
        window = stream[i * seq_len : i * seq_len + seq_len + 1]
        assert item["input_ids"].dtype == torch.long and item["input_ids"].shape == (seq_len,)
        assert torch.equal(item["input_ids"], torch.from_numpy(window[:-1]))
        assert torch.equal(item["labels"], torch.from_numpy(window[1:]))
        pieces = ds.sample_to_shards(i)
        crossing += len(pieces) > 1
        assert sum(end - start for _, start, end in pieces) == seq_len + 1
    if split == "train" and seq_len >= 64:
        assert crossing >= 3  # every one of the 3 inner boundaries is crossed by some sample


def test_sample_to_shards_is_exact_at_the_boundaries(tiny, tmp_path: Path) -> None:
    manifest, _, _ = tiny
    shards = manifest.split_shards("train")
    ds = make_dataset(tiny, tmp_path, 10)
    boundary = shards[1].token_offset
    i = (
        boundary - 1
    ) // 10  # its 11 tokens [10i, 10i + 11) hold the last of shard 0 and the first of shard 1
    assert ds.sample_to_shards(i) == [(0, i * 10, boundary), (1, 0, i * 10 + 11 - boundary)]
    big = make_dataset(tiny, tmp_path, shards[0].tokens + shards[1].tokens)  # one sample spans three shards
    assert [p[0] for p in big.sample_to_shards(0)] == [0, 1, 2]
    assert set(ds.shards_of_samples([i, 0])) == {0, 1} | {p[0] for p in ds.sample_to_shards(i)}
    with pytest.raises(IndexError):
        ds.sample_to_shards(len(ds))


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_with_two_workers_reads_each_shard_once(tiny, tmp_path: Path, context: str) -> None:
    manifest, store, _ = tiny
    counting = CountingStore(store.root, tmp_path / "count.txt")
    ds = make_dataset(tiny, tmp_path, 32, store=counting)
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=1, seed=4)
    sampler.set_epoch(1)
    loader = build_dataloader(
        ds, sampler, micro_batch=8, num_workers=2, prefetch_factor=2, multiprocessing_context=context
    )
    batches = list(loader)
    assert len(batches) == len(loader) == len(sampler) // 8
    order = list(sampler)
    stream = stream_of(manifest, store, "train")
    for b, batch in enumerate(batches):
        assert batch["input_ids"].shape == (8, 32) and batch["labels"].shape == (8, 32)
        for j, i in enumerate(order[b * 8 : (b + 1) * 8]):
            assert torch.equal(batch["input_ids"][j], torch.from_numpy(stream[i * 32 : i * 32 + 32]))
    downloaded = sorted(line.split()[1] for line in counting.downloads())
    assert downloaded == sorted(s.key for s in manifest.split_shards("train"))  # once each, over 3 processes


def test_prefetch_sampler_passes_the_order_through_and_fetches_ahead(tiny, tmp_path: Path) -> None:
    _, store, _ = tiny
    counting = CountingStore(store.root, tmp_path / "count.txt")
    ds = make_dataset(tiny, tmp_path, 16, store=counting)
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    wrapped = ShardPrefetchSampler(sampler, ds, lookahead=50)
    it = iter(wrapped)
    first = next(it)
    for f in list(ds.cache._pending.values()):
        f.result(timeout=30)
    # before any sample was read, the shards of the first 50..100 samples are already on disk
    ahead = ds.shards_of_samples(list(sampler)[:100])
    assert {ds.shards[k].key for k in ahead} <= {line.split()[1] for line in counting.downloads()}
    assert [first, *it] == list(sampler) and len(wrapped) == len(sampler)


def test_refuses_mismatched_inputs(tiny, tmp_path: Path) -> None:
    manifest, store, _ = tiny
    with pytest.raises(ValueError, match="no 'test' shards"):
        make_dataset(tiny, tmp_path, 8, split="test")
    with pytest.raises(ValueError, match="cache reads"):
        other = FileStore(tmp_path / "elsewhere")
        ShardDataset(manifest, store, 8, "train", ShardCache(other, tmp_path / "c", 1 << 20))
    with pytest.raises(ValueError, match="cache is required"):
        ShardDataset(manifest, store, 8)
    ds = make_dataset(tiny, tmp_path, 8)
    ds.vocab_size = 3  # as if the shards held ids from another tokenizer
    with pytest.raises(ValueError, match="token ids outside"):
        ds[0]


@pytest.mark.s3
def test_streams_from_s3(tiny, tmp_path: Path, s3_bucket) -> None:
    manifest, local, _ = tiny
    remote_root = open_store(s3_bucket.uri, s3=s3_bucket.options)
    for info in local.list():
        remote_root.put_file(f"ds/{info.key}", local.root / info.key)
    remote_manifest, remote = load_manifest(f"{s3_bucket.uri}/ds/manifest.json", s3=s3_bucket.options)
    assert remote_manifest.dataset_id == manifest.dataset_id and remote.uri.startswith("s3://")
    ds = make_dataset((remote_manifest, remote, None), tmp_path, 100, store=remote)
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=0, seed=0)
    loader = build_dataloader(ds, sampler, micro_batch=4, num_workers=2)
    stream = stream_of(manifest, local, "train")
    order = list(sampler)
    seen = 0
    for b, batch in enumerate(loader):
        for j, i in enumerate(order[b * 4 : (b + 1) * 4]):
            assert torch.equal(batch["labels"][j], torch.from_numpy(stream[i * 100 + 1 : i * 100 + 101]))
            seen += 1
    assert seen == len(sampler) // 4 * 4 > 0
    assert ds.cache.cached_path(manifest.split_shards("train")[0].key).exists()


def test_batched_reads_match_single_reads_and_a_plain_dataloader(tiny, tmp_path: Path) -> None:
    ds = make_dataset(tiny, tmp_path, 50)
    indices = [5, 0, len(ds) - 1, 77]
    rows = ds.__getitems__(indices)
    assert all(torch.equal(row["labels"], ds[i]["labels"]) for row, i in zip(rows, indices, strict=True))
    batch = collate_batch(rows)
    assert torch.equal(batch["input_ids"], torch.stack([ds[i]["input_ids"] for i in indices]))
    assert torch.equal(batch["labels"], torch.stack([ds[i]["labels"] for i in indices]))
    assert batch["input_ids"].is_contiguous() and batch["labels"].is_contiguous()
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=2)
    plain = list(torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, drop_last=True))
    ours = list(build_dataloader(ds, sampler, micro_batch=4, num_workers=0))
    assert len(plain) == len(ours) > 0
    for a, b in zip(plain, ours, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])


def test_documents_of_sample_trace_every_token_to_a_document(tiny, tmp_path: Path) -> None:
    manifest, _, _ = tiny
    eos = manifest.tokenizer.eos_id
    ds = make_dataset(tiny, tmp_path, 700)  # samples span several documents and a shard boundary
    for i in range(len(ds)):
        docs = ds.documents_of_sample(i)
        assert sum(d["end"] - d["start"] for d in docs) == 701
        assert (docs[0]["shard"], docs[0]["start"]) == ds.sample_to_shards(i)[0][:2]
        tokens = [*ds[i]["input_ids"].tolist(), ds[i]["labels"][-1].item()]
        pos = 0
        for d in docs:
            pos += d["end"] - d["start"]
            last_piece_ends_here = d["end"] == d["token_start"] + d["tokens"]
            shard_ends_here = d["end"] == manifest.split_shards("train")[d["shard"]].tokens
            if last_piece_ends_here and not shard_ends_here:
                assert tokens[pos - 1] == eos, (i, d)  # every document ends with EOS
        ids = [d["doc_id"] for d in docs]
        assert len(set(ids)) >= len(ids) - 1  # only a document split at the shard boundary repeats
