"""Manifest schema/validation, the content id, the publish protocol (file:// and S3 via moto) and loading."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.dataset.card import CARD_KEY, attach_card
from pipeline.dataset.manifest import (
    LATEST_KEY,
    MANIFEST_KEY,
    DatasetConflictError,
    Manifest,
    TokenizerInfo,
    compute_dataset_id,
    load_manifest,
    object_hashes,
    publish_dataset,
)
from pipeline.dataset.shards import ShardInfo
from pipeline.storage import FileStore, ObjectStore, StorageError, open_store
from tests.fixtures.tiny_dataset import build_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, Path]:
    """A published tiny dataset: its manifest and its folder (which doubles as a staged folder to republish)."""
    root = tmp_path_factory.mktemp("tiny")
    uri = build_tiny_dataset(root, n_docs=60)
    manifest, _ = load_manifest(uri, None)
    return manifest, Path(uri.removeprefix("file://")).parent


# ---------------------------------------------------------------- schema + id


def test_manifest_round_trips_json_and_keeps_schema_fields(tiny) -> None:
    manifest, folder = tiny
    raw = json.loads((folder / MANIFEST_KEY).read_text())
    for key in (
        "schema_version",
        "name",
        "dataset_id",
        "code_version",
        "tokenizer",
        "dtype",
        "dtype_code",
        "shards",
        "splits",
        "stats",
        "inputs",
        "config",
        "lineage",
        "created_at",
    ):
        assert key in raw
    assert raw["schema_version"] == 1 and raw["dtype"] == "uint16" and raw["dtype_code"] == 8
    assert set(raw["stats"]) >= {"tokenize", "shard"}
    assert Manifest.from_json(raw).to_json() == raw
    assert manifest.split_shards("train")[0].token_offset == 0


def test_dataset_id_ignores_created_at_lineage_and_volatile_config(tiny) -> None:
    manifest, _ = tiny
    same = dataclasses.replace(
        manifest, created_at="1999-01-01T00:00:00+00:00", lineage={"prefect_flow_run_id": "x"}
    )
    assert compute_dataset_id(same) == manifest.dataset_id
    moved = dataclasses.replace(
        manifest, config=manifest.config | {"output": "s3://elsewhere", "workers": 64}
    )
    assert compute_dataset_id(moved) == manifest.dataset_id
    budget = dataclasses.replace(  # how the LSH work is split in memory changes nothing it finds
        manifest, config=manifest.config | {"dedup": {"near": {"memory_budget_mb": 64}}}
    )
    assert compute_dataset_id(budget) == compute_dataset_id(
        dataclasses.replace(
            manifest, config=manifest.config | {"dedup": {"near": {"memory_budget_mb": 4096}}}
        )
    )
    changed = dataclasses.replace(manifest, config=manifest.config | {"clean": {"min_chars": 10}})
    assert compute_dataset_id(changed) != manifest.dataset_id
    shard = dataclasses.replace(manifest.shards[0], sha256="0" * 64)
    assert (
        compute_dataset_id(dataclasses.replace(manifest, shards=[shard, *manifest.shards[1:]]))
        != manifest.dataset_id
    )
    assert len(manifest.dataset_id) == 20 and int(manifest.dataset_id, 16) >= 0


# manifest.json as pileworks e029b3c wrote it for _every_field_manifest(): published manifests must keep their bytes
GOLDEN = Path(__file__).with_name("manifest_v1.json")


def _every_field_manifest() -> Manifest:
    """A manifest whose every field (and every field of its records) holds a value other than its default."""
    shards, offset = [], {"train": 0, "valid": 0}
    for split, index, tokens in (("train", 0, 100), ("train", 1, 99), ("valid", 0, 7)):
        stem = f"{split}/shard-{index:05d}"
        shards.append(
            ShardInfo(
                split=split,
                index=index,
                key=f"{stem}.bin",
                idx_key=f"{stem}.idx",
                docs_key=f"{stem}.docs.parquet",
                tokens=tokens,
                docs=3 + index,
                bytes=2 * tokens,
                sha256=f"{index}{split}" * 4,
                idx_bytes=64 + index,
                idx_sha256=f"i{index}{split}",
                docs_sha256=f"d{index}{split}",
                token_offset=offset[split],
                sequences=4 + index,
                docs_bytes=900 + index,
            )
        )
        offset[split] += tokens
    return Manifest(
        name="golden",
        tokenizer=TokenizerInfo(
            key="tokenizer.json",
            sha256="ab" * 32,
            vocab_size=512,
            eos_id=0,
            bos_id=1,
            pad_id=2,
            files={"tokenizer_config.json": "cd" * 32},
        ),
        dtype="uint16",
        shards=shards,
        code_version="0.0.golden",
        stats={
            "tokenize": {"stage": "tokenize", "docs_in": 5, "extra": {"tokens": 206}},
            "shard": {"stage": "shard"},
        },
        mixture={"sources": {"default": {"train": {"tokens": 199, "docs": 7}}}, "ranges": {"train": []}},
        card={"key": "card.json", "sha256": "ef" * 32, "bytes": 123},
        inputs=[{"uri": "file:///in/a.txt", "size": 10, "etag": "e", "mtime": 1.5}],
        config={
            "name": "golden",
            "shard": {"target_bytes": 200, "valid_fraction": 0.1, "seed": 0},
            "output": "/x",
        },
        lineage={"prefect_flow_run_id": "run-1"},
        created_at="2026-01-02T03:04:05+00:00",
    )


def _defaults(cls: type) -> dict[str, object]:
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def test_every_field_is_published_in_field_order_and_read_back() -> None:
    manifest = _every_field_manifest()
    for record in (manifest, manifest.tokenizer, manifest.shards[1]):  # so a dropped field would show
        at_default = {n for n, v in _defaults(type(record)).items() if getattr(record, n) == v}
        assert at_default <= {"schema_version"}, at_default  # the one version there is
    data = json.loads(manifest.to_bytes())
    assert list(data) == [f.name for f in dataclasses.fields(Manifest)]
    assert list(data["shards"][0]) == [f.name for f in dataclasses.fields(ShardInfo)]
    assert list(data["tokenizer"]) == [f.name for f in dataclasses.fields(TokenizerInfo)]
    assert Manifest.from_json(data) == manifest


def test_a_new_field_is_published_and_read_back() -> None:
    @dataclasses.dataclass(kw_only=True)
    class Grown(Manifest):  # the manifest once someone adds a field
        provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
        shard_notes: list[ShardInfo] = dataclasses.field(default_factory=list)

    base = _every_field_manifest()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Manifest)}
    grown = Grown(**fields, provenance={"signed_by": "ci"}, shard_notes=base.shards[:1])
    data = json.loads(grown.to_bytes())
    assert list(data)[-2:] == ["provenance", "shard_notes"]
    back = Grown.from_json(data)
    assert back.provenance == {"signed_by": "ci"} and back.shard_notes == base.shards[:1]
    assert back == grown


def test_published_manifest_bytes_and_id_are_unchanged() -> None:
    golden = GOLDEN.read_bytes()
    assert _every_field_manifest().to_bytes() == golden
    loaded = Manifest.from_json(json.loads(golden))
    assert loaded.to_bytes() == golden and loaded.dataset_id == "de931302bd48c68845d2"


def test_a_manifest_published_before_input_names_traces_its_documents_to_their_uris() -> None:
    """Before issue 43 a document's ``source`` was its input's URI, the manifest's ``inputs`` had no ``name`` and
    its lineage no ``input_root``: ``input_uri`` returns the URI the document holds, moved root or not (there
    is no root to move it from), and a new manifest's name goes under its root or the one given."""
    legacy = Manifest.from_json(json.loads(GOLDEN.read_bytes()))
    assert "input_root" not in legacy.lineage and all("name" not in e for e in legacy.inputs)
    assert legacy.input_uri("file:///in/a.txt") == "file:///in/a.txt"
    assert legacy.input_uri("file:///in/a.txt", "file:///moved") == "file:///in/a.txt"
    named = dataclasses.replace(
        legacy,
        inputs=[{**legacy.inputs[0], "name": "a.txt"}],
        lineage={**legacy.lineage, "input_root": "file:///in"},
    )
    assert named.input_uri("a.txt") == "file:///in/a.txt"
    assert named.input_uri("a.txt", "s3://bucket/moved/") == "s3://bucket/moved/a.txt"
    assert named.input_uri("web/b.txt") == "file:///in/web/b.txt"  # a name the inputs list does not hold


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d | {"schema_version": 2}, "schema_version"),
        (lambda d: d | {"dtype": "int32"}, "does not match vocab_size"),
        (lambda d: d | {"dtype_code": 4}, "dtype_code"),
        (lambda d: d | {"dataset_id": "0" * 20}, "does not match the manifest content"),
        (lambda d: d | {"splits": {**d["splits"], "train": {**d["splits"]["train"], "docs": 1}}}, "add up"),
        (lambda d: d | {"tokenizer": {**d["tokenizer"], "eos_id": 10**6}}, "outside the vocabulary"),
        (lambda d: {k: v for k, v in d.items() if k != "tokenizer"}, "missing"),
        (lambda d: d | {"surprise": 1}, r"unknown fields \['surprise'\]"),
        (lambda d: d | {"shards": [{**d["shards"][0], "surprise": 1}]}, "unknown fields"),
    ],
)
def test_from_json_rejects_inconsistent_manifests(tiny, mutate, message: str) -> None:
    manifest, _ = tiny
    with pytest.raises(ValueError, match=message):
        Manifest.from_json(mutate(manifest.to_json()))


