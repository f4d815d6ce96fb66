"""Tokenizer training/loading, the tiktoken fast path (ids identical to ``tokenizers``) and token parts."""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from pipeline.corpus_config import load_corpus_config
from pipeline.records import Record, write_part
from pipeline.sample_corpus import sample_corpus_path
from pipeline.storage import FileStore, open_store, sha256_bytes, sha256_file
from pipeline.tokenize.fast_bpe import UnsupportedTokenizer, tiktoken_from_tokenizer, verify_same_ids
from pipeline.tokenize.stage import (
    TOKENS_SCHEMA,
    Encoder,
    TokenizeConfig,
    load_tokenizer,
    run_tokenize_part,
    run_train_tokenizer,
    train_tokenizer,
)
from pipeline.units.protocol import StageStats, read_part_stats
from tests.fixtures.tiny_dataset import make_records

TRICKY = [
    "Hello world! It's a test; we'll see what they're doing. I'M HERE, you'd've known.",
    "数据集和模型训练。日本語のテキストです。한국어 문장입니다. 語言模型",
    "emoji 🙂🚀 flags 🇫🇷🇯🇵 skin 👍🏽 zwj 👩‍👩‍👧 hearts ❤️ ❤ ",
    "digits 1234567890 3.14159 1,000,000 -42 ٣٤٥ ⅷ ²³",
    "odd   whitespace\t\ttabs\n\n\nnewlines \r\n crlf \u00a0nbsp \u2003em \u3000ideographic   ",
    "   leading spaces and trailing   ",
    "apostrophes: 's 't 're 've 'm 'll 'd 'S 'LL ’s ``quotes''",
    "combining: e\u0301 a\u0308 n\u0303; zero\u200bwidth; rtl עברית العربية",
    "a literal <|endoftext|> inside a document and <|pad|> too",
    "control \x00 \x07 chars and \ufeff bom",
    "",
    " ",
    "x" * 3000,
    "code: def f(x):\n    return x**2  # comment\n\tif a != b: pass",
]


def sample_texts() -> list[str]:
    texts: list[str] = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        texts += [json.loads(line)["text"] for line in data.splitlines() if line.strip()]
    return texts


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """Mixed text: the generated tiny corpus, the tricky strings and a slice of the real sample corpus."""
    return [r.text for r in make_records(300, seed=3)] + TRICKY + [t[:20000] for t in sample_texts()[::9]]


@pytest.fixture(scope="module")
def tok(corpus: list[str]) -> Tokenizer:
    return train_tokenizer(corpus, TokenizeConfig(vocab_size=2048))


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        TokenizeConfig(vocab_size=100)
    with pytest.raises(ValueError, match="eos_token"):
        TokenizeConfig(eos_token="</s>")
    with pytest.raises(ValueError, match="pad_token"):
        TokenizeConfig(pad_token="<pad>")
    with pytest.raises(ValueError, match="min_frequency"):
        TokenizeConfig(min_frequency=0)


def test_training_is_deterministic_and_specials_come_first(corpus: list[str], tok: Tokenizer) -> None:
    again = train_tokenizer(corpus, TokenizeConfig(vocab_size=2048))
    assert again.to_str() == tok.to_str()
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    assert 300 < tok.get_vocab_size() <= 2048
    capped = train_tokenizer(corpus, TokenizeConfig(vocab_size=2048, train_sample_bytes=2000))
    assert capped.get_vocab_size() < tok.get_vocab_size()


def test_saved_tokenizer_reloads_and_round_trips_text(tmp_path: Path, tok: Tokenizer) -> None:
    tok.save(str(tmp_path / "tokenizer.json"))
    for loaded in (
        Tokenizer.from_file(str(tmp_path / "tokenizer.json")),
        load_tokenizer(tmp_path / "tokenizer.json", None),
        load_tokenizer("file://" + str(tmp_path / "tokenizer.json"), None),
    ):
        assert loaded.to_str() == tok.to_str()
        for text in TRICKY:
            if "<|" in text:
                continue  # added tokens are matched by plain encode(); the pipeline encodes them as text
            assert loaded.decode(loaded.encode(text).ids) == text


