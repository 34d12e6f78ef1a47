"""Verifiable reward tasks: prompts from a seed, deterministic scores, disjoint held-out sets.

``get_task(spec, **options)`` is the one entry point. Specs:

==========================  ====================================================================
``reverse``                 reverse a digit string (``min_len=3, max_len=6``); partial credit 0..1
``sort``                    sort a digit string (``min_len, max_len``); partial credit 0..1
``add``                     ``a+b=`` (``max_operand=49, scale=1.0``); exact match 0 or ``scale``
``mixed-scale``             reverse (0..1) and add (0 or 10) mixed (``add_scale, add_fraction``,
                            plus the options of both); ``Example.group`` says which
``jsonl:PATH``              ``{"prompt", "answer"}`` lines; exact or numeric (1e-6) match
                            (``eval_fraction=0.1``; ``reward``, ``answer_format``,
                            ``format_weight``, ``think``: :mod:`harness.tasks.answers`)
``hf:PATH``                 a local ``save_to_disk`` directory, ``.parquet`` or ``.jsonl`` file
                            (``prompt_field``, ``answer_field``, ``split``; the jsonl options);
                            never downloads (:mod:`harness.tasks.local_data`)
``rg:NAME``                 a reasoning-gym generator scored by its own verifier (its config
                            fields, ``eval_size``, the answer options; :mod:`.reasoning`)
``python:MODULE:FUNCTION``  the user's ``FUNCTION(prompt, completion, answer) -> float``; prompts
                            from ``MODULE.examples()`` or ``...@PATH.jsonl`` (runs user code)
==========================  ====================================================================

A completion is the text generated up to EOS (exclusive); every scorer strips surrounding
whitespace. All prompts of the built-ins end with ``=``. A task may define
``score_parts(example, completion) -> (format share, correct share)`` adding up to its score;
:func:`score_parts` gives ``(0, score)`` for one that does not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from harness.core.configtools import check_value, meta
from harness.tasks.answers import AnswerSpec, math_verify_match
from harness.tasks.base import Example, Task, is_held_out, position_credit
from harness.tasks.builtin import AddTask, MixedScaleTask, ReverseTask, SortTask
from harness.tasks.local_data import hf_task
from harness.tasks.pairs import PairTask, jsonl_task, numeric_or_exact_match, python_task
from harness.tasks.reasoning import HARNESS_OPTIONS, reasoning_task

# Every task option, declared once like a config field (type, help, range): checked before a
# task is built, so task_options.max_len: 100000000 is one line, not a hang while drawing prompts.
# A new task's keyword options must be declared here (tests/test_bad_input.py checks it).
OPTION_DECLS: dict[str, tuple[Any, dict[str, Any]]] = {
    "min_len": (int, meta("Shortest digit string (reverse, sort, mixed-scale).", ge=1, le=256)),
    "max_len": (int, meta("Longest digit string (reverse, sort, mixed-scale).", ge=1, le=256)),
    "max_operand": (int, meta("Largest operand of add.", ge=1, le=10**9)),
    # Bounded so that every reward stays far inside float32 (1e39 is inf there: no score).
    "scale": (float, meta("Reward of an exact add answer.", ge=-1e6, le=1e6)),
    "add_scale": (float, meta("mixed-scale: reward of an exact add answer.", ge=-1e6, le=1e6)),
    "add_fraction": (float, meta("mixed-scale: share of add prompts.", ge=0, le=1)),
    "eval_fraction": (float, meta("jsonl/hf/python: share of prompts held out.", gt=0, lt=1)),
    "reward": (
        Literal["exact", "numeric", "math_verify"],
        meta("jsonl/hf: answer check: exact string, numeric (or exact), math_verify."),
    ),
    "answer_format": (
        Literal["raw", "tag", "last_line"],
        meta("jsonl/hf/rg: where the answer is: whole completion, <answer> tag, last line."),
    ),
    "format_weight": (
        float,
        meta("jsonl/hf/rg: reward = (1-w)*correct + w*format.", ge=0, le=1),
    ),
    "think": (bool, meta("jsonl/hf/rg: the format reward also asks for <think>...</think> first.")),
    "prompt_field": (str, meta("hf: the prompt column.")),
    "answer_field": (str, meta("hf: the answer column.")),
    "split": (str | None, meta("hf: the split of a DatasetDict directory (default train).")),
    "eval_size": (int, meta("rg: items in the held-out pool.", ge=1, le=100_000)),
    "reward_timeout_s": (
        float,
        meta("python: seconds one reward call may take; past it the run fails.", gt=0, le=3600),
    ),
}

_BUILTINS: dict[str, Callable[..., Any]] = {
    "reverse": ReverseTask,
    "add": AddTask,
    "sort": SortTask,
    "mixed-scale": MixedScaleTask,
}
TASK_NAMES: tuple[str, ...] = tuple(_BUILTINS)
_ALLOWED = ", ".join(
    [*TASK_NAMES, "jsonl:PATH", "hf:PATH", "rg:NAME", "python:MODULE:FUNCTION[@PATH.jsonl]"]
)


# The task sources whose options are keyword arguments of one factory, as the docs name them.
_SOURCES: dict[str, Callable[..., Any]] = {
    **_BUILTINS,
    "jsonl:PATH": jsonl_task,
    "hf:PATH": hf_task,
    "python:MODULE:FUNCTION": python_task,
}
# rg:NAME takes the harness's answer options plus every field of the generator's config
# dataclass; these are the harness's own, with the defaults reasoning_task applies.
RG_OPTIONS: dict[str, tuple[object, str]] = {
    "answer_format": ("tag", OPTION_DECLS["answer_format"][1]["help"]),
    "format_weight": (0.0, OPTION_DECLS["format_weight"][1]["help"]),
    "think": (False, OPTION_DECLS["think"][1]["help"]),
    "eval_size": (128, OPTION_DECLS["eval_size"][1]["help"]),
    "seed": (0, "rg: seed of the training and held-out pools (not the run seed)."),
    "size": (None, "rg: items in the training pool (null: the generator's own, 500 for most)."),
    "*": (
        None,
        "rg: any other field of the generator's config dataclass (e.g. countdown's "
        "min_numbers), checked against its type.",
    ),
}


def option_table() -> list[tuple[str, str, str, str]]:
    """Every task source's options: ``(source, "task_options.NAME", default, help)`` rows, read
    from the factories' keyword arguments (their defaults are the ones a run uses) and
    :data:`OPTION_DECLS` (their help), so ``harness fields task_options`` and ``docs/fields.md``
    cannot drift from what :func:`get_task` accepts."""
    rows = []
    for source, factory in _SOURCES.items():
        for name, param in inspect.signature(factory).parameters.items():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                help_text = OPTION_DECLS[name][1]["help"]
                rows.append((source, f"task_options.{name}", repr(param.default), help_text))
    for name, (default, help_text) in RG_OPTIONS.items():
        rows.append(("rg:NAME", f"task_options.{name}", repr(default), help_text))
    return rows


def _construct(spec: str, factory: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """Call ``factory``, turning an unknown option into a one-line ``ValueError``."""
    params = inspect.signature(factory).parameters
    allowed = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"task '{spec}': unknown option(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(allowed) or 'none'})"
        )
    checked = {}
    for name, value in options.items():
        tp, md = OPTION_DECLS[name]
        checked[name] = check_value(value, tp, md, f"task_options.{name}")
    return factory(*args, **checked)


def get_task(spec: str, **options: Any) -> Task:
    """The task named by ``spec`` (see the module docstring), configured by ``options``.

    Raises ``ValueError`` with a one-line message for an unknown name, an unknown option, a
    missing or malformed JSONL file, or a ``python:`` function that cannot be imported.
    """
    spec = spec.strip()
    if spec in _BUILTINS:
        task: Task = _construct(spec, _BUILTINS[spec], **options)
        return task
    if spec.startswith("jsonl:"):
        path = spec[len("jsonl:") :]
        if not path:
            raise ValueError(f"task '{spec}': expected jsonl:PATH")
        return _construct(spec, jsonl_task, spec, path, **options)  # type: ignore[no-any-return]
    if spec.startswith("hf:"):
        return _construct(spec, hf_task, spec, spec[len("hf:") :], **options)  # type: ignore[no-any-return]
    if spec.startswith("rg:"):
        name = spec[len("rg:") :].strip()
        if not name:
            raise ValueError(f"task '{spec}': expected rg:NAME (a reasoning-gym generator)")
        ours = {k: v for k, v in options.items() if k in HARNESS_OPTIONS}
        checked = {
            k: check_value(v, *OPTION_DECLS[k], f"task_options.{k}") for k, v in ours.items()
        }
        return reasoning_task(spec, name, {**options, **checked})
    if spec.startswith("python:"):
        return _construct(spec, python_task, spec, spec[len("python:") :], **options)  # type: ignore[no-any-return]
    raise ValueError(f"task: unknown task '{spec}' (allowed: {_ALLOWED})")


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
    "get_task",
    "hf_task",
    "is_held_out",
    "math_verify_match",
    "numeric_or_exact_match",
    "option_table",
    "position_credit",
    "reasoning_task",
    "score_parts",
]