def test_validate_checks_offsets_and_balance(tiny) -> None:
    manifest, _ = tiny
    train = manifest.split_shards("train")
    gap = dataclasses.replace(train[1], token_offset=train[1].token_offset + 1)
    bad = dataclasses.replace(manifest, shards=[train[0], gap, *manifest.shards[2:]])
    with pytest.raises(ValueError, match="not contiguous"):
        bad.validate()
    big = dataclasses.replace(train[-1], tokens=train[-1].tokens + 5)
    splits = json.loads(json.dumps(manifest.splits))
    splits["train"]["tokens"] += 5
    bad = dataclasses.replace(
        manifest, shards=[*train[:-1], big, *manifest.split_shards("valid")], splits=splits
    )
    with pytest.raises(ValueError, match="not balanced"):
        bad.validate()


# ---------------------------------------------------------------- publish + load


def _publish_and_load(store: ObjectStore, tiny, s3=None) -> None:
    manifest, folder = tiny
    uri = publish_dataset(store, "copy", folder, dataclasses.replace(manifest, name="copy"))
    assert uri == store.uri_of(f"datasets/copy/{manifest.dataset_id}/{MANIFEST_KEY}")
    for target in (
        uri,
        uri.rsplit("/", 1)[0],
        store.uri_of(f"datasets/copy/{LATEST_KEY}"),
        store.uri.rstrip("/") + "/datasets/copy",
    ):
        loaded, ds_store = load_manifest(target, s3=s3)
        assert loaded.dataset_id == manifest.dataset_id and loaded.name == "copy"
        for shard in loaded.shards:
            assert ds_store.get_bytes(shard.key) == (folder / shard.key).read_bytes()
        assert ds_store.get_bytes(loaded.tokenizer.key) == (folder / "tokenizer.json").read_bytes()
    latest = json.loads(store.get_bytes(f"datasets/copy/{LATEST_KEY}"))
    assert latest["dataset_id"] == manifest.dataset_id and latest["manifest"].endswith("/manifest.json")
    assert "updated_at" in latest


