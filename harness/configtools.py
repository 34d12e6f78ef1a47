"""Typed dataclass trees from plain dicts (YAML), with strict validation and dotted overrides.

Every config in the harness is a dataclass whose fields carry ``metadata={"help": ...}``.  This
module turns a nested dict into such a tree, checking every key and type once, and reports the
first problem as a ``ConfigError`` whose message is one line naming the dotted path and what is
allowed.  The CLI turns ``ConfigError`` into exit code 2.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad configuration value; ``str(err)`` is one line naming the field and what is allowed."""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed and not (
            isinstance(value, bool) and True not in allowed and False not in allowed
        ):
            return value
        raise ConfigError(f"{path}: must be {_type_name(tp)}; got {value!r}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{path}: must be {_type_name(tp)}; got null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{path}: must be {_type_name(tp)}; got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # type: ignore[arg-type]
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be a mapping; got {value!r}")
        return from_dict(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: must be true or false; got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: must be an integer; got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads "1e-3" (no dot) as a string; accept what Python reads as a number.
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: must be a number; got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: must be a string; got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be a mapping; got {value!r}")
        return dict(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list; got {value!r}")
        (item_tp,) = get_args(tp) or (Any,)
        return [_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(f"{path}: unsupported field type {tp!r}")  # pragma: no cover


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"{where}: unknown key (allowed here: {allowed})")
        kwargs[key] = _convert(value, hints[key], where)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        prefix = f"{path}." if path else ""
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{prefix}{msg}") from None


def to_dict(obj: Any) -> Any:
    """Dataclass tree → plain nested dict (YAML-safe)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}; None-valued sub-configs stay as one key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge into a new tree; values in ``update`` win; a None in update replaces
    a sub-dict. Neither input is modified and the result shares no mutable object with them:
    callers then write into the result with ``set_path``, and a shared nested dict would carry
    one cell's settings into the next (the leak of issue 14)."""
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for "a.b.c", creating intermediate dicts."""
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[p] = nxt
        cur = nxt
    cur[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """ "ppo.eps_clip=0.3" → ("ppo.eps_clip", 0.3); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set ppo.eps_clip=0.3")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def is_config_path(cls: type, dotted: str) -> bool:
    """Whether "a.b.c" names a field (or a field inside an optional sub-config) of ``cls``."""
    tp: Any = cls
    for part in dotted.split("."):
        tp = _strip_optional(tp)
        if not dataclasses.is_dataclass(tp):
            return get_origin(tp) is dict  # free-form mapping (e.g. task options)
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return False
        tp = hints[part]
    return True


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def field_defaults(cls: type) -> dict[str, Any]:
    """Flattened dotted path → default; fields of an optional sub-config that defaults to None
    show the sub-config's own defaults (what you get once you set it)."""
    out: dict[str, Any] = {}
    instance = cls()
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = _strip_optional(typing.get_type_hints(cls)[f.name])
        if dataclasses.is_dataclass(tp):
            for k, v in field_defaults(tp).items():  # type: ignore[arg-type]
                out[f"{f.name}.{k}"] = v
        else:
            out[f.name] = getattr(instance, f.name)
    return out


def field_help(cls: type) -> dict[str, str]:
    """Flattened dotted path → help string for every field of a config tree."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = _strip_optional(typing.get_type_hints(cls)[f.name])
        if dataclasses.is_dataclass(tp):
            for k, v in field_help(tp).items():  # type: ignore[arg-type]
                out[f"{f.name}.{k}"] = v
        else:
            out[f.name] = f.metadata.get("help", "")
    return out
