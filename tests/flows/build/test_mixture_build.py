"""Done-when of corpus composition: a three-source build (a Pile-style ``.jsonl.zst`` named by its
``pile_set_name``, two folders) with shares 0.5/0.3/0.2, language filter and decontamination on, published
with provenance in every shard's ``docs.parquet``, then blended by the trainer's sampler."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import open_store
from tests.flows.tiny_corpus import TINY_OVERRIDES, _doc
from tests.pipeline.ingest.test_encoding import FRENCH
from training.blend import BlendedDistributedSampler, blend_sources
from training.data import ShardDataset

pytestmark = pytest.mark.slow
SEQ_LEN = 32


def _write_sources(root: Path) -> dict[str, object]:
    rng = random.Random(11)
    pile = b"".join(
        json.dumps(
            {"text": _doc(rng, 90), "meta": {"pile_set_name": "Pile-CC", "offset": "theirs", "i": i}}
        ).encode()
        + b"\n"
        for i in range(24)
    )
    (root / "pile").mkdir(parents=True)
    (root / "pile" / "00.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(pile))
    for name, n in (("web", 14), ("books", 8)):
        (root / name).mkdir()
        docs = [{"text": _doc(rng, 100), "meta": {"location": f"{name}-{i}"}} for i in range(n)]
        if name == "books":
            docs.append({"text": FRENCH * 2})  # not English: the books source allows English only
            docs.append(
                {"text": docs[0]["text"] + "\n" + _doc(rng, 40)}
            )  # holds an eval text: decontaminated
        (root / name / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "evals").mkdir()
    eval_text = " ".join(docs[0]["text"].split()[10:40])  # 30 words of the first book
    (root / "evals" / "quiz.jsonl").write_text(json.dumps({"text": eval_text}) + "\n")
    return {
        "sources": [
            {"inputs": [str(root / "pile")], "share": 0.5},  # no name: named by meta.pile_set_name
            {"name": "web", "inputs": [str(root / "web")], "share": 0.3},
            {"name": "books", "inputs": [str(root / "books")], "share": 0.2, "langid": {"allow": ["en"]}},
        ],
        "decontam.eval_sets": [{"name": "quiz", "inputs": [str(root / "evals")]}],
    }


def test_three_sources_reach_the_shards_and_blend_by_weight(prefect_harness, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus
    from flows.cli.inspect import register, run_mixture
    from training.cache import ShardCache

    extra = _write_sources(tmp_path / "raw")
    overrides = TINY_OVERRIDES | {"shard.target_bytes": 2048, "clean.quality.enabled": False} | extra
    summary = build_corpus(output=str(tmp_path / "store"), overrides=overrides)
    manifest, dstore = load_manifest(summary["manifest_uri"], None)
    mixture = manifest.mixture
    assert sorted(mixture["sources"]) == ["Pile-CC", "books", "web"]
    stats = manifest.stats
    assert stats["clean"]["dropped"]["language_not_allowed"] == 1
    assert stats["decontam"]["extra"]["contaminated.quiz"] == 2  # the first book and the one holding it
    assert stats["ingest"]["extra"]["source.Pile-CC"] == 24 and stats["clean"]["extra"]["source.books"] == 9

    # per-source tokens and docs in the manifest == the sum over every published docs.parquet
    counted: dict[tuple[str, str], list[int]] = {}
    for shard in manifest.shards:
        table = pq.read_table(dstore.uri_of(shard.docs_key).removeprefix("file://")).to_pylist()
        for row in table:
            c = counted.setdefault((row["source_name"], shard.split), [0, 0])
            c[0] += row["tokens"]
            c[1] += row["piece"] == 0
            meta = json.loads(row["meta"])
            assert meta["source_name"] == row["source_name"] and meta["language"] == row["language"] == "en"
            if row["source_name"] == "Pile-CC":  # the user's "offset" kept, ours beside it
                assert meta["user"]["offset"] == "theirs" and meta["offset"].startswith("L")
            else:
                assert meta["user"]["location"].startswith(row["source_name"])
    for name, info in mixture["sources"].items():
        for split in ("train", "valid"):
            assert [info.get(split, {}).get("tokens", 0), info.get(split, {}).get("docs", 0)] == counted.get(
                (name, split), [0, 0]
            )
    assert {n: v["target_share"] for n, v in mixture["sources"].items()} == {
        "Pile-CC": 0.5,
        "web": 0.3,
        "books": 0.2,
    }
    assert [r["source"] for r in summary["mixture"]] == ["Pile-CC", "books", "web"]

    # the trainer's sampler: 10,000 samples, token share per source within 1 point of the weights
    cache = ShardCache(dstore, tmp_path / "cache", 1 << 30)
    dataset = ShardDataset(manifest, dstore, SEQ_LEN, "train", cache)
    sources = blend_sources(mixture, SEQ_LEN)
    n = len(dataset)
    drawn: list[int] = []
    epoch = 0
    while len(drawn) < 10_000:
        sampler = BlendedDistributedSampler(sources, n, num_replicas=1, rank=0, seed=5)
        sampler.set_epoch(epoch)
        drawn += list(sampler)
        epoch += 1
    drawn_arr = np.array(drawn[:10_000])
    ends = [s.first + s.count for s in sources]
    which = np.searchsorted(ends, drawn_arr, side="right")
    shares = {s.name: float(np.mean(which == k)) for k, s in enumerate(sources)}  # seq_len tokens each
    assert all(
        abs(shares[name] - w) < 0.01 for name, w in {"Pile-CC": 0.5, "web": 0.3, "books": 0.2}.items()
    ), shares
    for i in drawn_arr[:50].tolist():  # the drawn source is the source of the documents the sample holds
        names = {p["source_name"] for p in dataset.documents_of_sample(i)}
        assert names == {sources[int(np.searchsorted(ends, i, side="right"))].name}

    # resume mid-epoch on another world size continues the same blended order
    full = list(BlendedDistributedSampler(sources, n, num_replicas=1, rank=0, seed=5))
    start = n // 3
    resumed = []
    for rank in range(2):
        s = BlendedDistributedSampler(sources, n, num_replicas=2, rank=rank, seed=5)
        s.set_epoch(0)
        s.set_start(start)
        resumed.append(list(s))
    assert [resumed[j % 2][j // 2] for j in range(2 * len(resumed[0]))] == full[
        start : start + 2 * len(resumed[0])
    ]
    dataset.close()

    # the trainer builds exactly this sampler from the manifest (and a plain one with blend: false)
    import torch

    from training.config import TrainConfig
    from training.engine import DistInfo
    from training.train import build_data

    info = DistInfo(rank=0, world_size=1, local_rank=0, on_cpu=True, device=torch.device("cpu"))
    for blend in (True, False):
        cfg = TrainConfig(
            seq_len=SEQ_LEN,
            seed=5,
            num_workers=0,
            blend=blend,
            output_dir=str(tmp_path / "run"),
            eval_batches=0,
        )
        _, sampler, _, _ = build_data(cfg, manifest, dstore, info)
        assert isinstance(sampler, BlendedDistributedSampler) is blend
        if blend:
            assert list(sampler)[:100] == full[:100]

    # pileworks inspect mixture
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["inspect", "mixture", summary["manifest_uri"]])
    assert args.func is run_mixture and run_mixture(args) == 0
    report = json.loads(
        open_store(str(tmp_path / "store"), None).get_bytes(stats["decontam"]["extra"]["report_key"])
    )
    assert report["matched_ngrams"] and report["eval_sets"]["quiz"]["texts"] == 1
