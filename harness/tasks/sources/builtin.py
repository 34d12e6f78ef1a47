"""The built-in generated tasks on digit strings, by name: ``reverse``, ``add``, ``sort`` and
``mixed-scale`` (:mod:`harness.tasks.builtin`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.core.fields import option
from harness.tasks.builtin import AddTask, MixedScaleTask, ReverseTask, SortTask
from harness.tasks.registry import Builder, TaskOptions, TaskSource, register


def _min_len() -> Any:
    return option(3, "Shortest digit string (reverse, sort, mixed-scale).", ge=1, le=256)


def _max_len() -> Any:
    return option(6, "Longest digit string (reverse, sort, mixed-scale).", ge=1, le=256)


def _max_operand() -> Any:
    return option(49, "Largest operand of add.", ge=1, le=10**9)


@dataclass(frozen=True)
class DigitOptions(TaskOptions):
    min_len: int = _min_len()
    max_len: int = _max_len()


# Rewards bounded so that every one stays far inside float32 (1e39 is inf there: no score).
@dataclass(frozen=True)
class AddOptions(TaskOptions):
    max_operand: int = _max_operand()
    scale: float = option(1.0, "Reward of an exact add answer.", ge=-1e6, le=1e6)


@dataclass(frozen=True)
class MixedScaleOptions(TaskOptions):
    min_len: int = _min_len()
    max_len: int = _max_len()
    max_operand: int = _max_operand()
    add_scale: float = option(10.0, "reward of an exact add answer.", ge=-1e6, le=1e6)
    add_fraction: float = option(0.5, "share of add prompts.", ge=0, le=1)


def _builder(cls: type) -> Builder:
    return lambda spec, argument, o: cls(**o.values())


for _rank, (_form, _cls, _options, _summary) in enumerate(
    [
        ("reverse", ReverseTask, DigitOptions, "reverse a digit string; partial credit 0..1"),
        ("add", AddTask, AddOptions, "`a+b=`; exact match 0 or `scale`"),
        ("sort", SortTask, DigitOptions, "sort a digit string; partial credit 0..1"),
        (
            "mixed-scale",
            MixedScaleTask,
            MixedScaleOptions,
            "reverse (0..1) and add (0 or `add_scale`) mixed; `Example.group` says which",
        ),
    ]
):
    register(
        TaskSource(
            form=_form,
            summary=_summary,
            build=_builder(_cls),
            options=_options,
            rank=_rank,
        )
    )
