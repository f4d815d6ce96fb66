"""The dataset contract training reads: ``manifest.json`` (schema v1), its content id, publish and load.

A published dataset lives under the immutable prefix ``datasets/<name>/<dataset_id>/``: the tokenizer, then
every shard (each verified by sha256 after upload), then ``manifest.json`` written create-only and *last*, so a
reader that finds a manifest finds a complete dataset. ``datasets/<name>/latest.json`` then points at it.
The dataset id is a content hash (tokenizer, dtype, every shard's hashes, the resolved config minus volatile
fields), so a rerun with the same inputs and config yields the same id and publishing it again is a no-op.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.config import check_name
from pipeline.dataset.shards import CODE_DTYPES, DTYPE_CODES, SPLITS, ShardInfo, dtype_for_vocab
from pipeline.storage import (
    AlreadyExistsError,
    ObjectStore,
    S3Options,
    StorageError,
    join_key,
    open_store,
    sha256_file,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MANIFEST_KEY = "manifest.json"
LATEST_KEY = "latest.json"
# Config keys that say where or how a build ran, not what it produced: excluded (at any depth) from the id.
VOLATILE_CONFIG_KEYS = frozenset(
    {
        "created_at",
        "lineage",
        "output",
        "output_uri",
        "store",
        "work_dir",
        "s3",
        "workers",
        "num_workers",
        "task_runner",
        "dask_address",
        "prefect",
        "log_level",
        "run_name",
        "build_key",
        "memory_budget_mb",  # how the LSH work is split in memory, not what it finds
        # how the tokenizer was trained, not which: its sha256 is in the id (the trainers write the same file)
        "trainer",
    }
)
# Manifest fields that may differ between two publishes of the same content.
_NOT_CONTENT = ("created_at", "lineage")


class DatasetConflictError(AlreadyExistsError):
    """A different manifest was already published under this dataset id (a racing or diverging publisher).

    ``existing_uri`` names the manifest that won, so a caller may choose to use it instead; ``differ`` names the
    manifest fields that differ (metadata such as ``inputs``, ``stats``, ``card``: the content is the same).
    """

    def __init__(self, message: str, *, existing_uri: str, differ: tuple[str, ...] = ()):
        super().__init__(message)
        self.existing_uri = existing_uri
        self.differ = differ


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    key: str
    sha256: str
    vocab_size: int
    eos_id: int
    bos_id: int | None = None
    pad_id: int | None = None
    # Hugging Face's companions of tokenizer.json (tokenizer_config.json, special_tokens_map.json): key -> sha256.
    # Part of the dataset id when present (datasets published before they existed keep their id).
    files: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class Manifest:
    """``manifest.json``: its keys are these fields, in this order (:meth:`to_json`), so a field added here is
    published and read back without another list to keep in step. The order is part of the published bytes:
    append new fields, never reorder."""

    schema_version: int = SCHEMA_VERSION
    name: str
    dataset_id: str = ""
    code_version: str = __version__
    tokenizer: TokenizerInfo
    dtype: str
    dtype_code: int = 0
    shards: list[ShardInfo]
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    # Tokens/docs per source name and language per split, each source's contiguous token ranges and its
    # asked and target weights (pipeline.sources.mixture_of_shards); {} for datasets built before sources.
    mixture: dict[str, Any] = field(default_factory=dict)
    # The data card published beside the manifest (pipeline.dataset.card): {"key": "card.json", "sha256", "bytes"}; {} for
    # datasets built before it. Not part of the dataset id: the card reports on the content (from ``stats``,
    # which the id leaves out too), so a change in what the card reports never renames a dataset.
    card: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=lambda: {"prefect_flow_run_id": None})
    created_at: str = ""

    def __post_init__(self) -> None:
        # JSON round trip, so an in-memory manifest equals its loaded self (tuples -> lists, keys -> str).
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if _record_of(hints[f.name]) is None:
                setattr(self, f.name, json.loads(json.dumps(getattr(self, f.name), default=str)))
        # Derived fields are filled in, never trusted blindly: validate() cross-checks them when given.
        if not self.dtype_code and self.dtype in DTYPE_CODES:
            self.dtype_code = DTYPE_CODES[self.dtype]
        if not self.splits:
            self.splits = split_totals(self.shards)
        if not self.dataset_id:
            self.dataset_id = compute_dataset_id(self)
        if not self.created_at:
            self.created_at = datetime.now(UTC).isoformat(timespec="seconds")

    def input_uri(self, source: str, root: str | None = None) -> str:
        """Where the input a document's ``source`` names lay when this dataset was built, or lies under ``root``
        (the corpus moved since): ``source`` is its name under the input root (``lineage.input_root``), or its
        URI in a dataset built before names."""
        if root is None:
            for entry in self.inputs:
                if entry.get("name") == source:
                    return str(entry["uri"])
        root = root or str(self.lineage.get("input_root") or "")
        if not root or "://" in source:
            return source
        return f"{root.rstrip('/')}/{source}"

    def split_shards(self, split: str) -> list[ShardInfo]:
        return sorted((s for s in self.shards if s.split == split), key=lambda s: s.index)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # every field, in field order (nested records too)

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        if not isinstance(data, Mapping):
            raise ValueError("manifest must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"manifest schema_version {version!r} is not supported (this code reads "
                f"{SCHEMA_VERSION}); upgrade pileworks or rebuild the dataset"
            )
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"manifest has unknown fields {unknown}: written by a newer pileworks? upgrade it"
            )
        hints = typing.get_type_hints(cls)
        try:
            manifest = cls(**{k: _field_from_json(hints[k], v) for k, v in data.items()})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"manifest is missing or has unknown fields: {exc}") from exc
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistency (dtype vs vocab, offsets, split totals, id)."""
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version must be {SCHEMA_VERSION}, got {self.schema_version}")
        if not self.name:
            raise ValueError("manifest.name must be non-empty")
        expected = dtype_for_vocab(self.tokenizer.vocab_size).name
        if self.dtype != expected:
            raise ValueError(
                f"dtype {self.dtype!r} does not match vocab_size {self.tokenizer.vocab_size} "
                f"(expected {expected!r})"
            )
        if CODE_DTYPES.get(self.dtype_code) != self.dtype:
            raise ValueError(f"dtype_code {self.dtype_code} does not match dtype {self.dtype!r}")
        for key in self.tokenizer.files:
            if not key or "/" in key or key.startswith("."):
                raise ValueError(
                    f"tokenizer.files key {key!r} must be a plain file name next to tokenizer.json"
                )
        if self.card and (set(self.card) != {"key", "sha256", "bytes"} or "/" in str(self.card["key"])):
            raise ValueError(f"card {self.card} must be {{key, sha256, bytes}} with a plain file name as key")
        for tid in ("eos_id", "bos_id", "pad_id"):
            value = getattr(self.tokenizer, tid)
            if value is not None and not 0 <= value < self.tokenizer.vocab_size:
                raise ValueError(f"tokenizer.{tid}={value} is outside the vocabulary")
        for split in sorted({s.split for s in self.shards} | set(self.splits)):
            _validate_split(split, self.split_shards(split), self.splits.get(split))
        if self.dataset_id != compute_dataset_id(self):
            raise ValueError(
                f"dataset_id {self.dataset_id!r} does not match the manifest content "
                f"({compute_dataset_id(self)!r}); the manifest was edited or is corrupt"
            )


