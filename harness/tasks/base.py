"""The task contract: an :class:`Example`, the :class:`Task` protocol, and the held-out rule.

Why a hash rule for held-out prompts: evaluation must measure generalisation, so no training
prompt may ever equal an evaluation prompt, whatever seed or how many steps a run uses. Each
generated task defines a canonical *key* per prompt (the digit string, or ``"a+b"``); a key is
held out iff ``sha256(f"{task}|{key}")`` mod :data:`HOLDOUT_MODULUS` is 0 (about 10% of the
space). ``sample`` rejects held-out keys; ``eval_examples`` draws only held-out keys from its own
fixed random stream. The rule depends on nothing but the key, so it is stable across runs,
machines and Python versions (unlike ``hash()``, which is salted per process).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import random
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from harness.core import limits

HOLDOUT_MODULUS = 10


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer; ``group`` names a sub-task (used by mixed-scale)."""

    prompt: str
    answer: str
    group: str = ""
    # Where a file task's row came from ("data.jsonl line 7"), for error messages; not identity.
    source: str = field(default="", compare=False)


class RewardError(ValueError):
    """User reward code failed while a run was scoring completions (it raised, or returned
    something that is not a finite number).  The run ends FAILED with this message as its
    reason; it is not bad input (the config was valid), so it is not exit code 2."""


@runtime_checkable
class Task(Protocol):
    """A verifiable reward task.

    ``sample(rng, n)`` draws ``n`` training examples (with replacement) using only ``rng``;
    ``eval_examples(n)`` returns at most ``n`` distinct held-out examples, the same on every
    call, never producible by ``sample``; ``score`` maps a completion (text generated up to EOS,
    exclusive) to a reward, deterministically; ``demonstration`` is the ideal completion (what
    the warm start imitates); ``max_new_tokens_hint`` is a generation budget that fits every
    demonstration plus EOS with room to spare.
    """

    name: str

    # Read-only in the protocol, so a task may compute it lazily (rg: generates its pool first).
    @property
    def max_new_tokens_hint(self) -> int: ...

    def sample(self, rng: random.Random, n: int) -> list[Example]: ...

    def eval_examples(self, n: int) -> list[Example]: ...

    def score(self, example: Example, completion: str) -> float: ...

    def demonstration(self, example: Example) -> str: ...


def stable_hash(text: str) -> int:
    """A process-independent 64-bit hash of ``text``."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def is_held_out(task: str, key: str) -> bool:
    """The held-out rule (see the module docstring)."""
    return stable_hash(f"{task}|{key}") % HOLDOUT_MODULUS == 0


def draw_keys(
    rng: random.Random,
    n: int,
    draw: Callable[[random.Random], Hashable],
    keep: Callable[[Hashable], bool],
    *,
    unique: bool,
    max_tries: int = 200_000,
) -> list[Hashable]:
    """Draw keys from ``draw`` until ``n`` pass ``keep`` (distinct ones when ``unique``).

    Stops early after ``max_tries`` draws, so a request larger than the kept space returns
    every key it found instead of looping forever.
    """
    out: list[Hashable] = []
    seen: set[Hashable] = set()
    tries = 0
    while len(out) < n and tries < max_tries:
        tries += 1
        key = draw(rng)
        if not keep(key) or (unique and key in seen):
            continue
        seen.add(key)
        out.append(key)
    return out


def position_credit(answer: str, completion: str) -> float:
    """Fraction of positions where ``completion`` matches ``answer`` (0..1).

    The denominator is the longer of the two strings, so extra characters cost credit just as
    missing ones do (otherwise a policy could pad freely); an exact match scores 1.0.
    """
    got = completion.strip()
    denom = max(len(answer), len(got))
    if denom == 0:
        return 1.0
    hits = sum(1 for a, b in zip(answer, got, strict=False) if a == b)
    return hits / denom


class _ImportTimeout(BaseException):
    """A user module still importing at its bound (a ``BaseException``: module code that
    catches ``Exception`` around its own waits cannot swallow it)."""


def import_module(spec: str, module: str, timeout_s: float | None = None) -> Any:
    """The user module ``module`` of task ``spec`` (a dotted name or a ``.py`` path); a
    one-line ``ValueError`` when it cannot be imported, or, with ``timeout_s``, when its
    module-level code is still running after that many seconds (stopped between bytecodes and
    in sleeps and waits, on the main thread: :func:`harness.core.limits.time_bound`)."""
    if timeout_s is None:
        return _import_module(spec, module)
    try:
        with limits.time_bound(timeout_s, _ImportTimeout):
            return _import_module(spec, module)
    except _ImportTimeout:
        raise ValueError(
            f"task '{spec}': importing '{module}' did not finish within {timeout_s:g} s (its "
            "module-level code runs in every process that builds the task: it must not wait)"
        ) from None


def _import_module(spec: str, module: str) -> Any:
    try:
        if module.endswith(".py"):
            path = Path(module).expanduser()
            if not path.is_file():
                raise ValueError(f"task '{spec}': file '{module}' does not exist")
            mod_name = f"harness_user_task_{stable_hash(str(path.resolve())):x}"
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ValueError(f"task '{spec}': cannot load '{module}' as a Python module")
            mod = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(mod)
            return mod
        added = os.getcwd() not in sys.path
        if added:
            sys.path.insert(0, os.getcwd())
        try:
            return importlib.import_module(module)
        finally:
            if added:
                sys.path.remove(os.getcwd())
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(
            f"task '{spec}': cannot import module '{module}' ({type(exc).__name__}: {exc})"
        ) from exc


__all__ = [
    "import_module",
    "HOLDOUT_MODULUS",
    "Example",
    "RewardError",
    "Task",
    "draw_keys",
    "is_held_out",
    "position_credit",
    "stable_hash",
]