def test_a_tokenizer_source_on_each_cloud_store(cloud_bucket, tok: Tokenizer, tmp_path: Path) -> None:
    """``tokenize.tokenizer: gs://...`` (az://, s3://): the build's tokenizer step copies that tokenizer."""
    open_store(cloud_bucket.uri, cloud_bucket.options).put_bytes("tok/tokenizer.json", tok.to_str().encode())
    uri = f"{cloud_bucket.uri}/tok/tokenizer.json"
    cfg = load_corpus_config(None, overrides={"tokenize.tokenizer": uri}).tokenize
    out = FileStore(tmp_path / "store")
    digest = run_train_tokenizer(out, "docs", 0, "tokenizer.json", cfg, s3=cloud_bucket.options)
    assert out.get_bytes("tokenizer.json") == tok.to_str().encode() and digest == sha256_bytes(
        tok.to_str().encode()
    )
    assert json.loads(out.get_bytes("tokenizer.json.sample.json")) == {"source": uri}


def test_fast_path_ids_equal_tokenizers_on_tricky_and_sample_text(tok: Tokenizer, corpus: list[str]) -> None:
    cfg = TokenizeConfig(vocab_size=2048)
    encoder = Encoder(tok, cfg, sample=corpus)
    assert encoder.name == "tiktoken"
    reference = Encoder(tok, TokenizeConfig(vocab_size=2048, fast_path=False))
    assert reference.name == "tokenizers"
    # Every sample document (its first 6 kB, to keep the test fast; the bench checks them whole).
    texts = TRICKY + [t[:6000] for t in sample_texts()]
    fast_ids = encoder.encode(texts)
    ref_ids = reference.encode(texts)
    assert [a.tolist() for a in fast_ids] == [b.tolist() for b in ref_ids]
    assert verify_same_ids(encoder.reference, tiktoken_from_tokenizer(tok), TRICKY) is None


def test_documents_end_with_one_eos_and_literal_specials_stay_text(tok: Tokenizer) -> None:
    for fast in (True, False):
        encoder = Encoder(tok, TokenizeConfig(vocab_size=2048, fast_path=fast), sample=TRICKY)
        for text, ids in zip(TRICKY, encoder.encode(TRICKY), strict=True):
            assert ids[-1] == 0 and 0 not in ids[:-1].tolist() and 1 not in ids.tolist()
            assert tok.decode(ids[:-1].tolist(), skip_special_tokens=False) == text.replace("\x00", "\x00")
    lone = Encoder(tok, TokenizeConfig(vocab_size=2048)).encode(["bad \ud800 surrogate"])[0]
    assert tok.decode(lone[:-1].tolist()) == "bad \ufffd surrogate"


def test_literal_specials_become_special_ids_when_configured(tok: Tokenizer) -> None:
    """special_text="special": the literal text gives the special ids (as Hugging Face's tokenizer does), and
    the tiktoken fast path agrees with tokenizers on it."""
    text = "a literal <|endoftext|> inside a document and <|pad|> too"
    cfg = TokenizeConfig(vocab_size=2048, special_text="special")
    fast = Encoder(tok, cfg, sample=TRICKY)
    assert fast.name == "tiktoken"
    for encoder in (fast, Encoder(tok, dataclasses.replace(cfg, fast_path=False))):
        ids = encoder.encode([text])[0].tolist()
        assert ids.count(0) == 2 and ids.count(1) == 1 and ids[-1] == 0
        assert tok.decode(ids[:-1], skip_special_tokens=False) == text
    as_text = Encoder(tok, TokenizeConfig(vocab_size=2048)).encode([text])[0].tolist()
    assert as_text.count(0) == 1 and 1 not in as_text
    with pytest.raises(ValueError, match=r"tokenize\.special_text"):
        TokenizeConfig(special_text="drop")  # type: ignore[arg-type]


def _byte_tokenizer(merges: list[tuple[str, str]], reverse_merge_ids: bool = False) -> Tokenizer:
    """A hand-built byte-level BPE: specials, the 256 byte symbols, then one token per merge, in order."""
    vocab = {"<|endoftext|>": 0, "<|pad|>": 1}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in reversed(merges) if reverse_merge_ids else merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|endoftext|>", "<|pad|>"])
    return tok


