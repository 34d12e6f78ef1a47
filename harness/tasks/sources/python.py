"""``python:MODULE:FUNCTION[@PATH.jsonl]``: the user's reward function, run in a child process
(:func:`harness.tasks.pairs.python_task`)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.configtools import option
from harness.tasks.pairs import DataLimitOptions, HeldOutOptions, python_task
from harness.tasks.registry import TaskSource, register
from harness.tasks.reward_process import DEFAULT_REWARD_TIMEOUT_S


@dataclass(frozen=True)
class PythonOptions(DataLimitOptions, HeldOutOptions):
    reward_timeout_s: float = option(
        DEFAULT_REWARD_TIMEOUT_S,
        "seconds one reward call may take; past it the run fails.",
        gt=0,
        le=3600,
    )


register(
    TaskSource(
        form="python:MODULE:FUNCTION[@PATH.jsonl]",
        summary="the user's `FUNCTION(prompt, completion, answer) -> float`; prompts from "
        "`MODULE.examples()` or `...@PATH.jsonl` (runs user code)",
        build=lambda spec, target, o: python_task(spec, target, **o.values()),
        options=PythonOptions,
        rank=40,
        field_help="FUNCTION(prompt, completion, answer) -> float",
    )
)