def test_publish_round_trip_file(tmp_path: Path, tiny) -> None:
    _publish_and_load(FileStore(tmp_path / "store"), tiny)


@pytest.mark.s3
def test_publish_round_trip_s3(s3_bucket, tiny) -> None:
    _publish_and_load(open_store(s3_bucket.uri, s3=s3_bucket.options), tiny, s3=s3_bucket.options)


def test_load_manifest_accepts_local_paths_and_refuses_missing(tmp_path: Path, tiny) -> None:
    manifest, folder = tiny
    loaded, _ = load_manifest(folder / MANIFEST_KEY, None)
    assert loaded.dataset_id == manifest.dataset_id
    assert load_manifest(str(folder.parent), None)[0].dataset_id == manifest.dataset_id  # the name folder
    with pytest.raises(FileNotFoundError):
        load_manifest(tmp_path / "nope" / "manifest.json", None)
    assert not (tmp_path / "nope").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither"):
        load_manifest(tmp_path / "empty", None)


def test_republish_identical_is_a_noop_and_different_content_conflicts(tmp_path: Path, tiny) -> None:
    manifest, folder = tiny
    store = FileStore(tmp_path / "store")
    first = publish_dataset(store, "tiny", folder, manifest)
    mtime = (tmp_path / "store" / first.split("/store/", 1)[1]).stat().st_mtime_ns
    later = dataclasses.replace(manifest, created_at="2030-01-01T00:00:00+00:00")
    assert publish_dataset(store, "tiny", folder, later) == first
    assert (tmp_path / "store" / first.split("/store/", 1)[1]).stat().st_mtime_ns == mtime
    other = dataclasses.replace(manifest, stats=manifest.stats | {"extra": {"note": 1}})
    with pytest.raises(DatasetConflictError, match="fields that differ: stats") as info:
        publish_dataset(store, "tiny", folder, other)
    assert info.value.existing_uri == first


