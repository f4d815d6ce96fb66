"""The ``counts`` trainer (``pipeline/tokenize/bpe_train.py``, ``pipeline/tokenize/_bpe.c``): words counted as the
ByteLevel pre-tokenizer splits them, merges learnt from counts alone (the compiled kernel equal to the Python
reference), the same tokenizer.json as ``tokenizers``' trainer on our corpus, whatever the parts."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from pipeline.records import write_part
from pipeline.storage import FileStore
from pipeline.tokenize import bpe_train
from pipeline.tokenize.fast_bpe import tiktoken_from_tokenizer, unicode_to_byte, verify_same_ids
from pipeline.tokenize.stage import (
    TokenizeConfig,
    _capped,
    run_train_tokenizer,
    sample_budgets,
    train_tokenizer,
)
from pipeline.tokenize.word_counts import run_word_count_part, sample_counts
from pipeline.units.protocol import StageStats
from tests.fixtures.tiny_dataset import make_records
from tests.kernels import needs_bpe, require
from tests.pipeline.tokenize.test_tokenize import TRICKY, sample_texts

EDGES = [
    "'s'S ''s x''s 'll've're 'salt' it's",
    "a  b   c\t\td \n\n e\r\n\r\nf \u00a0g\u2028h\u001fi\u0085j",
    "12一3 ²½ Ⅻ ٣٤ ① 3.5e10 x2 2x",
    "  ",
    "\n",
    " x",
    "x ",
    "'",
]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return (
        [r.text for r in make_records(200, seed=7)] + TRICKY + EDGES + [t[:8000] for t in sample_texts()[::5]]
    )


def _as_dict(table: pa.Table) -> dict[bytes, int]:
    return dict(zip(table.column("word").to_pylist(), table.column("count").to_pylist(), strict=True))


def _hf_words(texts: list[str]) -> Counter[bytes]:
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    to_byte = unicode_to_byte()
    found: Counter[bytes] = Counter()
    for text in texts:
        found.update(bytes(to_byte[c] for c in word) for word, _ in split.pre_tokenize_str(text))
    return found


@needs_bpe
def test_words_are_counted_as_the_byte_level_pre_tokenizer_splits_them(texts: list[str]) -> None:
    require(bpe_train.bpe_kernel, "pipeline.tokenize._bpe")
    native, python = bpe_train.count_words(texts), bpe_train.count_words(texts, native=False)
    assert _as_dict(native) == _as_dict(python) == dict(_hf_words(texts))
    assert native.column("word").to_pylist() == python.column("word").to_pylist()  # both in first-seen order
    for native_path in (True, False):  # callers replace lone surrogates first (safe_texts)
        with pytest.raises(ValueError, match="surrogate"):
            bpe_train.count_words(["a\ud800b"], native=native_path)


def test_merged_counts_do_not_depend_on_how_the_texts_were_cut(texts: list[str]) -> None:
    whole = bpe_train.merge_counts([bpe_train.count_words(texts)])
    rng = random.Random(3)
    shuffled = texts[:]
    rng.shuffle(shuffled)
    pieces = [bpe_train.count_words(shuffled[k : k + 17]) for k in range(0, len(shuffled), 17)]
    assert bpe_train.merge_counts(reversed(pieces)).equals(whole)
    assert whole.column("word").to_pylist() == sorted(whole.column("word").to_pylist())


@needs_bpe
def test_the_kernel_learns_the_merges_of_the_python_reference(texts: list[str]) -> None:
    require(bpe_train.bpe_kernel, "pipeline.tokenize._bpe")
    counts = bpe_train.merge_counts([bpe_train.count_words(texts[::3])])  # the Python reference is slow
    for new_tokens, min_frequency in ((400, 2), (200, 1), (5000, 40)):
        native = bpe_train.learn_merges(counts, new_tokens, min_frequency)
        assert native == bpe_train.learn_merges(counts, new_tokens, min_frequency, native=False)
        assert len({t for _, _, t in native}) <= new_tokens
    # a merge whose bytes a token has already reuses it: "ab" from a+b and, later, none other
    tiny = pa.table({"word": [b"abab", b"aab"], "count": [5, 3]}, schema=bpe_train.COUNTS_SCHEMA)
    assert bpe_train.learn_merges(tiny, 10, 1) == bpe_train.learn_merges(tiny, 10, 1, native=False)


def test_the_counts_trainer_gives_the_hf_trainers_tokenizer_json(texts: list[str]) -> None:
    """Ties between pairs fall as ``tokenizers`` breaks them, so on our corpus the two trainers agree byte for
    byte (the reason a build's dataset ids did not move with the trainer)."""
    for vocab in (400, 2048):
        new = train_tokenizer(texts, TokenizeConfig(vocab_size=vocab))
        old = train_tokenizer(texts, TokenizeConfig(vocab_size=vocab, trainer="hf"))
        assert new.to_str() == old.to_str()


def test_the_trained_tokenizer_loads_round_trips_and_takes_the_fast_path(
    tmp_path: Path, texts: list[str]
) -> None:
    tok = train_tokenizer(texts, TokenizeConfig(vocab_size=1200))
    again = train_tokenizer(texts, TokenizeConfig(vocab_size=1200))
    assert tok.to_str() == again.to_str()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert loaded.token_to_id("<|endoftext|>") == 0 and loaded.token_to_id("<|pad|>") == 1
    assert loaded.get_vocab_size() == 1200
    # no token splits a character in a way decoding cannot join: every text comes back whole
    decoded = [loaded.decode(e.ids, skip_special_tokens=False) for e in loaded.encode_batch(texts)]
    assert decoded == texts
    assert verify_same_ids(loaded, tiktoken_from_tokenizer(loaded), texts, allow_special=True) is None


@pytest.mark.parametrize("cap", [1, 500, 4000, 9000, 10**9])
def test_the_parts_budgets_read_the_hf_trainers_sample(tmp_path: Path, cap: int) -> None:
    store = FileStore(tmp_path / "store")
    parts = [make_records(12, seed=i) for i in range(4)]
    sizes = []
    for i, records in enumerate(parts):
        size = sum(len(r.text.encode()) for r in records)
        sizes.append(size)
        write_part(store, "docs", i, records, StageStats(stage="clean", bytes_out=size))
    budgets = sample_budgets(sizes, cap)
    for index, budget in budgets.items():
        run_word_count_part(store, "docs", "counts", index, budget)
    counted, stats = sample_counts(store, "docs", "counts", budgets)
    here, _ = sample_counts(store, "docs", None, budgets)  # no units: counted in place, the same
    assert counted.equals(here)
    every = [r.text for i in sorted(budgets) for r in parts[i]]
    expected = list(_capped(every, cap))
    assert stats.docs_in == len(expected)
    assert _as_dict(counted) == _as_dict(bpe_train.merge_counts([bpe_train.count_words(expected)]))
    cfg = TokenizeConfig(vocab_size=400, train_sample_bytes=cap)
    run_train_tokenizer(store, "docs", 4, "new.json", cfg, None, sizes, "counts")
    run_train_tokenizer(
        store,
        "docs",
        4,
        "old.json",
        TokenizeConfig(vocab_size=400, train_sample_bytes=cap, trainer="hf"),
        None,
        sizes,
    )
    assert store.get_bytes("new.json") == store.get_bytes("old.json")


def test_trainer_is_validated() -> None:
    with pytest.raises(ValueError, match=r"tokenize\.trainer"):
        TokenizeConfig(trainer="spm")  # type: ignore[arg-type]


@needs_bpe
def test_the_kernel_takes_empty_input_and_refuses_counts_that_do_not_match_the_words() -> None:
    kernel = bpe_train.bpe_kernel
    require(kernel, "pipeline.tokenize._bpe")
    assert kernel is not None
    assert kernel.count_words([]) == (b"", b"", b"") and kernel.count_words([""]) == (b"", b"", b"")
    empty = bpe_train.merge_counts([])
    assert empty.num_rows == 0 and bpe_train.learn_merges(empty, 10, 1) == []
    ends, counts = np.array([2, 3], dtype=np.int64), np.array([1, 1], dtype=np.int64)
    assert (
        kernel.train_merges(b"abc", ends.tobytes(), counts.tobytes(), 5, 1)
        == np.array([97, 98, 256], dtype=np.int32).tobytes()
    )
    with pytest.raises(ValueError, match="match the words"):
        kernel.train_merges(b"abcd", ends.tobytes(), counts.tobytes(), 5, 1)
    with pytest.raises(ValueError, match="match the words"):
        kernel.train_merges(b"abc", ends.tobytes(), counts[:1].tobytes(), 5, 1)
    with pytest.raises(ValueError, match="aligned"):
        kernel.train_merges(b"abc", ends.tobytes()[:-1], counts.tobytes(), 5, 1)
    with pytest.raises(ValueError, match="counts be >= 0"):
        kernel.train_merges(b"abc", ends.tobytes(), np.array([1, -1], dtype=np.int64).tobytes(), 5, 1)
