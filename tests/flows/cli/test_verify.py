"""``pileworks verify``: a flipped byte in a published shard or in a build unit is found, named with what
repairs it, and the exit code says so; an intact store exits 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import main
from tests.fixtures.tiny_dataset import build_tiny_dataset


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify") / "store"
    build_tiny_dataset(root, n_docs=60, vocab_size=300)
    return root


def _copy(published: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(published, tmp_path / "store")
    return tmp_path / "store"


def test_an_intact_store_verifies_with_exit_0(published: Path, tmp_path: Path, capsys) -> None:
    store = _copy(published, tmp_path)
    assert main(["verify", str(store), "--work"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("verified 1 dataset(s)") and out[0].endswith("all intact"), out
    assert " 0 unit(s)" not in out[0]  # the units under work/ were checked too


def test_a_flipped_byte_in_a_published_shard_is_named(published: Path, tmp_path: Path, capsys) -> None:
    store = _copy(published, tmp_path)
    shard = sorted(store.glob("datasets/tiny/*/train/*.bin"))[0]
    _flip(shard)
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith(f"damaged: file://{shard} has sha256 ") and "rerun its build" in out[0], out
    assert out[-1].endswith("1 damaged")
    dataset = shard.parent.parent
    assert main(["verify", str(dataset / "manifest.json")]) == 1  # the dataset alone
    assert main(["verify", str(dataset.parent)]) == 1  # datasets/<name>: follows latest.json


def test_a_flipped_byte_in_a_unit_is_named_with_work(published: Path, tmp_path: Path, capsys) -> None:
    store = _copy(published, tmp_path)
    part = store / "work" / "tiny" / "tokens" / "part-00001.parquet"
    _flip(part)
    assert main(["verify", str(store)]) == 0  # published datasets only: intact
    capsys.readouterr()
    assert main(["verify", str(store), "--work"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith(f"damaged: file://{part} xxh64 "), out
    # what the next build really does: the build that reads the unit recomputes it; a rebuild that finds its
    # dataset published reads no unit (before issue 43: "the next build recomputes its unit", which it did not)
    remedy = out[0].split(" recorded: ", 1)[1]
    assert remedy == (
        "a build that reads it finds the same mismatch and recomputes its unit work/tiny/tokens/part-00001 "
        "(a rebuild that finds its dataset published reads no unit)"
    ), out


def test_a_pointer_at_a_missing_dataset_is_damage(published: Path, tmp_path: Path, capsys) -> None:
    store = _copy(published, tmp_path)
    (store / "datasets" / "tiny" / "latest.json").write_text('{"dataset_id": "0000"}')
    assert main(["verify", str(store)]) == 1
    assert "points at datasets/tiny/0000" in capsys.readouterr().out