def test_a_republish_with_other_metadata_leaves_the_published_card_and_manifest_as_they_are(
    tmp_path: Path, tiny
) -> None:
    """Same content, other stats: the card (not part of the id) differs too, and must not replace the one the
    published manifest lists."""
    manifest, folder = tiny
    store = FileStore(tmp_path / "store")
    first = publish_dataset(store, "tiny", folder, manifest)
    prefix = (tmp_path / "store" / first.split("/store/", 1)[1]).parent
    before = {p.name: p.read_bytes() for p in prefix.glob("*.json")}
    tokenize = manifest.stats["tokenize"] | {"docs_out": manifest.stats["tokenize"]["docs_out"] + 1}
    other = dataclasses.replace(manifest, stats=manifest.stats | {"tokenize": tokenize})
    (tmp_path / CARD_KEY).write_bytes(attach_card(other))
    staged = {key: folder / key for key in object_hashes(other)} | {CARD_KEY: tmp_path / CARD_KEY}
    with pytest.raises(DatasetConflictError) as info:
        publish_dataset(store, "tiny", staged, other)
    assert info.value.differ == ("card", "stats")
    assert {p.name: p.read_bytes() for p in prefix.glob("*.json")} == before


def test_racing_publishers_leave_one_manifest_and_a_clear_error(store: ObjectStore, tiny) -> None:
    manifest, folder = tiny
    variants = [dataclasses.replace(manifest, stats={"run": {"who": i}}) for i in range(4)]
    results: list[object] = [None] * len(variants)
    barrier = threading.Barrier(len(variants))

    def publish(i: int) -> None:
        barrier.wait()
        try:
            results[i] = publish_dataset(store, "tiny", folder, variants[i])
        except DatasetConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(variants))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, str)]
    assert len(winners) == 1
    assert sum(isinstance(r, DatasetConflictError) for r in results) == len(variants) - 1
    published = Manifest.from_json(json.loads(store.get_bytes(winners[0].removeprefix(store.uri + "/"))))
    assert published.stats == {"run": {"who": results.index(winners[0])}}


