"""Every config field is declared one way, with ``option(...)`` (harness.core.fields): the
run config, the experiment file, every registered objective's options block, the correction
blocks and every task source's options.  A field spelt ``field(metadata=meta(...))`` or with a
raw ``metadata={"help": ...}`` dict is named here, so a second spelling cannot creep back."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Union

from harness.config import RunConfig
from harness.config.experiment_schema import ExperimentFile
from harness.core.fields import declared_with_option, meta, option
from harness.ppo.corrections import Correction, Filter
from harness.ppo.objectives import OBJECTIVES, ClipOptions
from harness.tasks.registry import SOURCES


def _inner_types(tp: Any) -> list[Any]:
    """The types a field's type is made of (union arms, list/tuple/dict items, Annotated)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return [typing.get_args(tp)[0]]
    if origin in (Union, types.UnionType, list, tuple, dict):
        return [a for a in typing.get_args(tp) if a is not Ellipsis]
    return []


def reachable(*roots: type) -> list[type]:
    """Every dataclass reachable from ``roots`` through field types, each once, in walk order."""
    seen: list[type] = []
    todo: list[Any] = list(roots)
    while todo:
        tp = todo.pop(0)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if tp in seen:
                continue
            seen.append(tp)
            hints = typing.get_type_hints(tp, include_extras=True)
            todo += [hints[f.name] for f in dataclasses.fields(tp)]
        else:
            todo += _inner_types(tp)
    return seen


def not_declared_with_option(classes: list[type]) -> list[str]:
    return [
        f"{cls.__module__}.{cls.__qualname__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if not declared_with_option(f)
    ]


ROOTS: list[type] = [
    RunConfig,
    ExperimentFile,
    Correction,
    Filter,
    ClipOptions,  # ppo.eps_clip, eps_clip_higher and c_clip take its declarations
    *(o.options for o in OBJECTIVES.values() if o.options is not None),
    *(s.options for s in SOURCES.values()),
]


def test_every_config_field_is_declared_with_option() -> None:
    classes = reachable(*ROOTS)
    assert not_declared_with_option(classes) == []


def test_the_walk_reaches_every_kind_of_config_block() -> None:
    """Nested blocks, optional ones, union arms, list items, objective and task-source blocks."""
    names = {cls.__name__ for cls in reachable(*ROOTS)}
    expected = {
        "RunConfig",
        "RolloutConfig",
        "AsyncConfig",  # a nested block
        "LoraOptions",  # inside an optional block (lora: LoraOptions | None)
        "NormConfig",  # optional (ppo.adv_norm)
        "RejectionSampling",
        "Correction",  # a union arm (Correction | str | None)
        "Filter",  # tuple items (Correction.filters)
        "ExperimentFile",
        "SearchParam",  # dict values (search.params)
        "AdaptiveSeedsFile",
        "LimitsFile",
    }
    assert expected <= names, sorted(expected - names)
    objective_blocks = {o.options for o in OBJECTIVES.values() if o.options is not None}
    assert len(objective_blocks) >= 5 and objective_blocks <= set(reachable(RunConfig))
    assert len(SOURCES) >= 5


def test_the_check_names_every_other_spelling() -> None:
    @dataclasses.dataclass
    class Mixed:
        required: str = option(help="No default.")
        one: int = option(1, "Declared with option.", ge=0, le=9)
        listed: list[int] = option(help="A mutable default.", factory=list)
        via_meta: int = dataclasses.field(default=1, metadata=meta("Old spelling.", ge=0, le=9))
        raw: float = dataclasses.field(default=0.0, metadata={"help": "A raw dict.", "ge": 0})
        bare: bool = False

    assert not_declared_with_option([Mixed]) == [
        f"{__name__}.{Mixed.__qualname__}.{name}" for name in ("via_meta", "raw", "bare")
    ]
    # option's metadata reads as before: help and bounds, nothing else
    (required, one, listed) = dataclasses.fields(Mixed)[:3]
    assert dict(one.metadata) == {"help": "Declared with option.", "ge": 0, "le": 9}
    assert listed.default_factory is list and dict(listed.metadata) == {
        "help": "A mutable default."
    }
    assert required.default is dataclasses.MISSING
    assert required.default_factory is dataclasses.MISSING
