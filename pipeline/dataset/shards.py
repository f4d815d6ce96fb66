"""Balanced GPT-NeoX/Megatron token shards: planning, the MMIDIDX index, a streaming writer and a reader.

Layout (what GPT-NeoX and Megatron read unchanged): ``shard-NNNNN.bin`` holds little-endian token ids;
``shard-NNNNN.idx`` is the ``MMIDIDX`` index::

    magic b"MMIDIDX\\x00\\x00" | <Q version=1 | <B dtype code | <Q sequence count | <Q doc_idx length
    | int32 sizes[sequences] | int64 byte pointers[sequences] | int64 doc_idx[doc_idx length]

``doc_idx`` lists the sequence index at which each document starts, plus a final entry equal to the
sequence count (Megatron's convention), so its length is documents + 1. Every piece of a document is its own
sequence *and* its own Megatron document: a document split at a shard boundary becomes two sequences in two
shards, and ``shard-NNNNN.docs.parquet`` records which document each piece belongs to.

Shards of a split are *balanced*: :func:`plan_shards` gives sizes that differ by at most one token, and the
:class:`ShardWriter` fills shard k with exactly ``sizes[k]`` tokens.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from numpy.typing import DTypeLike

from pipeline.records import QUALITY_SCORE, quality_score, web_fields
from pipeline.storage import sha256_file

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron's dtype codes; GPT-NeoX/Megatron readers know no uint32, hence int32 for large vocabularies.
DTYPE_CODES: dict[str, int] = {
    "uint8": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "float64": 6,
    "float32": 7,
    "uint16": 8,
}
CODE_DTYPES = {code: name for name, code in DTYPE_CODES.items()}
# Megatron's best_fitting_dtype uses uint16 only below 65500; we follow it so its tooling agrees with us.
UINT16_VOCAB_LIMIT = 65500
DOCS_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("location", pa.string(), nullable=False),
        pa.field("token_start", pa.int64(), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("piece", pa.int32(), nullable=False),
        # Provenance (pipeline.sources): the source name, the language, and the document's meta JSON
        # (our provenance fields beside the user's own meta, under "user").
        pa.field("source_name", pa.string(), nullable=False),
        pa.field("language", pa.string(), nullable=False),
        pa.field("meta", pa.string(), nullable=False),
        # A web document's URL and crawl date ("" for others), from its meta: group by domain without parsing
        pa.field("url", pa.string(), nullable=False),
        pa.field("warc_date", pa.string(), nullable=False),
    ]
)
WEB_COLUMNS = ("url", "warc_date")
# A build with a quality classifier adds each document's score (clean.classifier), after the columns above;
# the shards of other builds keep the schema above, byte for byte.
SCORE_FIELD = pa.field(QUALITY_SCORE, pa.float64(), nullable=True)
PROVENANCE_COLUMNS = ("source_name", "language", "meta")
SPLITS = ("train", "valid")


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 (code 8) when every id fits Megatron's rule (vocab < 65500), else int32 (code 4); never uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be > 0, got {vocab_size}")
    if vocab_size >= 2**31:
        raise ValueError(f"vocab_size {vocab_size} does not fit int32 token ids")
    return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)


def dtype_code(dtype: DTypeLike) -> int:
    name = np.dtype(dtype).name
    if name not in DTYPE_CODES:
        raise ValueError(f"dtype {name} has no MMIDIDX code (known: {sorted(DTYPE_CODES)})")
    return DTYPE_CODES[name]


def plan_shards(total_tokens: int, target_tokens: int) -> list[int]:
    """Sizes of ``ceil(total/target)`` shards that sum to ``total`` and differ by at most one token.

    The first ``total % count`` shards get the extra token, so the plan is a pure function of its inputs.
    """
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")
    if target_tokens <= 0:
        raise ValueError(f"target_tokens must be > 0, got {target_tokens}")
    if total_tokens == 0:
        return []
    count = math.ceil(total_tokens / target_tokens)
    base, extra = divmod(total_tokens, count)
    return [base + 1] * extra + [base] * (count - extra)


def split_of(doc_id: str, valid_fraction: float, seed: int = 0) -> str:
    """``"valid"`` for a deterministic ``valid_fraction`` of documents (by id hash), else ``"train"``."""
    if valid_fraction <= 0.0:
        return "train"
    bucket = xxhash.xxh64_intdigest(doc_id.encode("utf-8", "surrogatepass"), seed=seed) % 1_000_000
    return "valid" if bucket < round(valid_fraction * 1_000_000) else "train"


# ---------------------------------------------------------------- the index


def write_idx(
    path_or_file: str | Path | BinaryIO,
    sizes: Sequence[int] | np.ndarray,
    dtype: DTypeLike,
    doc_idx: Sequence[int] | np.ndarray | None = None,
) -> None:
    """Write an MMIDIDX index for sequences of ``sizes`` tokens; by default each sequence is one document."""
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    if sizes_arr.ndim != 1 or (sizes_arr < 0).any() or (sizes_arr > np.iinfo(np.int32).max).any():
        raise ValueError("sizes must be a 1-d sequence of non-negative int32 values")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(sizes_arr), dtype=np.int64)
    if len(sizes_arr) > 1:
        np.cumsum(sizes_arr[:-1] * itemsize, out=pointers[1:])
    docs = np.arange(len(sizes_arr) + 1, dtype=np.int64) if doc_idx is None else np.asarray(doc_idx, np.int64)
    header = MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", dtype_code(dtype))
    header += struct.pack("<Q", len(sizes_arr)) + struct.pack("<Q", len(docs))
    payload = header + sizes_arr.astype("<i4").tobytes() + pointers.astype("<i8").tobytes()
    payload += docs.astype("<i8").tobytes()
    if isinstance(path_or_file, (str, Path)):
        Path(path_or_file).write_bytes(payload)
    else:
        path_or_file.write(payload)


@dataclass(frozen=True)
class IdxIndex:
    dtype: np.dtype
    sizes: np.ndarray  # int32, one per sequence
    pointers: np.ndarray  # int64 byte offsets into the .bin
    doc_idx: np.ndarray  # int64, documents + 1 entries


def read_idx(data: bytes) -> IdxIndex:
    """Parse an MMIDIDX index; ValueError names what is wrong with a corrupt or foreign file."""
    head = len(MAGIC) + 8 + 1 + 8 + 8
    if len(data) < head or data[: len(MAGIC)] != MAGIC:
        raise ValueError("not an MMIDIDX index (bad magic)")
    (version,) = struct.unpack_from("<Q", data, len(MAGIC))
    if version != VERSION:
        raise ValueError(f"MMIDIDX version {version} is not supported (expected {VERSION})")
    (code,) = struct.unpack_from("<B", data, len(MAGIC) + 8)
    if code not in CODE_DTYPES:
        raise ValueError(f"MMIDIDX dtype code {code} is unknown")
    n_seq, n_doc = struct.unpack_from("<QQ", data, len(MAGIC) + 9)
    expected = head + n_seq * 4 + n_seq * 8 + n_doc * 8
    if len(data) != expected:
        raise ValueError(f"MMIDIDX index is {len(data)} bytes, header implies {expected}")
    sizes = np.frombuffer(data, dtype="<i4", count=n_seq, offset=head)
    pointers = np.frombuffer(data, dtype="<i8", count=n_seq, offset=head + n_seq * 4)
    doc_idx = np.frombuffer(data, dtype="<i8", count=n_doc, offset=head + n_seq * 12)
    return IdxIndex(np.dtype(CODE_DTYPES[code]).newbyteorder("<"), sizes, pointers, doc_idx)


class IndexedShard:
    """A memory-mapped shard: ``shard[i]`` is sequence i; ``tokens`` is the whole flat token array."""

    def __init__(self, bin_path: str | Path, idx_path: str | Path | None = None):
        bin_path = Path(bin_path)
        idx_path = Path(idx_path) if idx_path is not None else bin_path.with_suffix(".idx")
        index = read_idx(idx_path.read_bytes())
        self.dtype, self.sizes, self.pointers, self.doc_idx = (
            index.dtype,
            index.sizes,
            index.pointers,
            index.doc_idx,
        )
        nbytes = bin_path.stat().st_size
        expected = int(self.sizes.sum(dtype=np.int64)) * self.dtype.itemsize
        if nbytes != expected:
            raise ValueError(f"{bin_path}: {nbytes} bytes but the index describes {expected}")
        # np.memmap refuses empty files; an empty shard is a valid (if useless) shard.
        self.tokens = (
            np.memmap(bin_path, dtype=self.dtype, mode="r") if nbytes else np.zeros(0, dtype=self.dtype)
        )

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sizes[i])]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


# ---------------------------------------------------------------- the writer


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard as the writer made it and the manifest lists it; keys are relative to the dataset prefix.

    The one record of a shard: the writer returns it, a build's window units keep it as JSON in their stats,
    and ``pipeline.dataset.manifest`` publishes it (its field order is the order of a shard's keys in
    ``manifest.json``, so it is kept as published).
    """

    split: str
    index: int
    key: str
    idx_key: str
    docs_key: str
    tokens: int
    docs: int  # documents that *start* in this shard (so a split's docs add up exactly)
    bytes: int
    sha256: str
    idx_bytes: int
    idx_sha256: str
    docs_sha256: str
    token_offset: int
    # Added after the first datasets were published, so manifests without them still load (as 0).
    sequences: int = 0  # pieces in the index (docs + continuations)
    docs_bytes: int = 0

    def objects(self) -> list[tuple[str, str, int]]:
        """The shard's three files as ``(key, sha256, bytes)``: the tokens, the index, the documents."""
        return [
            (self.key, self.sha256, self.bytes),
            (self.idx_key, self.idx_sha256, self.idx_bytes),
            (self.docs_key, self.docs_sha256, self.docs_bytes),
        ]


