"""Typed dataclass trees from plain dicts (YAML), with strict validation and dotted overrides.

A config is a dataclass tree whose fields are declared with ``option`` (``harness.core.fields``:
the default, the help and, for numbers, the allowed range).  This module turns a nested dict into
such a tree, checking every key, type, range and finiteness once, from those declarations, and
reports the first problem as a ``ConfigError`` whose message is one line naming the dotted path
and what is allowed.  The CLI turns ``ConfigError`` into exit code 2.

A class decorated ``@checked()`` (below ``@dataclass``) runs the same checks on every
construction, from Python too, so its ``__post_init__`` holds only the rules that tie fields
together.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from harness.core.fields import (
    BOUND_OPS,
    META_KEYS,
    declarations,
    describe_range,
    strip_optional,
    type_name,
)

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad configuration value; ``str(err)`` is one line naming the field and what is allowed."""


class BadValue(ConfigError):
    """A value of the right kind that is not allowed (outside its declared range, a mapping with
    a bad key): a union arm that fits by kind reports this, rather than "must be X or Y"."""


def check_declared(value: Any, md: Any, path: str) -> None:
    """Check a converted number against its field's declared range and finiteness."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    unknown = set(md) - META_KEYS
    if unknown:  # a typo in a declaration must not silently disable a bound
        raise TypeError(f"{path}: unknown metadata key(s) {sorted(unknown)}")
    is_int = isinstance(value, int)
    # NaN compares False with everything, so it must be refused before the bounds are tried.
    finite_ok = not math.isnan(value) and (math.isfinite(value) or bool(md.get("inf")))
    within = all(op(value, md[k]) for k, op in BOUND_OPS.items() if md.get(k) is not None)
    if not finite_ok or not within:
        raise BadValue(f"{path}: must be {describe_range(md, is_int)}; got {value!r}")


NAME_MAX = 100
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(value: Any, where: str) -> str:
    """A study / experiment name: it becomes a directory under the results dir, so it is one
    path component of at most 100 letters, digits, '-', '_', '.', starting with a letter or a
    digit (no '/', no '..', no absolute path, no name the filesystem refuses as too long)."""
    if isinstance(value, str) and len(value) <= NAME_MAX and _NAME_RE.fullmatch(value):
        return value
    shown = (
        repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40] + "...")
    )
    length = (
        f" ({len(value)} characters)" if isinstance(value, str) and len(value) > NAME_MAX else ""
    )
    raise ConfigError(
        f"{where}: must be 1-{NAME_MAX} letters, digits, '-', '_' or '.', starting with a letter "
        f"or digit; got {shown}{length}"
    )


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_RESOLVER = yaml.resolver.Resolver()


def _quoted_number(value: Any, tp: Any) -> str:
    """'a number' / 'an integer' when ``value`` is text that YAML reads, unquoted, as a number and
    ``tp`` takes a number but not that text; '' otherwise.

    The one rule for every number field (run config, experiment file, ``--set``, task options):
    a number is written as a number.  ``"10"`` is a string in a file and in ``--set k='"10"'``,
    and refused; ``--set k=10`` is parsed as YAML and is the number.  Text YAML itself leaves a
    string goes on to ``float()``: PyYAML (YAML 1.1) reads ``1e-3`` (an exponent without a dot)
    as text, and it is the number YAML 1.2 reads."""
    if not isinstance(value, str):
        return ""
    args = set(get_args(tp)) if get_origin(tp) in (Union, types.UnionType) else {tp}
    if str in args or any(get_origin(a) is Literal and value in get_args(a) for a in args):
        return ""
    kind = "a number" if float in args else "an integer" if int in args else ""
    tag = _RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) if kind else ""  # type: ignore[no-untyped-call]
    return kind if tag in _NUMBER_TAGS else ""


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if number := _quoted_number(value, tp):
        raise BadValue(
            f"{path}: must be {number}, not a string; got {value!r} (write it without quotes)"
        )
    if origin is Annotated:  # Annotated[int, meta(...)]: a declared range for a list item
        inner, md = get_args(tp)[:2]
        return check_value(value, inner, md, path)
    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed and not (
            isinstance(value, bool) and True not in allowed and False not in allowed
        ):
            return value
        raise ConfigError(f"{path}: must be {type_name(tp)}; got {value!r}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{path}: must be {type_name(tp)}; got null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        inner = [e for e in errors if isinstance(e, BadValue) or not str(e).startswith(f"{path}: ")]
        if inner:  # the value fits an arm by type: its own problem (and path) says what is wrong
            raise inner[0]
        raise ConfigError(f"{path}: must be {type_name(tp)}; got {value!r}")
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
            # YAML 1.1 reads "1e-3" (no dot) as a string; accept what Python reads as a number
            # (text YAML reads as a number was refused above: it was quoted).
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
        key_tp, item_tp = get_args(tp) or (Any, Any)
        bad = [k for k in value if key_tp is str and not isinstance(k, str)]
        if bad:
            raise BadValue(f"{path}: keys must be strings; got {bad[0]!r}")
        if item_tp is Any:
            return dict(value)
        if dataclasses.is_dataclass(item_tp):  # the key may fill a field (see meta's from_key)
            return {
                k: _convert(v, item_tp, f"{path}.{k}")
                if not isinstance(v, dict)
                else from_dict(item_tp, v, f"{path}.{k}", key=k)  # type: ignore[arg-type]
                for k, v in value.items()
            }
        return {k: _convert(v, item_tp, f"{path}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)) or (origin is list and isinstance(value, tuple)):
            raise ConfigError(f"{path}: must be a list; got {value!r}")
        item_tp = (get_args(tp) or (Any,))[0]
        items = [_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    raise ConfigError(f"{path}: unsupported field type {tp!r}")  # pragma: no cover


def check_value(value: Any, tp: Any, md: Any, path: str) -> Any:
    """Convert one value to ``tp`` and check it against the declaration ``md`` (a ``meta(...)``
    dict): the same checks ``from_dict`` applies to a field, for values that are not dataclass
    fields (task options, experiment-level counts)."""
    converted = _convert(value, tp, path)
    check_declared(converted, md, path)
    return converted


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of the dataclass instance ``obj`` against its declaration (type, Literal
    choices, range, finiteness: what ``from_dict`` checks for a file) and raise a one-line
    ``ValueError`` naming ``<prefix><field>``.  A ``ValueError`` rather than a ``ConfigError``:
    built inside ``from_dict``, the message is then prefixed with the parent's path."""
    for name, tp, md in declarations(type(obj)):
        try:
            check_value(getattr(obj, name), tp, md, f"{prefix}{name}")
        except ConfigError as err:
            raise ValueError(str(err)) from None