def _record_of(hint: Any) -> type | None:
    """The record class a field holds (as itself or as a list's items: ``TokenizerInfo``, ``ShardInfo``);
    None for a field that is plain JSON."""
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
    return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None


def _field_from_json(hint: Any, value: Any) -> Any:
    record = _record_of(hint)
    if record is None:
        return value
    return [record(**v) for v in value] if typing.get_origin(hint) is list else record(**value)


def _validate_split(split: str, shards: list[ShardInfo], totals: dict[str, int] | None) -> None:
    offset = 0
    for i, shard in enumerate(shards):
        if shard.index != i:
            raise ValueError(
                f"{split}: shard indexes must be 0..{len(shards) - 1}, found {shard.index} at {i}"
            )
        if shard.token_offset != offset:
            raise ValueError(
                f"{split}/shard {i}: token_offset {shard.token_offset} != {offset} (not contiguous)"
            )
        if shard.tokens <= 0:
            raise ValueError(f"{split}/shard {i}: tokens must be > 0")
        offset += shard.tokens
    if shards and max(s.tokens for s in shards) - min(s.tokens for s in shards) > 1:
        raise ValueError(f"{split}: shards are not balanced (token counts differ by more than 1)")
    want = {"tokens": offset, "docs": sum(s.docs for s in shards), "shards": len(shards)}
    if totals is None or {k: totals.get(k) for k in want} != want:
        raise ValueError(f"splits[{split!r}] = {totals} does not add up to its shards ({want})")


