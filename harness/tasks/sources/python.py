"""``python:MODULE:FUNCTION[@PATH.jsonl]``: the user's reward function, run in a child process.

``python:`` tasks run the user's own code, imported with the harness's privileges: only use
modules you trust. Spec forms:

* ``python:MODULE:FUNCTION`` -- ``MODULE`` (a dotted module importable from ``sys.path`` or the
  current directory, or a path to a ``.py`` file) defines ``FUNCTION(prompt, completion,
  answer) -> float`` and ``examples()`` returning a list of ``{"prompt": str, "answer": str}``
  dicts (the answer may be ``""`` when the function needs none);
* ``python:MODULE:FUNCTION@PATH.jsonl`` -- the examples come from a JSONL file instead.

The held-out split is that of every task over pairs (:mod:`harness.tasks.pairs`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from harness.core import limits
from harness.core.fields import option
from harness.tasks.base import Example, import_module
from harness.tasks.pairs import DataLimitOptions, HeldOutOptions, PairTask
from harness.tasks.records import file_digest, pairs_from_records, read_jsonl
from harness.tasks.registry import TaskSource, register
from harness.tasks.reward_process import DEFAULT_REWARD_TIMEOUT_S, START_TIMEOUT_S, RewardProcess


@dataclass(frozen=True)
class PythonOptions(DataLimitOptions, HeldOutOptions):
    reward_timeout_s: float = option(
        DEFAULT_REWARD_TIMEOUT_S,
        "seconds one reward call may take; past it the run fails.",
        gt=0,
        le=3600,
    )


def python_task(spec: str, target: str, o: PythonOptions) -> PairTask:
    """``python:MODULE:FUNCTION[@PATH.jsonl]`` (see the module docstring). Runs user code: the
    examples here, the reward in a child process with each call bounded by
    ``reward_timeout_s`` (:mod:`harness.tasks.reward_process`).  ``max_*`` bound the examples
    (:class:`harness.tasks.pairs.DataLimitOptions`); ``max_file_mib`` only the ``@PATH.jsonl``
    file, so it is refused without one (``examples()`` reads no file it could bound)."""
    target, _, data_path = target.partition("@")
    bounds = o.bounds()
    if not data_path and bounds.file_bytes != limits.MAX_TASK_FILE_BYTES:
        raise ValueError(
            f"task '{spec}': {bounds.file_option}: bounds the file of "
            "python:MODULE:FUNCTION@PATH.jsonl; examples() reads no file (bound it with max_rows "
            "and max_data_mib)"
        )
    module, _, func_name = target.rpartition(":")
    if not module or not func_name:
        raise ValueError(
            f"task '{spec}': expected python:MODULE:FUNCTION or python:MODULE:FUNCTION@PATH.jsonl"
        )
    # Bounded as the reward process bounds its own import of it: a module that waits at import
    # is refused with one line, not a silent hang of every process that builds the task.
    mod = import_module(spec, module, timeout_s=START_TIMEOUT_S)
    func = getattr(mod, func_name, None)
    if not callable(func):
        raise ValueError(f"task '{spec}': module '{module}' has no function '{func_name}'")
    if data_path:
        examples = read_jsonl(spec, data_path, bounds=bounds)
        data = file_digest(data_path)
    else:
        examples = _module_examples(spec, mod, module, target, bounds)
        data = ""
    source = getattr(mod, "__file__", None)
    code = file_digest(source) if source and Path(source).is_file() else ""
    child = RewardProcess(spec, module, func_name, o.reward_timeout_s)

    def scorer(ex: Example, completion: str) -> float:
        where = (
            f"task '{spec}': {func_name}(prompt={ex.prompt[:40]!r}, completion={completion[:40]!r})"
        )
        return child.call(where, ex.prompt, completion, ex.answer)

    return PairTask(
        spec,
        examples,
        scorer,
        eval_fraction=o.eval_fraction,
        fingerprint=f"{code}:{data}",
        on_close=child.close,
    )


def _module_examples(
    spec: str, mod: object, module: str, target: str, bounds: limits.DataBounds
) -> list[Example]:
    """The examples ``mod.examples()`` returns, at most ``bounds.rows`` of them."""
    make = getattr(mod, "examples", None)
    if not callable(make):
        raise ValueError(
            f"task '{spec}': module '{module}' defines no examples(); add one or use "
            f"python:{target}@PATH.jsonl"
        )
    try:
        records = list(itertools.islice(make(), bounds.rows + 1))
    except Exception as exc:
        raise ValueError(f"task '{spec}': examples() raised {type(exc).__name__}: {exc}") from exc
    if len(records) > bounds.rows:
        raise ValueError(
            bounds.rows_refusal(
                f"task '{spec}': examples() returns more than {bounds.rows:,} examples"
            )
        )
    return pairs_from_records(spec, "examples()", enumerate(records, start=1), bounds=bounds)


register(
    TaskSource(
        form="python:MODULE:FUNCTION[@PATH.jsonl]",
        summary="the user's `FUNCTION(prompt, completion, answer) -> float`; prompts from "
        "`MODULE.examples()` or `...@PATH.jsonl` (runs user code)",
        build=python_task,
        options=PythonOptions,
        rank=40,
        field_help="FUNCTION(prompt, completion, answer) -> float",
    )
)
