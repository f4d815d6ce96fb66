"""The published dataset's tokenizer is a complete Hugging Face tokenizer folder that knows EOS and PAD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.dataset.manifest import compute_dataset_id, load_manifest
from pipeline.storage import sha256_bytes
from pipeline.tokenize.hf_files import HF_TOKENIZER_FILES, hf_tokenizer_files
from tests.fixtures.tiny_dataset import build_tiny_dataset, make_records


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory):
    uri = build_tiny_dataset(tmp_path_factory.mktemp("store"), n_docs=40, vocab_size=300, seed=4)
    manifest, store = load_manifest(uri, None)
    return manifest, store, Path(uri.removeprefix("file://")).parent


def test_companion_files_are_published_and_listed_with_sha256(published) -> None:
    manifest, store, folder = published
    assert sorted(manifest.tokenizer.files) == sorted(HF_TOKENIZER_FILES)
    for name, digest in manifest.tokenizer.files.items():
        assert sha256_bytes((folder / name).read_bytes()) == digest == sha256_bytes(store.get_bytes(name))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>" and config["pad_token"] == "<|pad|>"
    assert "bos_token" not in config  # the dataset has none
    assert compute_dataset_id(manifest) == manifest.dataset_id


def test_files_are_deterministic() -> None:
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1}, unk_token="a"))
    data = tok.to_str().encode()
    assert hf_tokenizer_files(data, eos_id=0) == hf_tokenizer_files(data, eos_id=0)
    with pytest.raises(ValueError, match="no token with id 7"):
        hf_tokenizer_files(data, eos_id=0, pad_id=7)


def test_auto_tokenizer_loads_the_dataset_folder_with_eos_and_pad(published) -> None:
    transformers = pytest.importorskip("transformers", reason="the hf extra is absent")
    manifest, _store, folder = published
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == manifest.tokenizer.eos_id
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id == manifest.tokenizer.pad_id
    text = make_records(40, seed=4)[0].text
    assert tok(text)["input_ids"][-1] != manifest.tokenizer.eos_id  # no EOS added to prompts
