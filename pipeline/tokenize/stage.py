"""The tokenize stage: train (or load) a byte-level BPE tokenizer and turn docs parts into token parts.

Every document is encoded as *ordinary text* (a literal ``<|endoftext|>`` inside a document stays text, so a
document cannot forge a control token) and gets the EOS id appended. Encoding runs on all cores: tiktoken's
``encode_ordinary_batch`` (the fast path, built from the trained tokenizer's own vocab and merges in
``pipeline.tokenize.fast_bpe``) after checking on a sample that it gives the same ids as ``tokenizers``; otherwise
``tokenizers``' multi-threaded ``encode_batch``. A token part is ``part-NNNNN.parquet`` with columns
``id, source, location, tokens: large_list<uint32>``, then its stats, then ``.done`` (the records contract).
Token parts become shards and a published dataset in ``pipeline.dataset.publish``.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.records import Record, iter_part_batches
from pipeline.sources import provenance
from pipeline.storage import ObjectStore, open_store, sha256_bytes, split_uri
from pipeline.storage.options import S3Options
from pipeline.tokenize.bpe_train import count_words, merge_counts, safe_texts, train_from_counts
from pipeline.tokenize.fast_bpe import UnsupportedTokenizer, tiktoken_from_tokenizer, verify_same_ids
from pipeline.tokenize.word_counts import sample_counts
from pipeline.units.protocol import (
    StageStats,
    done_part_stats,
    finish_unit,
    part_unit,
    read_part_stats,
)

log = logging.getLogger(__name__)

TOKENS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("location", pa.string(), nullable=False),
        pa.field("tokens", pa.large_list(pa.field("item", pa.uint32(), nullable=False)), nullable=False),
        pa.field("source_name", pa.string(), nullable=False),
        pa.field("language", pa.string(), nullable=False),
        pa.field("meta", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    """``tokenizer``: path/URI of a tokenizer.json to use, or None to train a byte-level BPE on the corpus."""

    tokenizer: str | None = None
    # How a tokenizer trains: "counts" (each sample part's words counted where the part is, the merges learnt
    # from the merged counts in our compiled kernel: pipeline/tokenize/bpe_train.py) or "hf" (tokenizers'
    # BpeTrainer over the sample's text, in a process of its own). Both give a byte-level BPE of the same
    # sample; on our corpora the same tokenizer.json, byte for byte (ties fall alike), but nothing guarantees it.
    trainer: Literal["counts", "hf"] = "counts"
    vocab_size: int = 8192
    min_frequency: int = 2
    special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|pad|>")
    eos_token: str = "<|endoftext|>"
    pad_token: str | None = "<|pad|>"
    # Literal special-token text in a document ("<|endoftext|>" typed in a web page): "text" encodes it as
    # ordinary text (a document can never forge an EOS or PAD; Hugging Face's tokenizer, by default, would give
    # the special id there), "special" encodes it as the special token's id (as Hugging Face does).
    special_text: Literal["text", "special"] = "text"
    train_sample_bytes: int = 256 * 1024 * 1024
    batch_size: int = 1024
    fast_path: bool = True
    verify_docs: int = 512
    verify_bytes: int = 256 * 1024  # per part, checked against tokenizers (10x slower): keep it a small share
    num_threads: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(self.special_tokens) + 1:
            raise ValueError(
                f"tokenize.vocab_size must be > 256 bytes + {len(self.special_tokens)} special "
                f"tokens, got {self.vocab_size}"
            )
        if self.min_frequency < 1:
            raise ValueError(f"tokenize.min_frequency must be >= 1, got {self.min_frequency}")
        if self.eos_token not in self.special_tokens:
            raise ValueError(f"tokenize.eos_token {self.eos_token!r} must be one of special_tokens")
        if self.pad_token is not None and self.pad_token not in self.special_tokens:
            raise ValueError(f"tokenize.pad_token {self.pad_token!r} must be one of special_tokens or null")
        if self.trainer not in ("counts", "hf"):
            raise ValueError(f"tokenize.trainer must be 'counts' or 'hf', got {self.trainer!r}")
        if self.special_text not in ("text", "special"):
            raise ValueError(f"tokenize.special_text must be 'text' or 'special', got {self.special_text!r}")
        if self.train_sample_bytes < 1 or self.batch_size < 1:
            raise ValueError("tokenize.train_sample_bytes and tokenize.batch_size must be >= 1")
        if self.verify_docs < 0 or self.verify_bytes < 0 or self.num_threads < 0:
            raise ValueError("tokenize.verify_docs, verify_bytes and num_threads must be >= 0")


# ---------------------------------------------------------------- the tokenizer


def _capped(texts: Iterable[str], cap_bytes: int) -> Iterator[str]:
    seen = 0
    for text in texts:
        if seen >= cap_bytes:
            return
        seen += len(text.encode("utf-8", "replace"))
        yield text


def train_tokenizer(texts: Iterable[str], cfg: TokenizeConfig) -> Tokenizer:
    """Byte-level BPE over the first ``train_sample_bytes`` of ``texts`` by ``cfg.trainer``; same input order
    -> same tokenizer."""
    capped = _capped(texts, cfg.train_sample_bytes)
    if cfg.trainer == "counts":
        batches = iter(lambda: list(itertools.islice(capped, cfg.batch_size)), [])
        counts = merge_counts(count_words(safe_texts(batch)) for batch in batches)
        return train_from_counts(counts, cfg.vocab_size, cfg.min_frequency, cfg.special_tokens)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(cfg.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(capped, trainer=trainer)
    return tok


def load_tokenizer(uri: str | Path, s3: S3Options | None) -> Tokenizer:
    """A tokenizer.json from a local path or a store URI (``file://``, ``s3://``, ``gs://``, ``az://``)."""
    text = str(uri)
    if "://" not in text:
        return Tokenizer.from_file(str(Path(text).expanduser()))
    root, key = split_uri(text)
    return Tokenizer.from_str(open_store(root, s3=s3).get_bytes(key).decode("utf-8"))


def special_id(tok: Tokenizer, token: str) -> int:
    tid = tok.token_to_id(token)
    if tid is None:
        raise ValueError(f"tokenizer has no token {token!r}")
    return tid


def sample_parts(part_bytes: Sequence[int], sample_bytes: int) -> list[int]:
    """The parts a tokenizer trains on: all of them, in order, when they hold at most ``sample_bytes``;
    otherwise evenly spaced parts across the whole corpus, enough to hold about ``sample_bytes`` (a
    deterministic systematic sample, so the tokenizer sees the end of the corpus as much as its start and the
    training time does not grow with the corpus)."""
    n, total = len(part_bytes), sum(part_bytes)
    if total <= sample_bytes or n == 0:
        return list(range(n))
    wanted = min(n, max(1, -(-n * sample_bytes // total)) + 1)  # one spare: parts differ in size
    return sorted({(2 * j + 1) * n // (2 * wanted) for j in range(wanted)})


def sample_budgets(part_bytes: Sequence[int], sample_bytes: int) -> dict[int, int]:
    """Each :func:`sample_parts` part's budget: the sample's bytes left after the sample's parts before it (by
    ``part_bytes``), for the parts that get any. A part's documents are read while the bytes read so far are
    below its budget, so the parts together read what :func:`_capped` reads of them in order."""
    budgets, before = {}, 0
    for index in sample_parts(part_bytes, sample_bytes):
        if before >= sample_bytes:
            break
        budgets[index] = sample_bytes - before
        before += part_bytes[index]
    return budgets


def sample_record_key(out_key: str) -> str:
    """Where :func:`run_train_tokenizer` records the sample it trained on (``<out_key>.sample.json``)."""
    return f"{out_key}.sample.json"


def run_train_tokenizer(
    store: ObjectStore,
    in_folder: str,
    num_parts: int,
    out_key: str,
    cfg: TokenizeConfig,
    s3: S3Options | None,
    sizes: list[int] | None = None,
    counts_folder: str | None = None,
) -> str:
    """Global step: put the tokenizer at ``out_key`` (trained on :func:`sample_parts` of the corpus, or copied
    from ``cfg.tokenizer``) and return its sha256; the sample (parts, bytes, documents) is recorded at
    :func:`sample_record_key`. Skips training when ``out_key`` already exists. ``sizes``: every part's bytes
    when the caller has them (a build's flow, from its units' stats), else each part's stats are read (one call
    per part on S3). ``counts_folder``: where the ``counts`` trainer finds the sample parts' word-count units
    (:mod:`pipeline.tokenize.word_counts`); a part without one is counted here."""
    if store.exists(out_key):
        return sha256_bytes(store.get_bytes(out_key))
    if cfg.tokenizer is not None:
        tok = load_tokenizer(cfg.tokenizer, s3=s3)
        record: dict[str, object] = {"source": cfg.tokenizer}
    else:
        if sizes is None or len(sizes) != num_parts:
            sizes = store.map(lambda i: read_part_stats(store, in_folder, i).bytes_out, range(num_parts))
        parts = sample_parts(sizes, cfg.train_sample_bytes)
        if cfg.trainer == "counts":
            counts, stats = sample_counts(
                store, in_folder, counts_folder, sample_budgets(sizes, cfg.train_sample_bytes)
            )
            tok = train_from_counts(counts, cfg.vocab_size, cfg.min_frequency, cfg.special_tokens)
            seen = {"docs": stats.docs_in, "bytes": stats.bytes_in}
        else:
            tok, seen = _train_on_text(store, in_folder, parts, cfg)
        record = {
            "source": "trained",
            "corpus_parts": num_parts,
            "corpus_bytes": sum(sizes),
            "sample_bytes_limit": cfg.train_sample_bytes,
            "sample_parts": parts,
            "sample_docs": seen["docs"],
            "sample_bytes": seen["bytes"],
            "trainer": cfg.trainer,
        }
    data = tok.to_str().encode("utf-8")
    store.put_bytes(sample_record_key(out_key), json.dumps(record, indent=1).encode())
    store.put_bytes(out_key, data)
    return sha256_bytes(data)


def _train_on_text(
    store: ObjectStore, in_folder: str, parts: list[int], cfg: TokenizeConfig
) -> tuple[Tokenizer, dict[str, int]]:
    """The ``hf`` trainer over the first ``train_sample_bytes`` of ``parts``' documents; the documents and bytes
    it read."""
    seen = {"docs": 0, "bytes": 0}

    def texts() -> Iterator[str]:
        every = (r.text for i in parts for batch in iter_part_batches(store, in_folder, i) for r in batch)
        for text in _capped(every, cfg.train_sample_bytes):
            seen["docs"] += 1
            seen["bytes"] += len(text.encode("utf-8", "replace"))
            yield text

    return train_tokenizer(texts(), cfg), seen


# ---------------------------------------------------------------- encoding


def _ordinary(tok: Tokenizer) -> Tokenizer:
    """The same model without added-token matching, so literal special-token text encodes as plain text."""
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(spec))


THREADS_ENV = "PILEWORKS_THREADS"  # threads per process for encoding; set to 1 in each build worker process


def encoder_threads(cfg: TokenizeConfig) -> int:
    """``tokenize.num_threads``, else ``$PILEWORKS_THREADS`` (a build's worker processes run with 1: N workers
    use N cores), else every core."""
    return cfg.num_threads or int(os.environ.get(THREADS_ENV) or 0) or os.cpu_count() or 1


class Encoder:
    """Encodes batches of documents to uint32 arrays ending in EOS, with the fastest encoder that agrees."""

    def __init__(self, tok: Tokenizer, cfg: TokenizeConfig, sample: Sequence[str] = ()):
        self.eos_id = special_id(tok, cfg.eos_token)
        self.special = cfg.special_text == "special"
        self.reference = tok if self.special else _ordinary(tok)
        self.fast = None
        self.name = "tokenizers"
        self.num_threads = encoder_threads(cfg)
        if cfg.fast_path:
            sample = list(_capped(sample[: cfg.verify_docs], cfg.verify_bytes))
            self.fast, reason = self._build_fast(tok, safe_texts(sample))
            if self.fast is None:
                log.warning("tiktoken fast path disabled, using tokenizers: %s", reason)
            else:
                self.name = "tiktoken"

    def _build_fast(self, tok: Tokenizer, sample: list[str]):
        try:
            enc = tiktoken_from_tokenizer(tok)
        except UnsupportedTokenizer as exc:
            return None, str(exc)
        mismatch = verify_same_ids(self.reference, enc, sample, allow_special=self.special)
        return (None, f"ids differ from tokenizers on the sample: {mismatch}") if mismatch else (enc, None)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = safe_texts(texts)
        if self.fast is not None and self.special:
            ids = self.fast.encode_batch(texts, num_threads=self.num_threads, allowed_special="all")
        elif self.fast is not None:
            ids = self.fast.encode_ordinary_batch(texts, num_threads=self.num_threads)
        else:
            ids = [e.ids for e in self.reference.encode_batch(texts, add_special_tokens=False)]
        out = []
        for seq in ids:
            arr = np.empty(len(seq) + 1, dtype=np.uint32)
            arr[:-1] = seq
            arr[-1] = self.eos_id
            out.append(arr)
        return out


# Built and verified once per process and tokenizer (by sha256), not once per part: building tiktoken's ranks
# from the vocab and checking them against ``tokenizers`` on a sample costs more than encoding a 4 MiB part.
_ENCODERS: OrderedDict[tuple[object, ...], Encoder] = OrderedDict()
_ENCODERS_KEPT = 2


def _encoder_key(tok_bytes: bytes, cfg: TokenizeConfig) -> tuple[object, ...]:
    return (
        sha256_bytes(tok_bytes),
        cfg.eos_token,
        cfg.fast_path,
        cfg.verify_docs,
        cfg.verify_bytes,
        encoder_threads(cfg),
    )


def known_encoder(tok_bytes: bytes, cfg: TokenizeConfig) -> Encoder | None:
    """This process's encoder for the tokenizer ``tok_bytes`` and ``cfg``, if one was built already."""
    return _ENCODERS.get(_encoder_key(tok_bytes, cfg))


def cached_encoder(tok_bytes: bytes, cfg: TokenizeConfig, sample: Sequence[str]) -> Encoder:
    """This process's encoder for the tokenizer ``tok_bytes`` and ``cfg``; built (and verified on ``sample``)
    on first use, then kept for the next parts."""
    key = _encoder_key(tok_bytes, cfg)
    encoder = _ENCODERS.get(key)
    if encoder is None:
        encoder = Encoder(Tokenizer.from_str(tok_bytes.decode("utf-8")), cfg, sample=sample)
        _ENCODERS[key] = encoder
        while len(_ENCODERS) > _ENCODERS_KEPT:
            _ENCODERS.popitem(last=False)
    _ENCODERS.move_to_end(key)
    return encoder


def _location(record: Record) -> str:
    """Where in its raw object the document starts, from our provenance fields (the user's own meta lives
    under ``user``, so a user key named ``location`` cannot stand in for them)."""
    meta = record.meta_dict()
    for key in ("location", "offset", "line"):
        if key in meta:
            return str(meta[key])
    return ""


def tokens_table(records: Sequence[Record], arrays: Sequence[np.ndarray]) -> pa.Table:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
    tokens = pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(flat, type=pa.uint32()), type=TOKENS_SCHEMA.field("tokens").type
    )
    prov = [provenance(r.meta) for r in records]
    return pa.table(
        {
            "id": [r.id for r in records],
            "source": [r.source for r in records],
            "location": [_location(r) for r in records],
            "tokens": tokens,
            "source_name": [p[0] for p in prov],
            "language": [p[2] for p in prov],
            "meta": [r.meta or "{}" for r in records],
        },
        schema=TOKENS_SCHEMA,
    )


def write_token_part(
    store: ObjectStore, folder: str, index: int, tables: list[pa.Table], stats: StageStats
) -> None:
    """The part contract for token parts: parquet (TOKENS_SCHEMA), then stats, then the ``.done`` marker."""
    sink = io.BytesIO()
    table = pa.concat_tables(tables) if tables else TOKENS_SCHEMA.empty_table()
    pq.write_table(table, sink, compression="zstd", row_group_size=4096)
    unit = part_unit(folder, index)
    store.put_bytes(f"{unit}.parquet", sink.getvalue())
    finish_unit(store, unit, stats)


def run_tokenize_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, tokenizer_key: str, cfg: TokenizeConfig
) -> StageStats:
    """Tokenize one docs part into a token part (skipped when its ``.done`` marker exists)."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    tok_bytes = store.get_bytes(tokenizer_key)
    stats = StageStats(stage="tokenize", extra={"tokens": 0})
    encoder = known_encoder(tok_bytes, cfg)
    tables = []
    for batch in iter_part_batches(store, in_folder, index, batch_size=cfg.batch_size):
        stats.docs_in += len(batch)
        kept = [r for r in batch if r.text]
        if len(kept) < len(batch):
            stats.drop("empty_text", len(batch) - len(kept))
        if not kept:
            continue
        encoder = encoder or cached_encoder(tok_bytes, cfg, sample=[r.text for r in kept])
        arrays = encoder.encode([r.text for r in kept])
        table = tokens_table(kept, arrays)
        tables.append(table)
        for name, arr in zip(table.column("source_name").to_pylist(), arrays, strict=True):
            stats.extra[f"source_tokens.{name}"] = stats.extra.get(f"source_tokens.{name}", 0) + len(arr)
        stats.docs_out += len(kept)
        stats.bytes_in += sum(len(r.text.encode("utf-8", "replace")) for r in kept)
        n_tokens = sum(len(a) for a in arrays)
        stats.extra["tokens"] += n_tokens
        stats.bytes_out += 4 * n_tokens
    stats.extra["encoder"] = encoder.name if encoder else "none"
    write_token_part(store, out_folder, index, tables, stats)
    return stats
