"""How a config field is declared, and what a config tree's declarations say.

Every config in the harness is a dataclass whose fields are declared with ``option``: the default,
the help string and, for numbers, the allowed range.  ``harness.core.configtools`` converts and
checks values against these declarations; this module only declares and reads them (the dotted
paths, defaults and help of a tree, and the allowed range in words).

Declaring a field (the one spelling for every config field)::

    steps: int = option(200, "Training steps.", ge=1, le=10_000_000)
    lr: float = option(3e-4, "Learning rate.", gt=0)
    clip: float = option(20.0, "Clip to ±clip.", gt=0, inf="no clipping")
    names: list[str] = option(help="Module names.", factory=lambda: ["all-linear"])
    metric: str = option(help="Run-summary key (required: no default).")

``ge``/``gt``/``le``/``lt`` bound the value (inclusive / exclusive).  A float must be finite
unless ``inf=`` says what infinity means for that field; NaN is never accepted.  Every int field
declares both bounds (tests/config/test_bad_input.py walks the tree and checks that it does), so that a
value such as 10**23 is refused up front instead of overflowing mid-run.  ``factory`` gives a
mutable default.  A field declared like another one passes that declaration on:
``option(None, **BEHAVE_CAP)`` (the same help and range), ``option(None, "Other help.",
**bounds_of(decl))`` (the same range).  tests/config/test_option_declarations.py checks that every
config field is declared so.  Choices are a ``Literal[...]`` type; a tuple of the same names,
where code needs one, is ``typing.get_args`` of it.  (The reader takes any mapping of the same
keys as metadata, e.g. the empty one of a dataclass that declares nothing.)
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

BOUND_OPS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}
BOUND_KEYS = tuple(BOUND_OPS)
META_KEYS = {"help", "inf", "from_key", *BOUND_KEYS}


class Meta(dict[str, Any]):
    """Field metadata; hashable, so that it can also annotate a type (``Annotated[int, meta(...)]``
    declares the range of a list's items)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def copy(self) -> Meta:
        """A copy of the same kind: a dataclass field's metadata is a read-only view of what it
        was declared with, and its ``copy()`` is how :func:`declared_with_option` sees that."""
        return type(self)(self)


class Declared(Meta):
    """The metadata :func:`option` gives a field: a ``Meta`` that says it came from ``option``."""


def meta(
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    inf: str | None = None,
    from_key: bool = False,
) -> Meta:
    """Field metadata: the help string shown by ``harness fields`` and the allowed range.

    ``inf`` (floats only) allows an infinite value and says what it means, e.g. ``"no clipping"``.
    ``from_key``: in a ``dict[str, ThisClass]`` the mapping's key fills this field (it is not a
    key the file may give).
    """
    if ge is not None and gt is not None or le is not None and lt is not None:
        raise TypeError("give at most one lower (ge/gt) and one upper (le/lt) bound")
    out = Meta(help=help)
    for key, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("inf", inf)):
        if value is not None:
            out[key] = value
    if from_key:
        out["from_key"] = True
    return out


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    **bounds: Any,
) -> Any:
    """A dataclass field with its :func:`meta` (help and bounds), declared on one line:
    ``eps: float = option(0.2, "The clip range.", ge=0)``; ``factory`` for a mutable default."""
    metadata = Declared(meta(help, **bounds))
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared_with_option(f: dataclasses.Field[Any]) -> bool:
    """Whether dataclass field ``f`` was declared with :func:`option` (the one spelling; a test
    walks every config tree with it)."""
    return isinstance(f.metadata.copy(), Declared)


def bounds_of(md: Mapping[str, Any]) -> dict[str, Any]:
    """The range of a declaration (its ``ge``/``gt``/``le``/``lt`` and ``inf``), for a field
    that takes another field's range with its own help."""
    return {k: md[k] for k in (*BOUND_KEYS, "inf") if k in md}


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:_}"


def describe_range(md: Any, is_int: bool) -> str:
    """'an integer in [1, 10_000_000]', 'a finite number > 0', 'a number in (0, 1]' ..."""
    lo = next(((k, md[k]) for k in ("ge", "gt") if md.get(k) is not None), None)
    hi = next(((k, md[k]) for k in ("le", "lt") if md.get(k) is not None), None)
    what = "an integer" if is_int else ("a number" if md.get("inf") else "a finite number")
    if lo and hi:
        left = "[" if lo[0] == "ge" else "("
        right = "]" if hi[0] == "le" else ")"
        text = f"{what} in {left}{_num(lo[1])}, {_num(hi[1])}{right}"
    elif lo:
        text = f"{what} {'>=' if lo[0] == 'ge' else '>'} {_num(lo[1])}"
    elif hi:
        text = f"{what} {'<=' if hi[0] == 'le' else '<'} {_num(hi[1])}"
    else:
        text = what
    if md.get("inf"):
        text += f" (.inf = {md['inf']})"
    return text


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def type_name(tp: Any) -> str:
    """What a field of type ``tp`` accepts, in words ('an integer', "one of 'a', 'b'", 'a number
    or null', 'a mapping' ...), for messages that name what is allowed."""
    origin = get_origin(tp)
    if origin is Annotated:
        return type_name(get_args(tp)[0])
    if tp in _NAMES:
        return _NAMES[tp]
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if not (a is int and float in get_args(tp))]
        return " or ".join(type_name(a) for a in args)  # int | float: "a number"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is dict:
        return "a mapping"
    if origin in (list, tuple):
        return "a list"
    return getattr(tp, "__name__", str(tp))


_DECLARATIONS: dict[type, tuple[tuple[str, Any, Any], ...]] = {}


def declarations(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    """(name, type, metadata) of every init field of ``cls``, resolved once per class (type
    hints are slow to resolve; a construction then costs one dict lookup and the checks)."""
    found = _DECLARATIONS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = tuple(
            (f.name, hints[f.name], f.metadata)
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.init
        )
        _DECLARATIONS[cls] = found
    return found


def strip_optional(tp: Any) -> Any:
    """``X`` for ``X | None``; any other type as it is."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, type, dataclasses.Field[Any], Any]]:
    """(dotted path, the dataclass declaring it, field, type) for every leaf field of a config
    tree; an optional sub-config counts as the sub-config (what you get once you set it)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = strip_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{f.name}", cls, f, tp


def field_defaults(cls: type) -> dict[str, Any]:
    """Flattened dotted path → default; fields of an optional sub-config that defaults to None
    show the sub-config's own defaults (what you get once you set it)."""
    instances: dict[type, Any] = {}
    out: dict[str, Any] = {}
    for path, owner, f, _ in _leaves(cls):
        if owner not in instances:
            instances[owner] = owner()
        out[path] = getattr(instances[owner], f.name)
    return out


def declared_fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """Flattened dotted path → (type, metadata) for every leaf field of a config tree (what the
    generic checks read; tests walk it to make sure every number declares its range)."""
    return {path: (tp, f.metadata) for path, _, f, tp in _leaves(cls)}


def field_help(cls: type) -> dict[str, str]:
    """Flattened dotted path → help string for every field of a config tree."""
    return {path: f.metadata.get("help", "") for path, _, f, _ in _leaves(cls)}