def test_fast_path_falls_back_when_ids_would_differ(caplog: pytest.LogCaptureFixture) -> None:
    # "abc" is a token (from ab+c) but BPE merges b+c first, so tokenizers gives [a, bc]; tiktoken takes the
    # whole word "abc" as one id. The sample check must catch it and fall back.
    tok = _byte_tokenizer([("b", "c"), ("a", "b"), ("ab", "c")])
    assert tok.encode("abc").ids != [tok.token_to_id("abc")]
    with caplog.at_level(logging.WARNING, logger="pipeline.tokenize.stage"):
        encoder = Encoder(tok, TokenizeConfig(vocab_size=512), sample=["xyz abc"])
    assert encoder.name == "tokenizers" and "ids differ" in caplog.text
    assert encoder.encode(["abc"])[0].tolist() == [*tok.encode("abc").ids, 0]
    assert Encoder(tok, TokenizeConfig(vocab_size=512), sample=["xyz"]).name == "tiktoken"


def test_fast_path_refuses_tokenizers_it_cannot_reproduce(tok: Tokenizer, caplog) -> None:
    spec = json.loads(tok.to_str())
    spec["normalizer"] = {"type": "NFKC"}
    normalized = Tokenizer.from_str(json.dumps(spec))
    with pytest.raises(UnsupportedTokenizer, match="normalizer"):
        tiktoken_from_tokenizer(normalized)
    with caplog.at_level(logging.WARNING, logger="pipeline.tokenize.stage"):
        assert Encoder(normalized, TokenizeConfig(vocab_size=2048), sample=["x"]).name == "tokenizers"
    assert "normalizer" in caplog.text
    shuffled = _byte_tokenizer([("a", "b"), ("c", "d")], reverse_merge_ids=True)
    with pytest.raises(UnsupportedTokenizer, match="increasing merge order"):
        tiktoken_from_tokenizer(shuffled)
    prefixed = Tokenizer.from_str(tok.to_str())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    with pytest.raises(UnsupportedTokenizer, match="pre-tokenizer"):
        tiktoken_from_tokenizer(prefixed)
    prefixed.normalizer = normalizers.Lowercase()
    with pytest.raises(UnsupportedTokenizer):
        tiktoken_from_tokenizer(prefixed)


# ---------------------------------------------------------------- token parts


def _docs_store(tmp_path: Path) -> tuple[FileStore, list[Record]]:
    store = FileStore(tmp_path / "store")
    records = [
        *make_records(40, seed=5),
        Record(id="empty", text="", source="x"),
        Record(id="t", text="é🙂", source="x"),
    ]
    write_part(store, "docs", 0, records, StageStats(stage="clean"))
    return store, records


def test_run_tokenize_part_writes_eos_terminated_parts_and_skips_when_done(tmp_path: Path) -> None:
    store, records = _docs_store(tmp_path)
    cfg = TokenizeConfig(vocab_size=600, batch_size=16)
    sha = run_train_tokenizer(store, "docs", 1, "tok/tokenizer.json", cfg, None)
    assert sha == sha256_file(tmp_path / "store/tok/tokenizer.json")
    stats = run_tokenize_part(store, "docs", "tokens", 0, "tok/tokenizer.json", cfg)
    table = pq.read_table(io.BytesIO(store.get_bytes("tokens/part-00000.parquet")))
    assert table.schema.equals(TOKENS_SCHEMA)
    tok = Tokenizer.from_file(str(tmp_path / "store/tok/tokenizer.json"))
    kept = [r for r in records if r.text]
    assert table.column("id").to_pylist() == [r.id for r in kept]
    assert table.column("location").to_pylist()[:3] == ["0", "1", "2"]
    tokens = table.column("tokens").to_pylist()
    assert all(t[-1] == 0 and 0 not in t[:-1] for t in tokens)
    assert [tok.decode(t[:-1]) for t in tokens] == [r.text for r in kept]
    assert stats.docs_in == len(records) and stats.docs_out == len(kept)
    assert stats.dropped == {"empty_text": 1}
    assert stats.extra["tokens"] == sum(map(len, tokens)) and stats.extra["encoder"] == "tiktoken"
    assert read_part_stats(store, "tokens", 0).to_json() == stats.to_json()
    mtime = (tmp_path / "store/tokens/part-00000.parquet").stat().st_mtime_ns
    again = run_tokenize_part(store, "docs", "tokens", 0, "tok/tokenizer.json", cfg)
    assert again.to_json() == stats.to_json()
    assert (tmp_path / "store/tokens/part-00000.parquet").stat().st_mtime_ns == mtime