class _RecordingStore(FileStore):
    """Records write order; optionally corrupts one uploaded object to prove uploads are verified."""

    def __init__(self, root: Path, corrupt: str | None = None):
        super().__init__(root)
        self.writes: list[str] = []
        self.corrupt = corrupt

    def put_file(self, key: str, path) -> None:
        self.writes.append(key)
        if self.corrupt and key.endswith(self.corrupt):
            self.put_bytes(key, Path(path).read_bytes() + b"!")
            self.writes.pop()
            return
        super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.writes.append(key)
        super().put_bytes(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.writes.append(key)
        super().put_if_absent(key, data)


def test_manifest_is_written_after_every_object_and_latest_last(tmp_path: Path, tiny) -> None:
    manifest, folder = tiny
    store = _RecordingStore(tmp_path / "s")
    publish_dataset(store, "tiny", folder, manifest)
    prefix = f"datasets/tiny/{manifest.dataset_id}/"
    expected = {prefix + k for s in manifest.shards for k in (s.key, s.idx_key, s.docs_key)} | {
        prefix + k for k in ("tokenizer.json", *manifest.tokenizer.files, "card.json")
    }
    assert (
        manifest.tokenizer.files
    )  # tokenizer_config.json and special_tokens_map.json, verified like the rest
    assert manifest.card["key"] == "card.json"  # the data card, published before the manifest like the rest
    assert store.writes[-2:] == [prefix + MANIFEST_KEY, f"datasets/tiny/{LATEST_KEY}"]
    assert set(store.writes[:-2]) == expected


def test_publish_refuses_corrupt_uploads_and_staged_files(tmp_path: Path, tiny) -> None:
    manifest, folder = tiny
    store = _RecordingStore(tmp_path / "s", corrupt="train/shard-00001.bin")
    with pytest.raises(StorageError, match="sha256"):
        publish_dataset(store, "tiny", folder, manifest)
    assert not store.exists(f"datasets/tiny/{manifest.dataset_id}/{MANIFEST_KEY}")
    assert not store.exists(f"datasets/tiny/{LATEST_KEY}")
    staged = {k: folder / k for s in manifest.shards for k in (s.key, s.idx_key, s.docs_key)}
    staged.update({k: folder / k for k in (*manifest.tokenizer.files, "card.json")})
    staged["tokenizer.json"] = tmp_path / "tok.json"
    (tmp_path / "tok.json").write_text("{}")
    with pytest.raises(ValueError, match="does not match the manifest's sha256"):
        publish_dataset(FileStore(tmp_path / "t"), "tiny", staged, manifest)
    del staged["tokenizer.json"]
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        publish_dataset(FileStore(tmp_path / "t"), "tiny", staged, manifest)
    with pytest.raises(ValueError, match="dataset name"):
        publish_dataset(FileStore(tmp_path / "t"), "../x", folder, dataclasses.replace(manifest, name="../x"))


def test_resumed_publish_replaces_a_partial_object(tmp_path: Path, tiny) -> None:
    manifest, folder = tiny
    store = FileStore(tmp_path / "s")
    key = f"datasets/tiny/{manifest.dataset_id}/{manifest.shards[0].key}"
    good = (folder / manifest.shards[0].key).read_bytes()
    store.put_bytes(key, bytes(len(good)))  # same size, wrong content: left by a killed publisher
    publish_dataset(store, "tiny", folder, manifest)
    assert store.get_bytes(key) == good


def test_empty_valid_split_is_listed_with_zeros(tmp_path: Path) -> None:
    manifest, _ = load_manifest(build_tiny_dataset(tmp_path, n_docs=30, valid_fraction=0.0), None)
    assert manifest.splits["valid"] == {"tokens": 0, "docs": 0, "shards": 0}
    assert manifest.split_shards("valid") == [] and manifest.splits["train"]["docs"] == 30
