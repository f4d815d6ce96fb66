"""Starting from a Hugging Face GPT-NeoX folder: logits equal transformers', the round trip through our export
is exact, unrepresentable configs and other tokenizers are refused in one line naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import open_store
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.released_model import write_released_model
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.export_hf import export_hf, to_neox_state_dict
from training.hf_init import (
    UnsupportedModelError,
    check_dataset_tokenizer,
    load_hf_model,
    model_config_from_hf,
    tokenize_overrides,
)
from training.model import GPT
from training.safe_load import UnsafeCheckpointError

transformers = pytest.importorskip("transformers", reason="the hf extra is absent")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the hf extra is absent")

PAD_ROWS = 24  # Pythia pads its embedding past the tokenizer (50304 rows for 50277 tokens): so do we


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    uri = build_tiny_dataset(tmp_path_factory.mktemp("store"), n_docs=40, vocab_size=400, seed=5)
    manifest, store = load_manifest(uri, None)
    return manifest, store, uri


def released(folder: Path, dataset, **changes) -> object:
    manifest, store, _uri = dataset
    tk = manifest.tokenizer
    return write_released_model(
        folder,
        store.get_bytes(tk.key),
        vocab_size=tk.vocab_size + PAD_ROWS,
        eos_id=tk.eos_id,
        pad_id=tk.pad_id,
        **changes,
    )


def batch(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "tie_word_embeddings": True,
            "use_parallel_residual": False,
            "rotary_pct": 1.0,
            "layer_norm_eps": 1e-3,
        },
    ],
    ids=["pythia", "tied-sequential-full-rotary"],
)
def test_logits_after_init_equal_transformers(dataset, tmp_path: Path, changes: dict) -> None:
    hf = released(tmp_path, dataset, **changes)
    init = load_hf_model(str(tmp_path))
    assert init.config.vocab_size == dataset[0].tokenizer.vocab_size + PAD_ROWS
    assert init.config.tie_embeddings == bool(changes.get("tie_word_embeddings", False))
    model = GPT(init.config).eval()
    model.load_state_dict(init.state, strict=True)
    ids = batch(init.config.vocab_size)
    with torch.no_grad():
        theirs, ours = hf(ids).logits, model(ids)
    assert ours.abs().max() > 2.0  # not a near-zero comparison
    assert (theirs - ours).abs().max().item() <= 1e-5


def test_round_trip_through_our_export_is_exact(dataset, tmp_path: Path) -> None:
    """Init, save as a checkpoint with zero training steps, export: every tensor equals the original."""
    manifest, store, uri = dataset
    released(tmp_path / "released", dataset)
    original = safetensors_torch.load_file(tmp_path / "released" / "model.safetensors")
    init = load_hf_model(str(tmp_path / "released"))
    assert to_neox_state_dict(init.state, init.config).keys() == original.keys()
    _model, tag_dir = write_fake_checkpoint(
        tmp_path / "ckpt", manifest, store, uri, init.config, step=0, state=init.state
    )
    exported = safetensors_torch.load_file(export_hf(tag_dir, tmp_path / "out") / "model.safetensors")
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["max_position_embeddings"] == 128 and config["vocab_size"] == init.config.vocab_size


@pytest.mark.parametrize("layout", ["bin", "sharded"])
def test_bin_and_sharded_folders_load_the_same_weights(dataset, tmp_path: Path, layout: str) -> None:
    released(tmp_path, dataset)
    reference = load_hf_model(str(tmp_path)).state
    weights = safetensors_torch.load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    if layout == "bin":
        torch.save(weights, tmp_path / "pytorch_model.bin")
    else:
        names = sorted(weights)
        halves = {
            "model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2],
        }
        for shard, keys in halves.items():
            safetensors_torch.save_file({k: weights[k] for k in keys}, tmp_path / shard)
        index = {"weight_map": {k: shard for shard, keys in halves.items() for k in keys}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_hf_model(str(tmp_path)).state
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_init_from_a_folder_on_each_cloud_store_loads_what_the_local_folder_holds(
    dataset, cloud_bucket, tmp_path: Path
) -> None:
    """``--init-from gs://...`` (az://, s3://): the same model, weights and tokenizer as from the folder."""
    released(tmp_path, dataset)
    store = open_store(f"{cloud_bucket.uri}/pythia", cloud_bucket.options)
    for path in sorted(tmp_path.iterdir()):
        store.put_file(path.name, path)
    local, cloud = load_hf_model(str(tmp_path)), load_hf_model(store.uri, cloud_bucket.options)
    assert cloud.config == local.config and cloud.tokenizer_json == local.tokenizer_json is not None
    assert cloud.state.keys() == local.state.keys() and all(
        torch.equal(cloud.state[k], local.state[k]) for k in local.state
    )
    manifest = dataset[0]  # the check before a run reads the folder without its weights
    ours = dataset[1].get_bytes(manifest.tokenizer.key)
    check_dataset_tokenizer(
        load_hf_model(store.uri, cloud_bucket.options, weights=False), store.uri, manifest.tokenizer, ours
    )