def shard_keys(split: str, index: int) -> tuple[str, str, str]:
    stem = f"{split}/shard-{index:05d}"
    return f"{stem}.bin", f"{stem}.idx", f"{stem}.docs.parquet"


@dataclass
class _OpenShard:
    index: int
    capacity: int
    file: BinaryIO
    sizes: list[int] = field(default_factory=list)
    rows: dict[str, list] = field(default_factory=lambda: {n: [] for n in DOCS_SCHEMA.names})
    filled: int = 0


class ShardWriter:
    """Stream documents of one split into shards of exactly the planned sizes under ``out_dir/<split>/``.

    ``add`` takes a document's token array (ending in EOS); a document that crosses a shard boundary is split,
    each piece a sequence of its own. ``close`` checks every planned token was written and returns the shards.
    """

    def __init__(
        self,
        out_dir: str | Path,
        split: str,
        sizes: Sequence[int],
        dtype: DTypeLike,
        first_index: int = 0,
        token_offset: int = 0,
    ):
        """``sizes``: the planned sizes of the shards this writer fills, which are shards ``first_index``,
        ``first_index + 1``, ... of the split, starting at ``token_offset`` in the split's token stream (a
        writer of a window of the split's shards; the defaults: all of them)."""
        if any(s <= 0 for s in sizes):
            raise ValueError(f"planned shard sizes must be > 0, got {list(sizes)[:10]}")
        self.out_dir, self.split, self.sizes = Path(out_dir), split, list(sizes)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self._limit = np.iinfo(self.dtype).max
        self._current: _OpenShard | None = None
        self._first_index = first_index
        self._next_index = 0
        self._offset = token_offset
        self._carry_piece = 0
        self._continues: int | None = None
        self.done: list[ShardInfo] = []

    def continue_document(self, piece: int) -> None:
        """The next document added is piece ``piece`` of a document that earlier shards hold the start of
        (a window writer whose first shard starts inside a document)."""
        self._continues = piece

    def add(
        self,
        doc_id: str,
        source: str,
        location: str,
        tokens: np.ndarray,
        provenance: tuple[str, str, str] = ("default", "", "{}"),
    ) -> None:
        tokens = np.asarray(tokens)
        columns = {name: [value] for name, value in zip(PROVENANCE_COLUMNS, provenance, strict=True)}
        self.add_batch([doc_id], [source], [location], np.array([0, len(tokens)]), tokens, columns)

    def add_batch(
        self,
        doc_ids: Sequence[str],
        sources: Sequence[str],
        locations: Sequence[str],
        offsets: np.ndarray,
        flat: np.ndarray,
        provenance: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Add documents in order: document j is ``flat[offsets[j]:offsets[j+1]]`` (``offsets[0] == 0``).

        ``provenance`` holds the PROVENANCE_COLUMNS per document (defaults: source ``default``, no language,
        meta ``{}``). Works per shard segment, not per document, so millions of small documents stay cheap.
        """
        n = len(doc_ids)
        prov = provenance or {}
        prov = {
            "source_name": prov.get("source_name", ["default"] * n),
            "language": prov.get("language", [""] * n),
            "meta": prov.get("meta", ["{}"] * n),
        }
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if (lengths <= 0).any():
            bad = doc_ids[int(np.flatnonzero(lengths <= 0)[0])]
            raise ValueError(f"document {bad!r} has no tokens (every document ends with EOS)")
        if len(flat) and (int(flat.max()) > self._limit or int(flat.min()) < 0):
            raise ValueError(
                f"documents {doc_ids[0]!r}..{doc_ids[-1]!r} have token ids outside {self.dtype.name}"
            )
        pos, total = 0, int(offsets[-1])
        while pos < total:
            first = int(np.searchsorted(offsets, pos, side="right")) - 1  # the document holding token `pos`
            shard = self._current or self._open_next(doc_ids[first])
            end = min(pos + shard.capacity - shard.filled, total)
            last = int(np.searchsorted(offsets, end, side="left"))  # documents starting before `end`
            shard.file.write(flat[pos:end].astype(self.dtype, copy=False).tobytes())
            starts = np.maximum(offsets[first:last], pos)
            sizes = np.minimum(offsets[first + 1 : last + 1], end) - starts
            pieces = np.zeros(last - first, dtype=np.int64)
            if offsets[first] < pos:  # continues a document split at the previous shard boundary
                pieces[0] = self._carry_piece + 1
            elif self._continues is not None and pos == 0:  # ... or at the boundary before this window
                pieces[0] = self._continues
            self._continues = None
            self._carry_piece = int(pieces[-1])
            for name, values in (
                ("doc_id", doc_ids[first:last]),
                ("source", sources[first:last]),
                ("location", locations[first:last]),
                ("token_start", (starts - pos + shard.filled).tolist()),
                ("tokens", sizes.tolist()),
                ("piece", pieces.tolist()),
                *((name, prov[name][first:last]) for name in PROVENANCE_COLUMNS),
            ):
                shard.rows[name].extend(values)
            web = [web_fields(meta) for meta in prov["meta"][first:last]]
            shard.rows["url"].extend(w[0] for w in web)
            shard.rows["warc_date"].extend(w[1] for w in web)
            scores = [quality_score(meta) for meta in prov["meta"][first:last]]
            if QUALITY_SCORE in shard.rows or any(s is not None for s in scores):
                before = len(shard.rows["doc_id"]) - len(scores)
                shard.rows.setdefault(QUALITY_SCORE, [None] * before).extend(scores)
            shard.sizes.extend(sizes.tolist())
            shard.filled += end - pos
            pos = end
            if shard.filled == shard.capacity:
                self._finish(shard)

    def _open_next(self, doc_id: str) -> _OpenShard:
        if self._next_index >= len(self.sizes):
            raise ValueError(
                f"{self.split}: document {doc_id!r} exceeds the planned {sum(self.sizes)} tokens"
            )
        local = self._next_index
        self._next_index += 1
        index = self._first_index + local
        bin_key = shard_keys(self.split, index)[0]
        (self.out_dir / bin_key).parent.mkdir(parents=True, exist_ok=True)
        self._current = _OpenShard(index, self.sizes[local], open(self.out_dir / bin_key, "wb"))  # noqa: SIM115 (closed in _finish)
        return self._current

    def _finish(self, shard: _OpenShard) -> None:
        shard.file.close()
        self._current = None
        key, idx_key, docs_key = shard_keys(self.split, shard.index)
        write_idx(self.out_dir / idx_key, shard.sizes, self.dtype)
        schema = DOCS_SCHEMA.append(SCORE_FIELD) if QUALITY_SCORE in shard.rows else DOCS_SCHEMA
        pq.write_table(pa.table(shard.rows, schema=schema), self.out_dir / docs_key, compression="zstd")
        paths = [self.out_dir / k for k in (key, idx_key, docs_key)]
        sizes = [os.path.getsize(p) for p in paths]
        hashes = [sha256_file(p) for p in paths]
        starts = sum(1 for p in shard.rows["piece"] if p == 0)
        self.done.append(
            ShardInfo(
                split=self.split,
                index=shard.index,
                key=key,
                idx_key=idx_key,
                docs_key=docs_key,
                tokens=shard.filled,
                docs=starts,
                sequences=len(shard.sizes),
                bytes=sizes[0],
                sha256=hashes[0],
                idx_bytes=sizes[1],
                idx_sha256=hashes[1],
                docs_bytes=sizes[2],
                docs_sha256=hashes[2],
                token_offset=self._offset,
            )
        )
        self._offset += shard.filled

    def close(self) -> list[ShardInfo]:
        if self._current is not None or len(self.done) != len(self.sizes):
            written = sum(d.tokens for d in self.done) + (self._current.filled if self._current else 0)
            if self._current is not None:
                self._current.file.close()
            raise ValueError(
                f"{self.split}: wrote {written} tokens but planned {sum(self.sizes)}; "
                "the token counts changed between planning and writing"
            )
        return list(self.done)


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """How token parts become shards: the target shard size and the train/valid split."""

    target_bytes: int = 64 * 1024 * 1024
    valid_fraction: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.target_bytes < 2:
            raise ValueError(f"shard.target_bytes must be >= 2 (one uint16 token), got {self.target_bytes}")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"shard.valid_fraction must be in [0, 1), got {self.valid_fraction}")

    def target_tokens(self, dtype: DTypeLike) -> int:
        return max(1, self.target_bytes // np.dtype(dtype).itemsize)