def split_totals(shards: list[ShardInfo]) -> dict[str, dict[str, int]]:
    # Both standard splits are always listed (an empty valid split reads as zeros, not a KeyError).
    totals = {split: {"tokens": 0, "docs": 0, "shards": 0} for split in SPLITS}
    for s in sorted(shards, key=lambda s: (s.split, s.index)):
        t = totals.setdefault(s.split, {"tokens": 0, "docs": 0, "shards": 0})
        t["tokens"] += s.tokens
        t["docs"] += s.docs
        t["shards"] += 1
    return totals


def _strip_volatile(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_volatile(v) for k, v in value.items() if k not in VOLATILE_CONFIG_KEYS}
    if isinstance(value, (list, tuple)):
        return [_strip_volatile(v) for v in value]
    return value


def compute_dataset_id(manifest: Manifest) -> str:
    """sha256 (first 20 hex) over canonical JSON of everything that defines the dataset's content."""
    content = {
        "schema_version": manifest.schema_version,
        "tokenizer_sha256": manifest.tokenizer.sha256,
        "dtype": manifest.dtype,
        "shards": [
            [s.split, s.index, s.tokens, s.sha256, s.idx_sha256, s.docs_sha256]
            for s in sorted(manifest.shards, key=lambda s: (s.split, s.index))
        ],
        "config": _strip_volatile(manifest.config),
    }
    if manifest.tokenizer.files:
        content["tokenizer_files"] = dict(sorted(manifest.tokenizer.files.items()))
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def _content(manifest_json: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest_json.items() if k not in _NOT_CONTENT}


# ---------------------------------------------------------------- publish


def _staged_paths(staged: str | Path | Mapping[str, str | Path], keys: list[str]) -> dict[str, Path]:
    if isinstance(staged, Mapping):
        paths = {k: Path(staged[k]) for k in keys if k in staged}
    else:
        paths = {k: Path(staged) / k for k in keys}
    missing = [k for k in keys if k not in paths or not paths[k].is_file()]
    if missing:
        raise FileNotFoundError(f"staged files missing for publish: {missing[:5]}")
    return paths


def object_hashes(manifest: Manifest) -> dict[str, str]:
    """Every object a manifest lists (shards and their indexes, tokenizer files, the card) with its sha256."""
    hashes = {manifest.tokenizer.key: manifest.tokenizer.sha256, **manifest.tokenizer.files}
    if manifest.card:
        hashes[manifest.card["key"]] = manifest.card["sha256"]
    for s in manifest.shards:
        hashes.update({key: sha256 for key, sha256, _ in s.objects()})
    return hashes