def test_a_pickled_payload_in_a_bin_is_refused(dataset, tmp_path: Path) -> None:
    released(tmp_path, dataset)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1), "payload": Path("/")}, tmp_path / "pytorch_model.bin")  # not plain data
    with pytest.raises(UnsafeCheckpointError, match="refused by the weights-only loader"):
        load_hf_model(str(tmp_path))


PYTHIA = {
    "model_type": "gpt_neox",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "hidden_act": "gelu",
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
}


def test_a_released_config_file_maps_field_by_field() -> None:
    cfg = model_config_from_hf({**PYTHIA, "layer_norm_eps": 1e-6, "max_position_embeddings": 2048})
    assert (cfg.rotary_pct, cfg.rotary_base, cfg.norm_eps, cfg.max_seq_len) == (0.25, 10000.0, 1e-6, 2048)
    assert (cfg.parallel_residual, cfg.tie_embeddings, cfg.d_ff) == (True, False, 256)
    recent = {k: v for k, v in PYTHIA.items() if not k.startswith("rotary")}
    recent["rope_parameters"] = {"rope_type": "default", "partial_rotary_factor": 0.5, "rope_theta": 500.0}
    assert (model_config_from_hf(recent).rotary_pct, model_config_from_hf(recent).rotary_base) == (0.5, 500.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"attention_bias": False}, "attention_bias"),
        ({"model_type": "llama"}, "model_type"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters.rope_type"),
        ({"rotary_pct": 0.2}, "rotary_pct"),
        ({"hidden_size": 66}, "hidden_size"),  # 16 * 0.2 -> 3 rotary dims: odd, the halves layout needs even
    ],
)
def test_an_unrepresentable_config_is_refused_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(UnsupportedModelError) as caught:
        model_config_from_hf({**PYTHIA, **change})
    message = str(caught.value)
    assert "\n" not in message and f"config.json: {field} = " in message


def test_a_config_without_a_required_field_is_refused_naming_it() -> None:
    with pytest.raises(UnsupportedModelError, match=r"config\.json has no hidden_size"):
        model_config_from_hf({k: v for k, v in PYTHIA.items() if k != "hidden_size"})


def test_missing_or_unknown_weights_are_refused(dataset, tmp_path: Path) -> None:
    released(tmp_path, dataset)
    weights = safetensors_torch.load_file(tmp_path / "model.safetensors")
    safetensors_torch.save_file(
        {**weights, "gpt_neox.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors"
    )
    with pytest.raises(UnsupportedModelError, match=r"1 tensor\(s\) .* e\.g\. gpt_neox\.extra\.weight"):
        load_hf_model(str(tmp_path))
    weights.pop("embed_out.weight")
    safetensors_torch.save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match=r"have no embed_out\.weight"):
        load_hf_model(str(tmp_path))


def retrained_tokenizer(tokenizer_json: bytes) -> bytes:
    """The same tokenizer with two ordinary tokens' ids swapped: same vocabulary, other ids."""
    spec = json.loads(tokenizer_json)
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return json.dumps(spec).encode()


