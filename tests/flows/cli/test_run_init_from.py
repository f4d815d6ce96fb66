"""``pileworks run --init-from``: the corpus is built with the released model's tokenizer, then trained from it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.flows.tiny_corpus import TINY_OVERRIDES, WORDS

transformers = pytest.importorskip("transformers", reason="the hf extra is absent")


def released_pythia_like(folder: Path) -> int:
    """A Pythia-shaped model folder whose tokenizer (trained here) ends documents with <|endoftext|> and has
    no pad token, as Pythia's; returns the EOS id."""
    from pipeline.tokenize.stage import TokenizeConfig, train_tokenizer
    from tests.fixtures.released_model import write_released_model

    rng = random.Random(0)
    texts = ["The " + " ".join(rng.choice(WORDS) for _ in range(40)) + "." for _ in range(200)]
    cfg = TokenizeConfig(vocab_size=300, special_tokens=("<|endoftext|>",), pad_token=None)
    tok = train_tokenizer(texts, cfg)
    eos = tok.token_to_id("<|endoftext|>")
    write_released_model(
        folder, tok.to_str().encode(), vocab_size=tok.get_vocab_size() + 4, eos_id=eos, pad_id=None
    )
    return eos


def test_run_overrides_build_with_the_models_tokenizer_and_train_from_it(tmp_path: Path) -> None:
    from flows.cli.main import build_parser
    from flows.cli.run import run_overrides

    released_pythia_like(tmp_path / "model")
    args = build_parser().parse_args(
        [
            "run",
            "--init-from",
            str(tmp_path / "model"),
            "--set",
            "tokenize.num_threads=1",
            "--set",
            "train.lr=0.0001",
        ]
    )
    corpus, train = run_overrides(args)
    assert corpus["tokenize.tokenizer"] == f"{tmp_path}/model/tokenizer.json"
    assert corpus["tokenize.eos_token"] == "<|endoftext|>" and corpus["tokenize.pad_token"] is None
    assert corpus["tokenize.num_threads"] == 1
    assert train == {"lr": 1e-4, "init_from": str(tmp_path / "model")}


@pytest.mark.slow
@pytest.mark.distributed
def test_prepare_and_train_from_a_released_model(prefect_harness, tiny_corpus: Path, tmp_path: Path) -> None:
    from flows.train.flow import prepare_and_train
    from pipeline.dataset.manifest import load_manifest
    from training.hf_init import tokenize_overrides

    eos = released_pythia_like(tmp_path / "model")
    out = prepare_and_train(
        inputs=[str(tiny_corpus)],
        output=str(tmp_path / "store"),
        nproc=2,
        train_overrides={
            "init_from": str(tmp_path / "model"),
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "seq_len": 32,
            "micro_batch_size": 2,
            "eval_batches": 0,
            "num_workers": 0,
            "tensorboard": False,
            "lr": 1e-4,
        },
        corpus_overrides=TINY_OVERRIDES | tokenize_overrides(str(tmp_path / "model")),
        timeout_s=600,
    )
    manifest, _store = load_manifest(out["corpus"]["manifest_uri"], None)
    assert manifest.tokenizer.eos_id == eos and manifest.tokenizer.pad_id is None
    assert out["training"]["steps"] == 3