def upload_verified(store: ObjectStore, key: str, path: Path, sha256: str) -> None:
    """Upload unless an identical object is already there (a resumed publish), then verify by re-reading."""
    _place_verified(store, key, path.stat().st_size, sha256, lambda: store.put_file(key, path))


def _place_verified(store: ObjectStore, key: str, size: int, sha256: str, place: Callable[[], None]) -> None:
    """``place()`` the object at ``key`` unless one of that size and sha256 is there already, then verify it
    by re-reading. One look-up (a HEAD on S3) decides."""
    try:
        there = store.stat(key).size == size
    except FileNotFoundError:
        there = False
    if there:
        try:
            store.verify_sha256(key, sha256)
            return
        except StorageError as exc:  # a partial/foreign object from an earlier run: overwrite it
            log.warning("replacing %s: %s", store.uri_of(key), exc)
    place()
    store.verify_sha256(key, sha256)


def publish_dataset(
    root_store: ObjectStore, name: str, staged: str | Path | Mapping[str, str | Path], manifest: Manifest
) -> str:
    """Upload tokenizer + shards under ``datasets/<name>/<dataset_id>/``, verify, then write the manifest last.

    ``staged`` is a local folder laid out by manifest keys, or a mapping key -> local path. Returns the
    manifest URI. Publishing the same content again is a no-op (the existing URI is returned); a different
    manifest under the same id raises :class:`DatasetConflictError`. ``latest.json`` is updated either way.
    """
    check_name(name)
    if manifest.name != name:
        raise ValueError(f"manifest.name {manifest.name!r} != publish name {name!r}")
    manifest.validate()
    hashes = object_hashes(manifest)
    paths = _staged_paths(staged, list(hashes))
    for key, path in paths.items():
        if sha256_file(path) != hashes[key]:
            raise ValueError(f"staged file {path} does not match the manifest's sha256 for {key}")
    prefix = dataset_prefix(name, manifest.dataset_id)
    if not already_published(root_store, manifest):
        for key, path in paths.items():
            upload_verified(root_store, join_key(prefix, key), path, hashes[key])
    return commit_manifest(root_store, name, manifest)


def already_published(root_store: ObjectStore, manifest: Manifest) -> bool:
    """Whether ``manifest``'s dataset id is published in ``root_store`` (its manifest in place). Nothing under its
    prefix is then written again: the prefix is immutable, and the data card is not part of the id, so the card
    of a build with other metadata would replace the one the published manifest lists (and fail its sha256)."""
    return root_store.exists(join_key(dataset_prefix(manifest.name, manifest.dataset_id), MANIFEST_KEY))


def dataset_prefix(name: str, dataset_id: str) -> str:
    """Where a dataset's objects live in its store: ``datasets/<name>/<dataset_id>``."""
    return join_key("datasets", name, dataset_id)


def copy_verified(store: ObjectStore, src_key: str, key: str, sha256: str, size: int) -> None:
    """:func:`upload_verified` for an object of ``size`` bytes already in the store (a shard a worker wrote to
    the work folder): a copy within the store (server-side on S3, a hard link on disk), then the same check."""
    _place_verified(store, key, size, sha256, lambda: store.copy(src_key, key, size))


def commit_manifest(root_store: ObjectStore, name: str, manifest: Manifest) -> str:
    """The last step of a publish, once every object the manifest lists is in place and verified: write the
    manifest (create-only; the same content already there is a no-op, other content a
    :class:`DatasetConflictError`), then point ``latest.json`` at it. Returns the manifest URI."""
    manifest_key = join_key(dataset_prefix(name, manifest.dataset_id), MANIFEST_KEY)
    try:
        root_store.put_if_absent(manifest_key, manifest.to_bytes())
        log.info("published %s", root_store.uri_of(manifest_key))
    except AlreadyExistsError:
        existing = json.loads(root_store.get_bytes(manifest_key))
        mine, theirs = _content(manifest.to_json()), _content(existing)
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if differ:
            raise DatasetConflictError(
                f"{root_store.uri_of(manifest_key)} already holds a different manifest for dataset id "
                f"{manifest.dataset_id} (fields that differ: {', '.join(differ)}). The shards are the same "
                "content (same id), so another publisher won a race or the metadata changed: use the "
                "existing dataset, or publish under another name",
                existing_uri=root_store.uri_of(manifest_key),
                differ=tuple(differ),
            ) from None
        log.info(
            "dataset %s already published at %s: nothing to do",
            manifest.dataset_id,
            root_store.uri_of(manifest_key),
        )
    point_latest(root_store, name, manifest.dataset_id)
    return root_store.uri_of(manifest_key)