def test_a_dataset_with_another_tokenizer_is_refused_in_one_line(dataset, tmp_path: Path) -> None:
    manifest, store, _uri = dataset
    tk = manifest.tokenizer
    ours = store.get_bytes(tk.key)
    released(tmp_path, dataset)
    init = load_hf_model(str(tmp_path), weights=False)
    assert init.state == {}
    check_dataset_tokenizer(init, str(tmp_path), tk, ours)  # the same tokenizer passes
    with pytest.raises(ValueError) as caught:
        check_dataset_tokenizer(init, str(tmp_path), tk, retrained_tokenizer(ours))
    message = str(caught.value)
    assert "\n" not in message and "2 token(s) with other ids" in message
    assert f"tokenize.tokenizer: {tmp_path}/tokenizer.json" in message
    (tmp_path / "config.json").write_text(
        json.dumps({**json.loads((tmp_path / "config.json").read_text()), "eos_token_id": tk.eos_id + 1})
    )
    with pytest.raises(ValueError, match=rf"eos id {tk.eos_id} \(model: {tk.eos_id + 1}\)"):
        check_dataset_tokenizer(load_hf_model(str(tmp_path), weights=False), str(tmp_path), tk, ours)


def test_train_command_refuses_the_other_tokenizer_before_starting(dataset, tmp_path: Path, capsys) -> None:
    from flows.cli.main import main

    manifest, store, uri = dataset
    write_released_model(
        tmp_path,
        retrained_tokenizer(store.get_bytes(manifest.tokenizer.key)),
        vocab_size=manifest.tokenizer.vocab_size,
        eos_id=manifest.tokenizer.eos_id,
        pad_id=manifest.tokenizer.pad_id,
    )
    capsys.readouterr()  # save_pretrained's progress bar
    code = main(
        ["train", "--manifest", uri, "--init-from", str(tmp_path), "--set", f"output_dir={tmp_path}/run"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1  # a failure, not a usage error (exit 2)
    assert (
        err[0].startswith("pileworks train: error: the dataset's tokenizer differs") and "other ids" in err[0]
    )
    assert not (tmp_path / "run").exists()


def test_run_builds_with_the_models_tokenizer_and_its_special_tokens(dataset, tmp_path: Path) -> None:
    """Pythia's tokenizer ends documents with <|endoftext|> and declares no pad token."""
    from pipeline.corpus_config import load_corpus_config

    manifest, store, _uri = dataset
    tk = manifest.tokenizer
    write_released_model(
        tmp_path, store.get_bytes(tk.key), vocab_size=tk.vocab_size, eos_id=tk.eos_id, pad_id=None
    )
    overrides = tokenize_overrides(str(tmp_path))
    assert overrides == {
        "tokenize.tokenizer": f"{tmp_path}/tokenizer.json",
        "tokenize.special_tokens": ["<|endoftext|>"],
        "tokenize.eos_token": "<|endoftext|>",
        "tokenize.pad_token": None,
    }
    cfg = load_corpus_config(None, overrides=overrides)
    assert cfg.tokenize.tokenizer == f"{tmp_path}/tokenizer.json" and cfg.tokenize.pad_token is None


def test_the_trainer_builds_the_released_model_with_the_run_options(dataset, tmp_path: Path) -> None:
    from training.config import TrainConfig
    from training.train import build_model

    manifest, store, _uri = dataset
    released(tmp_path, dataset)
    cfg = TrainConfig(
        init_from=str(tmp_path), seq_len=64, attention="document", activation_checkpointing=True
    )
    model = build_model(cfg, manifest, store)
    assert model.activation_checkpointing and model.cfg.attention == "document"
    assert model.cfg.eos_id == manifest.tokenizer.eos_id
    init = load_hf_model(str(tmp_path))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in init.state.items())
    with pytest.raises(ValueError, match="seq_len 256 exceeds init_from's max_position_embeddings 128"):
        build_model(TrainConfig(init_from=str(tmp_path), seq_len=256), manifest, store)