def test_the_fast_encoder_is_built_and_verified_once_per_process_and_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.tokenize.stage as tokenize_module

    store, records = _docs_store(tmp_path)
    write_part(store, "docs", 1, list(reversed(records)), StageStats(stage="clean"))
    cfg = TokenizeConfig(vocab_size=600, batch_size=16)
    run_train_tokenizer(store, "docs", 2, "tok/tokenizer.json", cfg, None)
    built: list[int] = []
    real = tokenize_module.tiktoken_from_tokenizer
    monkeypatch.setattr(tokenize_module, "tiktoken_from_tokenizer", lambda tok: built.append(1) or real(tok))
    monkeypatch.setattr(tokenize_module, "_ENCODERS", tokenize_module.OrderedDict())
    for index in (0, 1):
        run_tokenize_part(store, "docs", "tokens", index, "tok/tokenizer.json", cfg)
    assert len(built) == 1  # two parts, one build + verification
    # The cached encoder gives the ids a fresh one gives: part 1 holds part 0's documents in reverse order.
    first, second = (
        pq.read_table(io.BytesIO(store.get_bytes(f"tokens/part-0000{i}.parquet")))
        .column("tokens")
        .to_pylist()
        for i in (0, 1)
    )
    assert second == list(reversed(first))
    # Another tokenizer (another sha256) gets its own encoder.
    run_train_tokenizer(store, "docs", 1, "tok2/tokenizer.json", TokenizeConfig(vocab_size=700), None)
    run_tokenize_part(store, "docs", "tokens2", 0, "tok2/tokenizer.json", cfg)
    assert len(built) == 2


def test_run_train_tokenizer_uses_a_given_tokenizer(tmp_path: Path, tok: Tokenizer) -> None:
    store, _ = _docs_store(tmp_path)
    tok.save(str(tmp_path / "given.json"))
    cfg = TokenizeConfig(tokenizer=str(tmp_path / "given.json"))
    run_train_tokenizer(store, "docs", 1, "tok.json", cfg, None)
    assert Tokenizer.from_str(store.get_bytes("tok.json").decode()).to_str() == tok.to_str()
    with pytest.raises(FileNotFoundError):
        run_tokenize_part(store, "missing", "out", 0, "tok.json", cfg)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
@pytest.mark.parametrize("share", [0.01, 0.1, 0.5, 0.99])
def test_tokenizer_sample_spreads_over_the_corpus_and_holds_the_sample_size(n: int, share: float) -> None:
    from pipeline.tokenize.stage import sample_parts

    sizes = [1000 + (i * 7919) % 500 for i in range(n)]  # uneven parts
    total = sum(sizes)
    assert sample_parts(sizes, total) == list(range(n))  # a corpus under the sample size is used whole
    cap = int(total * share)
    parts = sample_parts(sizes, cap)
    assert parts == sorted(set(parts)) and parts == sample_parts(
        sizes, cap
    )  # distinct, ordered, deterministic
    assert sum(sizes[i] for i in parts) >= min(cap, total)  # enough text for the sample
    if len(parts) < n:
        assert len(parts) <= n * share + 2  # not much more than needed
        gaps = np.diff([-1, *parts, n])
        assert (
            gaps.max() <= 2 * gaps.min() + 2
        )  # evenly spaced: the end of the corpus is sampled as its start


def test_the_tokenizer_sample_is_recorded(tmp_path: Path) -> None:
    from pipeline.tokenize.stage import sample_record_key

    store = FileStore(tmp_path / "store")
    for i in range(6):
        write_part(store, "docs", i, make_records(30, seed=i), StageStats(stage="clean", bytes_out=30_000))
    cfg = TokenizeConfig(vocab_size=400, train_sample_bytes=60_000)
    run_train_tokenizer(store, "docs", 6, "tok.json", cfg, None)
    record = json.loads(store.get_bytes(sample_record_key("tok.json")))
    assert record["source"] == "trained" and record["corpus_parts"] == 6 and record["corpus_bytes"] == 180_000
    assert (
        len(record["sample_parts"]) == 3
        and record["sample_parts"][0] <= 1
        and record["sample_parts"][-1] >= 4
    )
    assert record["sample_bytes"] > 0 and record["sample_docs"] > 0