def checked(prefix: str = "") -> Callable[[type[T]], type[T]]:
    """Class decorator, written below ``@dataclass`` (which only calls a ``__post_init__`` that
    exists when it runs): every construction, from a file or from Python, checks the fields'
    declarations (:func:`check_fields`) before the class's own ``__post_init__``, which is then
    left with the rules that tie fields together.  ``prefix`` names the block in messages
    (``"rejection_sampling."``)."""

    def wrap(cls: type[T]) -> type[T]:
        own = getattr(cls, "__post_init__", None)

        def __post_init__(self: Any) -> None:
            check_fields(self, prefix)
            if own is not None:
                own(self)

        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        return cls

    return wrap


def from_dict(cls: type[T], data: dict[str, Any], path: str = "", key: str | None = None) -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys, missing required keys and wrong
    types raise ConfigError.  ``key`` (an entry of a ``dict[str, cls]``) fills the field whose
    metadata says ``from_key``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for name, f in list(fields.items()):
        if f.metadata.get("from_key"):
            del fields[name]
            if key is not None:
                kwargs[name] = key
    unknown = sorted((k for k in data if k not in fields), key=str)
    if unknown:  # before any value: a misspelt key is the likelier mistake
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        # A retired key a class declares (``RENAMED_KEYS``: old → new) names its new spelling.
        renamed = getattr(cls, "RENAMED_KEYS", {}).get(unknown[0])
        if renamed is not None:
            raise ConfigError(f"{where}: renamed to {path + '.' if path else ''}{renamed}")
        raise ConfigError(f"{where}: unknown key (allowed: {', '.join(sorted(fields))})")
    for k, value in data.items():
        where = f"{path}.{k}" if path else str(k)
        kwargs[k] = _convert(value, hints[k], where)
        check_declared(kwargs[k], fields[k].metadata, where)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            where = f"{path}.{name}" if path else name
            tp = hints[name]
            what = describe_range(f.metadata, tp is int) if tp in (int, float) else type_name(tp)
            raise ConfigError(f"{where}: missing (must be {what})")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        prefix = f"{path}." if path else ""
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        last = path.rpartition(".")[2]
        if last and msg.startswith(f"{last}."):  # "rejection_sampling.upper must ..." names
            prefix = path[: -len(last)]  # its own sub-config already: do not say it twice
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


def is_device_name(name: str, *, allow_auto: bool = True) -> bool:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``, exactly as spelled (lower case, no spaces):
    the one spelling check for devices in run configs, ``--devices`` and device resolution."""
    return (
        name in ("cpu", "cuda")
        or (allow_auto and name == "auto")
        or (name.startswith("cuda:") and name[5:].isdigit())
    )


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}; None-valued sub-configs stay as one key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge into a new tree; values in ``update`` win; a None in update replaces
    a sub-dict. Neither input is modified and the result shares no mutable object with them:
    callers then write into the result with ``set_path``, and a shared nested dict would carry
    one cell's settings into the next (an experiment's cells once trained with each other's
    settings that way)."""
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
        tp = _block_type(strip_optional(tp))
        if not dataclasses.is_dataclass(tp):
            return get_origin(tp) is dict  # free-form mapping (e.g. task options)
        hints = typing.get_type_hints(tp)
        if part not in hints:
            new = getattr(tp, "RENAMED_KEYS", {}).get(part)
            if new is not None:  # a retired key: say its new name rather than "not a path"
                head = dotted[: dotted.index(part)] if dotted != part else ""
                raise ConfigError(f"{dotted}: renamed to {head}{new}")
            return False
        tp = hints[part]
    return True


def _block_type(tp: Any) -> Any:
    """The dataclass of a field that is either a block or a name standing for one (``ppo.correction:
    Correction | str``: a preset name or a block): its sub-keys are paths, as ``--set
    ppo.correction.clip_max=3`` and a grid axis over it use them."""
    if get_origin(tp) in (Union, types.UnionType):
        blocks = [a for a in get_args(tp) if dataclasses.is_dataclass(a)]
        if len(blocks) == 1:
            return blocks[0]
    return tp


def level_str(v: object) -> str:
    """A grid level as the cell labels spell it: floats in ``%g``, None as ``none``, a mapping
    as ``{key:value,...}``, anything else ``str()`` (``kl_coef=0``, not JSON's ``0.0``).  The
    labels, the search's parameter names and the report's factor effects all spell levels so."""
    if isinstance(v, float):
        return f"{v:g}"
    if v is None:
        return "none"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{level_str(x)}" for k, x in v.items()) + "}"
    return str(v)
