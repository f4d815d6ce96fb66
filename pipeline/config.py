"""The one config loader: files, ``--set`` overrides, types, messages, and the dataset-name rule.

Every stage and the trainer own their frozen config dataclasses; this module only fills one from a mapping, for
corpus and training configs alike:

- files: ``.yaml``/``.yml`` (YAML) or ``.json`` (JSON) holding one mapping; any other suffix is refused;
- overrides: ``--set key=value`` on every command (dotted keys for nested sections, values read as YAML);
- types: nested dataclasses, tuples/lists, optionals, literals, mappings and primitives; numbers may be written
  as strings (PyYAML reads ``1e-3`` without a dot as a string), booleans must be ``true``/``false``; a tuple of
  (key, value) pairs may be written as a mapping (``stop_words: {en: [the, be]}``), and
  :func:`config_to_dict` gives it back as a list of pairs (which loads to the same config);
- messages: an unknown key is refused with a "did you mean", and every error names the file and the dotted field
  (``corpus.yaml: dedup.near.treshold: ...``); a dataclass ``__post_init__`` ``ValueError`` is re-raised with the
  field path prefixed. Everything raises :class:`pipeline.errors.ConfigError` (a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from pipeline.errors import ConfigError

T = TypeVar("T")
SUFFIXES = (".yaml", ".yml", ".json")
NAME_CHARS = "._-"


# ---------------------------------------------------------------- the dataset-name rule


def check_name(name: str) -> str:
    """A dataset name: letters, digits, ``.``, ``_``, ``-``, not starting with ``.`` (it is a folder of the store,
    and a hidden folder would be skipped by listings). Checked when the config loads, long before publish."""
    if not name or name.startswith(".") or not all(c.isalnum() or c in NAME_CHARS for c in name):
        raise ConfigError(
            f"dataset name {name!r} must be non-empty, use only letters, digits, '.', '_', '-' "
            "and not start with '.'"
        )
    return name


# ---------------------------------------------------------------- files and overrides


def load_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or JSON (``.json``) file holding one mapping (an empty file is ``{}``)."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"{path}: a config file must end in {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a mapping of config fields; got {type(data).__name__}")
    return dict(data)


def parse_overrides(items: Iterable[str], flag: str = "--set") -> dict[str, Any]:
    """``--set clean.normalization=NFKC --set lr=1e-3`` -> ``{dotted key: value}`` (values read as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"{flag} expects KEY=VALUE (a dotted key such as dedup.near.threshold); got {item!r}"
            )
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{flag} {item!r}: the value is not valid YAML ({exc})") from exc
    return out


def split_overrides(overrides: Mapping[str, Any], section: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({key: v} for keys under ``section.``, the other overrides)``: one ``--set`` list feeding two configs
    (``pileworks run --set dedup.near.threshold=0.7 --set train.lr=1e-3``)."""
    prefix = f"{section}."
    inside = {k[len(prefix) :]: v for k, v in overrides.items() if k.startswith(prefix)}
    return inside, {k: v for k, v in overrides.items() if not k.startswith(prefix)}


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``data`` with each dotted key set (sections are created as needed)."""
    out = _copy_sections(data)
    for dotted, value in (overrides or {}).items():
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {dotted}: {key} is not a section")
        node[leaf] = value
    return out


def _copy_sections(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy_sections(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(
    cls: type[T],
    path: str | Path | None,
    overrides: Mapping[str, Any] | None = None,
    *,
    default: Path | None = None,
) -> T:
    """Read ``path`` (``default`` when None; no file: the defaults), apply dotted overrides, build ``cls``.

    Errors name the file, then the dotted field: ``train.yaml: lr must be a number; got 'fast'``.
    """
    source = Path(path) if path else default
    data = apply_overrides(load_mapping(source) if source else {}, overrides)
    try:
        return build_config(cls, data)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source.name}: {exc}") from exc


# ---------------------------------------------------------------- typed construction


def build_config(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Instantiate dataclass ``cls`` from ``data``; fields missing from ``data`` keep their defaults."""
    data = dict(data or {})
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(_unknown_message(cls.__name__, unknown, fields, path))
    kwargs = {
        name: _coerce(hints[name], value, f"{path}.{name}" if path else name) for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        prefix = f"{path}: " if path else ""
        raise ConfigError(f"{prefix}{exc}") from exc


def _unknown_message(kind: str, unknown: list[str], fields: list[str], path: str) -> str:
    where = f"{path}." if path else ""
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hints.append(f"{where}{name} (did you mean {where}{close[0]}?)" if close else f"{where}{name}")
    known = f"known fields{' of ' + path if path else ''}: {', '.join(fields)}"
    return f"unknown {kind} field(s) {', '.join(hints)}; {known}"


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _coerce_union(tp, value, path)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{path} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping of {tp.__name__} fields; got {value!r}")
        return build_config(tp, value, path)
    if origin in (tuple, list, typing.Sequence):
        return _coerce_sequence(tp, origin, value, path)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping; got {value!r}")
        return dict(value)
    return _coerce_scalar(tp, value, path)


def _coerce_union(tp: Any, value: Any, path: str) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(arg, value, path)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of {tp}")


def _coerce_sequence(tp: Any, origin: Any, value: Any, path: str) -> Any:
    args = get_args(tp)
    if isinstance(value, Mapping) and _pairs(tp):
        # a tuple of (key, value) pairs may be written as a mapping ({en: [the, be]}); it stays pairs
        key_type, value_type = get_args(args[0])
        return tuple(
            (_coerce(key_type, k, f"{path} (key {k!r})"), _coerce(value_type, v, f"{path}.{k}"))
            for k, v in value.items()
        )
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        kind = "a mapping or a list of [key, value] pairs" if _pairs(tp) else "a list"
        raise ConfigError(f"{path} must be {kind}; got {value!r}")
    if origin is tuple and args and Ellipsis not in args:
        # A fixed-shape tuple such as tuple[float, float]: one type per position.
        if len(value) != len(args):
            raise ConfigError(f"{path} must be a list of {len(args)} values; got {value!r}")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    item = args[0] if args else Any
    items = [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _pairs(tp: Any) -> bool:
    """Whether ``tp`` is a variadic tuple of 2-tuples (``tuple[tuple[str, X], ...]``)."""
    args = get_args(tp)
    if get_origin(tp) is not tuple or len(args) != 2 or args[1] is not Ellipsis:
        return False
    item = get_args(args[0])
    return get_origin(args[0]) is tuple and len(item) == 2 and Ellipsis not in item


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _coerce_scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, str):
        # PyYAML reads "1e-3" (no dot) as a string; accept numbers spelled that way.
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if tp is float or number.is_integer():
                return _coerce_scalar(tp, number, path)
    if tp is str and isinstance(value, str):
        return value
    if tp in _KINDS:
        raise ConfigError(f"{path} must be {_KINDS[tp]}; got {value!r}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{path} must be {tp.__name__}; got {value!r}")
    return value


def config_to_dict(cfg: Any) -> Any:
    """The resolved config as plain JSON-able data (tuples become lists)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg
