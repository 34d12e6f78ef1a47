"""Answer checking shared by the file and generator tasks: extraction, match rules, format reward.

A task's reward is a stated weighted sum of two shares, both in [0, 1] before weighting::

    reward = (1 - format_weight) * correct + format_weight * format

``correct`` is the verifier's score of the *extracted* answer (exact, numeric, ``math_verify``,
or a reasoning-gym generator's own ``score_answer``); ``format`` is :func:`format_score`, the
share of the structure checks the completion passes. Both weighted shares are returned by
:meth:`AnswerSpec.parts`, so the training loop can log them apart (``reward/format``,
``reward/correct``) and they always add up to the reward. ``format_weight = 0`` (the default)
is the plain verifier score.

Answer formats (``answer_format``):

* ``raw`` -- the whole completion, stripped (the jsonl/hf default: the whole completion is the
  answer, as before answer formats existed);
* ``tag`` -- the text inside the *last* ``<answer>...</answer>`` pair, stripped (the last, as
  reasoning-gym does, so a model that drafts an answer and then corrects it is scored on the
  correction); no tag means no answer;
* ``last_line`` -- the last non-empty line, stripped.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from harness.core.fields import option
from harness.core.limits import time_bound
from harness.tasks.registry import TaskOptions

AnswerFormat = Literal["raw", "tag", "last_line"]
MatchRule = Literal["exact", "numeric", "math_verify"]
ANSWER_FORMATS: tuple[str, ...] = ("raw", "tag", "last_line")
MATCH_RULES: tuple[str, ...] = ("exact", "numeric", "math_verify")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
# A completion that opens with a closed think block (whitespace around it allowed).
_THINK_FIRST = re.compile(r"\s*<think>.*?</think>", re.S)
TASKS_EXTRA = "pip install 'harness[tasks]'"


@dataclass(frozen=True)
class AnswerOptions(TaskOptions):
    """The answer options of a task source (``task_options``): what :class:`AnswerSpec` is
    built from."""

    answer_format: AnswerFormat = option(
        "raw", "where the answer is: whole completion, <answer> tag, last line."
    )
    format_weight: float = option(0.0, "reward = (1-w)*correct + w*format.", ge=0, le=1)
    think: bool = option(False, "the format reward also asks for <think>...</think> first.")


def extract_answer(completion: str, answer_format: str) -> str | None:
    """The answer part of ``completion`` under ``answer_format`` (see the module docstring), or
    None when there is none (no tag; no non-empty line for ``last_line``)."""
    if answer_format == "tag":
        found = _ANSWER_TAG.findall(completion)
        return found[-1].strip() if found else None
    if answer_format == "last_line":
        lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
        return lines[-1] if lines else None
    return completion.strip()  # may be "": an empty answer is still compared (it may be right)


def format_score(completion: str, answer_format: str, think: bool) -> float:
    """Share (0..1) of the structure checks ``completion`` passes.

    Checks: an answer can be extracted (for ``tag``: an ``<answer>...</answer>`` pair with
    something inside); with ``think``, the completion also opens with ``<think>...</think>``
    and the answer tag (if any) comes after it."""
    checks = [bool(extract_answer(completion, answer_format))]
    if think:
        m = _THINK_FIRST.match(completion)
        after = completion[m.end() :] if m else ""
        ok = m is not None and (answer_format != "tag" or bool(_ANSWER_TAG.search(after)))
        checks.append(ok)
    return sum(checks) / len(checks)


def compose(correct: float, fmt: float, format_weight: float) -> tuple[float, float]:
    """(format share, correct share) of the weighted sum; their sum is the reward."""
    return format_weight * fmt, (1.0 - format_weight) * correct


def exact_match(answer: str, got: str) -> float:
    """1.0 when the stripped strings are equal, else 0.0."""
    return 1.0 if got.strip() == answer.strip() else 0.0


def numeric_or_exact_match(answer: str, completion: str) -> float:
    """1.0 when the stripped strings are equal, or both parse as finite numbers within 1e-6."""
    got, want = completion.strip(), answer.strip()
    if got == want:
        return 1.0
    try:
        a, b = float(got), float(want)
    except ValueError:
        return 0.0
    return 1.0 if math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-6 else 0.0


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise ValueError(
            f"reward math_verify: needs the optional math-verify package ({TASKS_EXTRA})"
        ) from None
    return math_verify


def _parse_math(text: str, timeout: int | None, *, as_math: bool) -> Any:
    """math-verify's parse of ``text``. ``as_math``: ``text`` is an answer and nothing else, so
    it is read as one LaTeX expression first (math-verify finds LaTeX only inside ``$...$`` or
    ``\\boxed{}``: bare ``\\sqrt{4}`` parses to nothing and bare ``x^2 + 1`` to its last number,
    1). Otherwise ``text`` is free text (a whole completion) and math-verify's own extraction
    runs (the last boxed or final expression); wrapping free text would read ``so 42`` as
    ``s*o*42``."""
    parse = _math_verify().parse
    plain = text.strip()
    if as_math and plain and "$" not in plain and "\\boxed" not in plain:
        found = parse(f"${plain}$", parsing_timeout=timeout)
        if found:
            return found
    return parse(text, parsing_timeout=timeout)


# Seconds of CPU time for each of math-verify's steps on one completion (each parse, then the
# comparison). CPU time, not wall time: beside other busy processes a parse spends most of its
# wall time waiting for a core (0.1 s of CPU took 1.1 s of wall beside six of them), and a
# 5 s wall bound then scored right answers 0; a runaway expression still uses up its seconds.
MATH_VERIFY_CPU_S = 5.0
# math-verify's own wall-clock alarm, kept as a backstop against a hang only.
_MATH_VERIFY_WALL_S = 300


class _OverBudget(BaseException):
    """A math-verify step used up its CPU time (a BaseException: math-verify and sympy catch
    ``Exception`` around their own steps, and would swallow it)."""


@functools.lru_cache(maxsize=65_536)
def _parsed_gold(answer: str, timeout: int | None) -> Any:
    # The reference answer is parsed once per distinct answer, not once per completion.
    return _parse_math(answer, timeout, as_math=True)


def math_verify_match(answer: str, got: str, *, answer_only: bool = True) -> float:
    """1.0 when ``math_verify`` finds ``got`` equivalent to the reference ``answer``
    (``\\frac{1}{2}`` and ``0.5``; ``\\boxed{2}`` and ``2``), else 0.0. ``answer_only``: ``got``
    is an extracted answer (``tag``/``last_line``); otherwise a whole completion, from which
    math-verify extracts the last boxed or final expression itself.

    Each parse and the comparison get :data:`MATH_VERIFY_CPU_S` of CPU time (a runaway sympy
    computation scores 0), in the main thread only: the bound is a signal timer, and signals
    reach the main thread alone; elsewhere (a thread pool) it runs unbounded."""
    mv = _math_verify()
    main = threading.current_thread() is threading.main_thread()
    backstop = _MATH_VERIFY_WALL_S if main else None
    try:
        with time_bound(MATH_VERIFY_CPU_S, _OverBudget, cpu=True):
            gold = _parsed_gold(answer, backstop)
        with time_bound(MATH_VERIFY_CPU_S, _OverBudget, cpu=True):
            pred = _parse_math(got, backstop, as_math=answer_only)
        if not gold or not pred:
            return 0.0
        with time_bound(MATH_VERIFY_CPU_S, _OverBudget, cpu=True):
            ok = mv.verify(gold, pred, timeout_seconds=backstop)
    except _OverBudget:
        return 0.0
    except Exception:  # model output is arbitrary text: a comparison that fails is no match
        return 0.0
    return 1.0 if ok else 0.0


MATCHERS: dict[str, Callable[[str, str], float]] = {
    "exact": exact_match,
    "numeric": numeric_or_exact_match,
    "math_verify": math_verify_match,
}


def check_match_rule(spec: str, reward: str, answer_format: str) -> Callable[[str, str], float]:
    """The matcher named ``reward`` for answers extracted by ``answer_format``; for
    ``math_verify`` the package must be importable."""
    if reward == "math_verify":
        try:
            _math_verify()
        except ValueError as err:
            raise ValueError(f"task '{spec}': {err}") from None
        answer_only = answer_format != "raw"
        return lambda answer, got: math_verify_match(answer, got, answer_only=answer_only)
    return MATCHERS[reward]


@dataclass(frozen=True)
class AnswerSpec:
    """How a completion becomes a reward: where its answer is, the format checks, the weight."""

    answer_format: str = "raw"
    format_weight: float = 0.0
    think: bool = False

    def extract(self, completion: str) -> str | None:
        return extract_answer(completion, self.answer_format)

    def parts(self, completion: str, correct: Callable[[str | None], float]) -> tuple[float, float]:
        """(format share, correct share) for ``completion``; ``correct`` scores its extracted
        answer (None when there is none)."""
        got = self.extract(completion)
        right = float(correct(got))
        fmt = format_score(completion, self.answer_format, self.think)
        return compose(right, fmt, self.format_weight)

    def demonstration(self, answer: str) -> str:
        """The ideal completion for ``answer``: what the warm start imitates."""
        body = f"<answer>{answer}</answer>" if self.answer_format == "tag" else answer
        return f"<think></think>{body}" if self.think else body

    def instruction(self) -> str:
        """One sentence telling a model the expected format (appended to generated prompts)."""
        where = {
            "tag": "inside <answer></answer> tags",
            "last_line": "on the last line",
            "raw": "and nothing else",
        }[self.answer_format]
        think = "Think inside <think></think> tags first, then give" if self.think else "Give"
        return f"{think} your final answer {where}."

    def options(self) -> dict[str, object]:
        return {
            "answer_format": self.answer_format,
            "format_weight": self.format_weight,
            "think": self.think,
        }


__all__ = [
    "ANSWER_FORMATS",
    "MATCHERS",
    "MATCH_RULES",
    "TASKS_EXTRA",
    "AnswerSpec",
    "check_match_rule",
    "compose",
    "exact_match",
    "extract_answer",
    "format_score",
    "math_verify_match",
    "numeric_or_exact_match",
]
