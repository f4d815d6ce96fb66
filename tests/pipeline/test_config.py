"""``pipeline.config``: the one loader of corpus and training configs (types, files, overrides, messages, names)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from pipeline.config import (
    apply_overrides,
    build_config,
    check_name,
    config_to_dict,
    load_config,
    load_mapping,
    parse_overrides,
    split_overrides,
)
from pipeline.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Inner:
    threshold: float = 0.8
    mode: Literal["word", "char"] = "word"

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = "x"
    inputs: tuple[str, ...] = ()
    inner: Inner = field(default_factory=Inner)
    limit: int | None = None


def test_nested_defaults_and_values() -> None:
    cfg = build_config(Outer, {"inputs": ["a", "b"], "inner": {"threshold": 0.5}, "limit": 3})
    assert cfg.inputs == ("a", "b") and cfg.inner.threshold == 0.5 and cfg.inner.mode == "word"
    assert config_to_dict(cfg) == {
        "name": "x",
        "inputs": ["a", "b"],
        "inner": {"threshold": 0.5, "mode": "word"},
        "limit": 3,
    }


def test_unknown_field_is_named() -> None:
    with pytest.raises(ConfigError, match=r"inner\.treshold"):
        build_config(Outer, {"inner": {"treshold": 0.5}})


def test_wrong_type_names_field() -> None:
    with pytest.raises(ConfigError, match=r"limit must be an integer"):
        build_config(Outer, {"limit": "ten"})
    with pytest.raises(ConfigError, match=r"inner\.mode must be one of"):
        build_config(Outer, {"inner": {"mode": "line"}})


def test_post_init_error_gets_path() -> None:
    with pytest.raises(ConfigError, match=r"^inner: threshold must be in"):
        build_config(Outer, {"inner": {"threshold": 2.0}})


# ---------------------------------------------------------------- the one loader, for every config


@dataclass(frozen=True, kw_only=True)
class Numbers:
    lr: float = 1e-4
    steps: int = 10
    betas: tuple[float, float] = (0.9, 0.95)
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_numbers_written_as_strings_are_numbers() -> None:
    # PyYAML reads 1e-3 (no dot) as the string "1e-3"; both kinds of config accept it.
    cfg = build_config(
        Numbers, yaml.safe_load("lr: 1e-3\nsteps: 2e3\nbetas: [0.9, 1e-1]\ninner: {threshold: 5e-1}")
    )
    assert (cfg.lr, cfg.steps, cfg.betas, cfg.inner.threshold) == (0.001, 2000, (0.9, 0.1), 0.5)
    with pytest.raises(ConfigError, match=r"^steps must be an integer; got '2\.5e0'"):
        build_config(Numbers, {"steps": "2.5e0"})
    with pytest.raises(ConfigError, match="flag must be true or false; got 'yes'"):
        build_config(Numbers, {"flag": "yes"})


def test_unknown_key_gets_a_did_you_mean() -> None:
    with pytest.raises(ConfigError, match=r"inner\.treshold \(did you mean inner\.threshold\?\)"):
        build_config(Numbers, {"inner": {"treshold": 0.5}})
    with pytest.raises(ConfigError) as err:
        build_config(Numbers, {"zzz": 1})
    assert "did you mean" not in str(err.value) and "known fields: betas, flag, inner, lr, steps" in str(
        err.value
    )


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_files_name_the_file_and_the_dotted_field(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps({"lr": 0.5, "inner": {"mode": "line"}}))  # JSON is valid YAML too
    with pytest.raises(
        ConfigError, match=rf"^run{suffix}: inner\.mode must be one of 'word', 'char'; got 'line'"
    ):
        load_config(Numbers, path)
    path.write_text(json.dumps({"lr": 0.5}))
    assert load_config(Numbers, path, {"inner.threshold": 0.25}).inner.threshold == 0.25


def test_file_suffix_and_content_rules(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"must end in \.yaml, \.yml, \.json"):
        load_mapping(tmp_path / "train.cfg")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mapping(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_mapping(tmp_path / "list.yaml")
    (tmp_path / "bad.json").write_text("{lr: 1}")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_mapping(tmp_path / "bad.json")
    (tmp_path / "empty.yml").write_text("")
    assert load_mapping(tmp_path / "empty.yml") == {}


def test_set_overrides_parse_split_and_apply() -> None:
    overrides = parse_overrides(["dedup.near.threshold=0.7", "train.lr=1e-3", "name = x ", "inputs=[a, b]"])
    assert overrides == {"dedup.near.threshold": 0.7, "train.lr": "1e-3", "name": "x", "inputs": ["a", "b"]}
    train, corpus = split_overrides(overrides, "train")
    assert train == {"lr": "1e-3"} and "train.lr" not in corpus and corpus["dedup.near.threshold"] == 0.7
    data = {"dedup": {"near": {"ngram": 5}}, "name": "y"}
    applied = apply_overrides(data, corpus)
    assert applied["dedup"] == {"near": {"ngram": 5, "threshold": 0.7}} and applied["name"] == "x"
    assert data == {"dedup": {"near": {"ngram": 5}}, "name": "y"}  # the input is not changed
    for bad in ("threshold", "=0.7"):
        with pytest.raises(ConfigError, match="--set expects KEY=VALUE"):
            parse_overrides([bad])
    with pytest.raises(ConfigError, match=r"--set name\.x: name is not a section"):
        apply_overrides({"name": "y"}, {"name.x": 1})


@pytest.mark.parametrize("name", ["sample", "web-2024.v1", "a_b"])
def test_dataset_name_rule_accepts(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "..", "a b", "x:y"])
def test_dataset_name_rule_refuses(name: str) -> None:
    with pytest.raises(ConfigError, match="dataset name"):
        check_name(name)


def test_corpus_config_and_publish_share_the_name_rule(tmp_path: Path) -> None:
    """``.hidden`` used to load and fail only at publish, after all the compute."""
    from pipeline.corpus_config import load_corpus_config

    with pytest.raises(ConfigError, match=r"dataset name '\.hidden'"):
        load_corpus_config(None, name=".hidden")
    with pytest.raises(ConfigError, match=r"dataset name '\.hidden'"):
        load_corpus_config(None, overrides={"name": ".hidden"})


@dataclass(frozen=True, kw_only=True)
class Lists:
    stop_words: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ngrams: tuple[tuple[int, float], ...] = ((2, 0.2),)


def test_a_tuple_of_pairs_may_be_written_as_a_mapping() -> None:
    text = "stop_words: {en: [the, be], '*': [a]}\nngrams: {2: 0.2, 3: '1e-1'}\n"
    cfg = build_config(Lists, yaml.safe_load(text))
    assert cfg.stop_words == (("en", ("the", "be")), ("*", ("a",))) and cfg.ngrams == ((2, 0.2), (3, 0.1))
    # the resolved config keeps pairs, which load back (JSON included) to the same config
    assert config_to_dict(cfg)["stop_words"] == [["en", ["the", "be"]], ["*", ["a"]]]
    assert build_config(Lists, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    assert build_config(Lists, {"stop_words": [["en", ["the"]]]}).stop_words == (("en", ("the",)),)


def test_a_wrong_mapping_value_names_the_field_and_key() -> None:
    with pytest.raises(ConfigError, match=r"stop_words\.en must be a list; got 'the'"):
        build_config(Lists, {"stop_words": {"en": "the"}})
    with pytest.raises(ConfigError, match=r"stop_words\.en\[1\] must be a string"):
        build_config(Lists, {"stop_words": {"en": ["the", 3]}})
    with pytest.raises(ConfigError, match=r"stop_words must be a mapping or a list of \[key, value\] pairs"):
        build_config(Lists, {"stop_words": "the"})
    with pytest.raises(ConfigError, match=r"ngrams \(key 'two'\) must be an integer"):
        build_config(Lists, {"ngrams": {"two": 0.2}})
