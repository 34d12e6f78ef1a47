"""The registry of task sources: one declaration per source, everything else reads it.

A task source is ONE module in :mod:`harness.tasks.sources` that calls :func:`register`: its
form (a plain name such as ``reverse``, or a prefix and its argument such as ``jsonl:PATH``), a
one-line summary, its options block (a dataclass subclassing :class:`TaskOptions` whose fields
are declared with ``option(default, help, bounds)``: the ``task_options`` it accepts, written
once) and its builder.  From those declarations the registry gives:

* :func:`build_task` (``harness.tasks.get_task``): the spec matched to its source, its options
  checked (an unknown key, or a value outside its declaration, is one line naming
  ``task_options.<name>``), the task built;
* the ``task`` field's help (:func:`field_help`) and the allowed list of the unknown-task error
  (:func:`allowed_forms`);
* ``harness fields task_options`` and ``docs/fields.md`` (:func:`option_table`), and the sources
  table of ``docs/tasks.md`` (:func:`sources_markdown`, ``python -m harness.tasks table``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.configtools import check_value
from harness.tasks.base import Task


class TaskOptions:
    """Base of a source's options block.  Every field is converted to its declared type and
    checked against its declared bounds whenever a block is built, from a run config or from
    Python; a message names the field as ``task_options.<name>``."""

    def __post_init__(self) -> None:
        hints = declared_types(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = check_value(getattr(self, f.name), hints[f.name], f.metadata, _path(f.name))
            object.__setattr__(self, f.name, value)  # frozen blocks too: the converted value

    def values(self) -> dict[str, Any]:
        """The fields by name, in declaration order (a builder's keyword arguments)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _path(name: str) -> str:
    return f"task_options.{name}"


_TYPES: dict[type, dict[str, Any]] = {}


def declared_types(cls: type) -> dict[str, Any]:
    """The resolved field types of an options block (its annotations are strings)."""
    if cls not in _TYPES:
        _TYPES[cls] = typing.get_type_hints(cls)
    return _TYPES[cls]


def option_fields(cls: type[TaskOptions]) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of options block ``cls``, in declaration order."""
    return dataclasses.fields(cls)  # type: ignore[arg-type]


Builder = Callable[..., Task]


@dataclass(frozen=True)
class TaskSource:
    """One registered task source (see the module docstring).

    ``form``: how a spec names it, ``NAME`` or ``PREFIX:ARGUMENT`` (an optional part in
    brackets, as in ``python:MODULE:FUNCTION[@PATH.jsonl]``).  ``build(spec, argument,
    options)`` makes the task (``argument`` is the text after the prefix; ``options`` the checked
    block).  ``argument`` checks that text before any option is read (a missing path is named
    first).  ``further``: documented keys beyond the block that the source accepts and checks
    itself (``rg:``'s generator fields); with any, the keys the block does not declare are handed
    on to ``build`` as a fourth argument (a dict, in the user's order) instead of being refused.  ``field_help``: what the ``task``
    field's one-line help says of the source: ``None`` leaves it to ``harness fields
    task_options`` and the tasks page, ``""`` names its form alone, other text is a format hint
    added in the parentheses."""

    form: str
    summary: str
    build: Builder
    options: type[TaskOptions]
    rank: int = 100
    argument: Callable[[str, str], str] | None = None
    further: Mapping[str, tuple[object, str]] = field(default_factory=dict)
    field_help: str | None = ""

    @property
    def prefix(self) -> str:
        """``"jsonl:"`` for ``jsonl:PATH``; ``""`` for a plain name."""
        head, sep, _ = self.form.partition(":")
        return f"{head}{sep}" if sep else ""

    @property
    def label(self) -> str:
        """The form without its optional part: how listings of options name the source."""
        return re.sub(r"\[.*\]$", "", self.form)

    def construct(self, spec: str, options: Mapping[str, Any]) -> Task:
        """The task of ``spec`` (already matched to this source) with ``options``."""
        argument = spec[len(self.prefix) :] if self.prefix else ""
        if self.argument is not None:
            argument = self.argument(spec, argument)
        declared = [f.name for f in option_fields(self.options)]
        unknown = sorted(set(options) - set(declared))
        if unknown and not self.further:
            raise ValueError(
                f"task '{spec}': unknown option(s) {', '.join(unknown)} "
                f"(allowed: {', '.join(declared) or 'none'})"
            )
        hints = declared_types(self.options)
        checked = {}
        for name, value in options.items():  # the user's order: the first bad one is named
            if name in declared:
                md = self.options.__dataclass_fields__[name].metadata  # type: ignore[attr-defined]
                checked[name] = check_value(value, hints[name], md, _path(name))
        block = self.options(**checked)
        if self.further:
            rest = {k: v for k, v in options.items() if k not in declared}
            return self.build(spec, argument, block, rest)
        return self.build(spec, argument, block)


def nonempty_argument(form: str) -> Callable[[str, str], str]:
    """A ``TaskSource.argument`` check that refuses an empty argument, naming ``form``."""

    def check(spec: str, argument: str) -> str:
        if not argument:
            raise ValueError(f"task '{spec}': expected {form}")
        return argument

    return check


SOURCES: dict[str, TaskSource] = {}

# The closing words of the ``task`` field's help: how every path in a spec is read.
_PATHS = "paths: ~ expanded, relative to the current directory"


def register(source: TaskSource) -> TaskSource:
    """Declare ``source``; ``SOURCES`` stays in rank order (every listing reads that order)."""
    if source.form in SOURCES:
        raise ValueError(f"task source {source.form!r} is registered twice")
    if not (dataclasses.is_dataclass(source.options) and issubclass(source.options, TaskOptions)):
        raise TypeError(f"{source.form}: options must be a dataclass subclassing TaskOptions")
    for f in dataclasses.fields(source.options):
        if "help" not in f.metadata:
            raise TypeError(f"{source.form}: {f.name}: declare it with option(default, help, ...)")
    taken = [s.form for s in SOURCES.values() if s.prefix == source.prefix and source.prefix]
    if taken:
        raise ValueError(f"task source {source.form!r}: prefix {source.prefix!r} is {taken[0]}'s")
    ranked = sorted([*SOURCES.values(), source], key=lambda s: s.rank)
    SOURCES.clear()
    SOURCES.update((s.form, s) for s in ranked)
    return source


def unregister(form: str) -> None:
    """Remove a source (tests that register a made-up one clean up with it)."""
    SOURCES.pop(form, None)


def names() -> tuple[str, ...]:
    """The plain names (the built-in generated tasks), in rank order."""
    return tuple(s.form for s in SOURCES.values() if not s.prefix)


def allowed_forms() -> str:
    """Every form, as the unknown-task error lists them."""
    return ", ".join(SOURCES)


def lookup(spec: str) -> TaskSource:
    """The source ``spec`` (stripped) names; a one-line ``ValueError`` for none."""
    for source in SOURCES.values():
        if (source.prefix and spec.startswith(source.prefix)) or spec == source.form:
            return source
    raise ValueError(f"task: unknown task '{spec}' (allowed: {allowed_forms()})")


def build_task(spec: str, options: Mapping[str, Any]) -> Task:
    """The task ``spec`` names, configured by ``options`` (one-line ``ValueError``s)."""
    spec = spec.strip()
    return lookup(spec).construct(spec, options)


def field_help() -> str:
    """The help of the ``task`` run-config field."""
    listed = [s for s in SOURCES.values() if s.field_help is not None]
    hints = [s.field_help for s in listed if s.field_help]
    return f"{' | '.join(s.form for s in listed)} ({'; '.join([*hints, _PATHS])})."


def _listing_order(source: TaskSource) -> tuple[bool, int]:
    # A source that passes further keys through ends the listing with its open-ended row.
    return (bool(source.further), source.rank)


def option_table() -> list[tuple[str, str, str, str]]:
    """Every source's options: ``(source, "task_options.NAME", default, help)`` rows, from the
    declarations, so ``harness fields task_options`` and ``docs/fields.md`` cannot drift from
    what :func:`build_task` accepts."""
    rows = []
    for source in sorted(SOURCES.values(), key=_listing_order):
        for f in option_fields(source.options):
            rows.append((source.label, _path(f.name), repr(f.default), f.metadata["help"]))
        for name, (default, help_text) in source.further.items():
            rows.append((source.label, _path(name), repr(default), help_text))
    return rows


def _shown(value: object) -> str:
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def sources_markdown() -> str:
    """The sources table of ``docs/tasks.md`` (``python -m harness.tasks table``)."""
    lines = ["| `task` | what it is | `task_options` (default) |", "|---|---|---|"]
    for source in SOURCES.values():
        opts = [f"`{f.name}` {_shown(f.default)}" for f in option_fields(source.options)]
        opts += [f"`{k}` {_shown(d)}" for k, (d, _) in source.further.items() if k != "*"]
        if "*" in source.further:
            opts.append("the generator's own fields")
        cell = ", ".join(opts) or "-"
        lines.append(f"| `{source.form}` | {source.summary} | {cell} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "SOURCES",
    "TaskOptions",
    "TaskSource",
    "allowed_forms",
    "build_task",
    "declared_types",
    "field_help",
    "lookup",
    "names",
    "nonempty_argument",
    "option_fields",
    "option_table",
    "register",
    "sources_markdown",
    "unregister",
]
