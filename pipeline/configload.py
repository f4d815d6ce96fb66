"""Build frozen config dataclasses from plain dicts (YAML), with errors that name the field and the fix.

Every stage owns its config dataclass; this module only knows how to fill one from a mapping: nested
dataclasses, tuples/lists, optionals, literals and primitives. Unknown keys are errors (a typo must not be
silently ignored), and a dataclass ``__post_init__`` ``ValueError`` is re-raised with the field path prefixed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from pipeline.errors import ConfigError

T = TypeVar("T")


def build_config(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Instantiate dataclass ``cls`` from ``data``; fields missing from ``data`` keep their defaults."""
    data = dict(data or {})
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"unknown config field(s) {', '.join(where + u for u in unknown)}; "
            f"known fields{' of ' + path if path else ''}: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{path}.{name}" if path else name)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        prefix = f"{path}: " if path else ""
        raise ConfigError(f"{prefix}{exc}") from exc


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
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
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list; got {value!r}")
        args = get_args(tp)
        if origin is tuple and args and Ellipsis not in args:
            # A fixed-shape tuple such as tuple[int, float]: one type per position.
            if len(value) != len(args):
                raise ConfigError(f"{path} must have {len(args)} items; got {value!r}")
            return tuple(
                _coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping; got {value!r}")
        return dict(value)
    return _coerce_scalar(tp, value, path)


def _coerce_scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false; got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path} must be an integer; got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{path} must be a number; got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path} must be a string; got {value!r}")
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
