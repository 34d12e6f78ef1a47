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
    something that is not a finite number), or its module's code misbehaved while the run built
    the task (:func:`import_module`: it raised, exited or broke ``sys.modules`` on this import).
    The run ends FAILED with this message as its reason; it is not bad input (the config was
    valid), so it is not exit code 2.  Met while a config is validated, it is a ``ValueError``
    as any other: the one line of bad input."""


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
    """:func:`_load_module`, with the modules already loaded kept as they were.

    The harness imports the task module into its own process, so module-level code that deletes
    entries of ``sys.modules`` or replaces them (``sys.modules['os'] = None``) would break the
    harness's next import or leave it with a second copy of its own classes: a traceback far
    from the cause.  Whatever the import did to the entries that existed before it is undone,
    and the task is refused with one line saying what was done; entries the import added (the
    modules it imported) stay.  What the module's code does wrong is a :class:`RewardError`:
    one line, exit 2 when a config is validated, a FAILED run when a run builds the task."""
    modules = sys.modules
    before = dict(modules)
    try:
        mod = _load_module(spec, module)
    except SystemExit as exc:  # module-level sys.exit(): the harness must not exit with it
        _put_back(modules, before)
        raise RewardError(
            f"task '{spec}': importing '{module}' called sys.exit({exc.code!r:.100})"
        ) from None
    except BaseException:
        _put_back(modules, before)
        raise
    changed = _put_back(modules, before)
    if changed:
        raise RewardError(
            f"task '{spec}': importing '{module}' {changed}; a task module must leave the modules "
            "already loaded in place (the harness runs on them)"
        )
    return mod


_MISSING = object()


def _put_back(modules: dict[str, Any], before: dict[str, Any]) -> str:
    """Make ``sys.modules`` the dict ``modules`` again with every entry of ``before`` as it was;
    what had been done to them ("" for nothing), the first change and a count of the rest."""
    changes = []
    if sys.modules is not modules:
        sys.modules = modules
        changes.append("replaced sys.modules itself")
    for name, old in before.items():
        now = modules.get(name, _MISSING)
        if now is old:
            continue
        if now is _MISSING:
            changes.append(f"deleted sys.modules[{name!r}]")
        elif now is None:
            changes.append(f"set sys.modules[{name!r}] to None")
        else:
            changes.append(f"replaced sys.modules[{name!r}]")
        modules[name] = old
    if len(changes) > 1:
        return f"{changes[0]} (and {len(changes) - 1} more such changes)"
    return changes[0] if changes else ""


def _load_module(spec: str, module: str) -> Any:
    if module.endswith(".py"):
        path = Path(module).expanduser()
        if not path.is_file():
            raise ValueError(f"task '{spec}': file '{module}' does not exist")
        mod_name = f"harness_user_task_{stable_hash(str(path.resolve())):x}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"task '{spec}': cannot load '{module}' as a Python module")
        mod = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(mod)
        except Exception as exc:
            raise _import_failed(spec, module, exc) from exc
        return mod
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise _import_failed(spec, module, exc) from exc
    finally:
        if added and cwd in sys.path:  # the module may have changed both
            sys.path.remove(cwd)


def _import_failed(spec: str, module: str, exc: Exception) -> RewardError:
    """The one line of a module whose import raised ``exc`` (a ``ValueError`` it raised, too:
    its message alone would not name the task)."""
    lines = str(exc)[:301].splitlines()  # one line, however long the message
    return RewardError(
        f"task '{spec}': cannot import module '{module}' ({type(exc).__name__}: "
        f"{lines[0] if lines else ''})"
    )


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
