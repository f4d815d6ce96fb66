from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from pipeline.configload import build_config, config_to_dict
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