def point_latest(root_store: ObjectStore, name: str, dataset_id: str) -> None:
    """Point ``datasets/<name>/latest.json`` at a published dataset (the newest build of ``name``)."""
    pointer = {
        "dataset_id": dataset_id,
        "manifest": f"{dataset_id}/{MANIFEST_KEY}",
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    root_store.put_bytes(join_key("datasets", name, LATEST_KEY), json.dumps(pointer, indent=1).encode())


# ---------------------------------------------------------------- load


def _as_uri(uri: str | Path) -> str:
    text = str(uri)
    if "://" not in text:
        text = "file://" + str(Path(text).expanduser().resolve())
    text = text.rstrip("/")
    # FileStore creates its root folder; a reader must not create folders for a mistyped path.
    if text.startswith("file://") and not Path(text[len("file://") :]).exists():
        raise FileNotFoundError(
            f"no dataset at {text}: give a manifest.json, a dataset folder or <store>/datasets/<name> "
            "(`pileworks build` prints the manifest URI it publishes)"
        )
    return text


def _parent(uri: str) -> str:
    head, _, _ = uri.rpartition("/")
    return head


def _follow_latest(name_uri: str, s3: S3Options | None) -> tuple[Manifest, ObjectStore]:
    pointer = json.loads(open_store(name_uri, s3=s3).get_bytes(LATEST_KEY))
    dataset_id = pointer.get("dataset_id") if isinstance(pointer, dict) else None
    if not dataset_id:
        raise ValueError(f"{name_uri}/{LATEST_KEY} has no dataset_id: {pointer!r}")
    return _read_dataset(f"{name_uri}/{dataset_id}", s3)


def _read_dataset(dataset_uri: str, s3: S3Options | None) -> tuple[Manifest, ObjectStore]:
    store = open_store(dataset_uri, s3=s3)
    try:
        data = json.loads(store.get_bytes(MANIFEST_KEY))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{dataset_uri}/{MANIFEST_KEY} is not valid JSON: {exc}") from exc
    return Manifest.from_json(data), store


def load_manifest(uri: str | Path, s3: S3Options | None) -> tuple[Manifest, ObjectStore]:
    """Load and validate a manifest; returns it with a store rooted at the dataset prefix.

    ``uri`` may name ``manifest.json``, a dataset folder, ``latest.json``, or a dataset-name folder (whose
    ``latest.json`` is followed); local paths, ``file://`` and ``s3://`` all work.
    """
    uri = _as_uri(uri)
    if uri.endswith("/" + MANIFEST_KEY):
        return _read_dataset(_parent(uri), s3)
    if uri.endswith("/" + LATEST_KEY):
        return _follow_latest(_parent(uri), s3)
    store = open_store(uri, s3=s3)
    if store.exists(MANIFEST_KEY):
        return _read_dataset(uri, s3)
    if store.exists(LATEST_KEY):
        return _follow_latest(uri, s3)
    raise FileNotFoundError(
        f"no dataset at {uri} (neither {MANIFEST_KEY} nor {LATEST_KEY} there): give a manifest.json, a dataset "
        "folder or <store>/datasets/<name> (`pileworks build` prints the manifest URI it publishes)"
    )
