"""Verifiable reward tasks: prompts from a seed, deterministic scores, disjoint held-out sets.

``get_task(spec, **options)`` is the one entry point. The sources a spec may name (``reverse``,
``jsonl:PATH``, ``rg:NAME``, ...) are declared one module each in :mod:`harness.tasks.sources`
and listed by :mod:`harness.tasks.registry` (``python -m harness.tasks table`` prints them with
their options; ``harness fields task_options`` gives each option's help).

A completion is the text generated up to EOS (exclusive); every scorer strips surrounding
whitespace. All prompts of the built-ins end with ``=``. A task may define
``score_parts(example, completion) -> (format share, correct share)`` adding up to its score;
:func:`score_parts` gives ``(0, score)`` for one that does not.
"""

from __future__ import annotations

from typing import Any

from harness.tasks import sources as sources  # registers every source
from harness.tasks.answers import AnswerSpec, math_verify_match, numeric_or_exact_match
from harness.tasks.base import Example, Task, is_held_out, position_credit
from harness.tasks.builtin import AddTask, MixedScaleTask, ReverseTask, SortTask
from harness.tasks.pairs import PairTask
from harness.tasks.reasoning import reasoning_task
from harness.tasks.registry import build_task, field_help, names, option_table
from harness.tasks.sources.jsonl import jsonl_task
from harness.tasks.sources.python import python_task

TASK_NAMES: tuple[str, ...] = names()


def get_task(spec: str, **options: Any) -> Task:
    """The task named by ``spec`` (a registered source's form), configured by ``options``.

    Raises ``ValueError`` with a one-line message for an unknown name, an unknown option, a
    missing or malformed data file, or a ``python:`` function that cannot be imported.
    """
    return build_task(spec, options)


def score_parts(task: Task, example: Example, completion: str) -> tuple[float, float]:
    """(format share, correct share) of ``task``'s reward for ``completion``; they add up to
    the reward. A task without a format reward gives ``(0, score)``."""
    parts = getattr(task, "score_parts", None)
    if callable(parts):
        fmt, correct = parts(example, completion)
        return float(fmt), float(correct)
    return 0.0, task.score(example, completion)


__all__ = [
    "TASK_NAMES",
    "AddTask",
    "AnswerSpec",
    "Example",
    "MixedScaleTask",
    "PairTask",
    "ReverseTask",
    "SortTask",
    "Task",
    "field_help",
    "get_task",
    "is_held_out",
    "jsonl_task",
    "math_verify_match",
    "numeric_or_exact_match",
    "option_table",
    "position_credit",
    "python_task",
    "reasoning_task",
    "score_parts",
]
