"""Tasks over a fixed list of prompt/answer pairs (``jsonl:``, ``csv:``, ``hf:``, ``python:``):
their shared options, the task itself and the scoring of a file of pairs.

Held-out split: the distinct prompts are ranked by ``stable_hash(prompt)`` and the first
``max(1, round(eval_fraction * n_prompts))`` form the evaluation set; every row whose prompt is
held out is evaluation-only, so a duplicated prompt can never leak into training. (A file with a
single distinct prompt cannot be split: it is used for both, and the task says so in its
``split_note``.)

Each source builds its task in its own module (:mod:`harness.tasks.sources`); the rows are read
by :mod:`harness.tasks.records`.  The completion handed to a scorer is the generated text up to
EOS with surrounding whitespace stripped, as for every task.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from harness.core import limits
from harness.core.fields import option
from harness.tasks.answers import (
    AnswerOptions,
    AnswerSpec,
    MatchRule,
    check_match_rule,
    extract_answer,
    math_verify_match,
)
from harness.tasks.base import Example, stable_hash
from harness.tasks.records import file_digest
from harness.tasks.registry import Builder, TaskOptions, TaskSource, nonempty_argument


@dataclass(frozen=True)
class HeldOutOptions(TaskOptions):
    """The held-out share of a task over a fixed list of pairs."""

    eval_fraction: float = option(0.1, "share of prompts held out.", gt=0, lt=1)


@dataclass(frozen=True)
class DataLimitOptions(TaskOptions):
    """How much data a task over a fixed list of pairs may read (``docs/limits.md``): the
    defaults are :mod:`harness.core.limits`' bounds, each movable up to a ceiling of its own."""

    max_rows: int = option(
        limits.MAX_TASK_ROWS,
        "most rows the data may hold (raise it for a bigger dataset; up to 10^8).",
        ge=1,
        le=limits.CEILING_TASK_ROWS,
    )
    max_file_mib: int = option(
        limits.MAX_TASK_FILE_BYTES // limits.MIB,
        "most MiB of data files read (up to 16384).",
        ge=1,
        le=limits.CEILING_TASK_FILE_MIB,
    )
    max_data_mib: int = option(
        limits.MAX_TASK_DATA_BYTES // limits.MIB,
        "most MiB the prompts and answers may decode to (up to 65536).",
        ge=1,
        le=limits.CEILING_TASK_DATA_MIB,
    )

    def bounds(self) -> limits.DataBounds:
        """The bounds the ``max_rows`` / ``max_file_mib`` / ``max_data_mib`` options give."""
        return limits.DataBounds.from_options(self.max_rows, self.max_file_mib, self.max_data_mib)


@dataclass(frozen=True)
class _Match(HeldOutOptions):
    reward: MatchRule = option(
        "numeric", "answer check: exact string, numeric (or exact), math_verify."
    )


# eval_fraction and reward first, then the answer options, then the data bounds (a dataclass
# lists its bases' fields from the last base to the first).
@dataclass(frozen=True)
class PairOptions(DataLimitOptions, AnswerOptions, _Match):
    """The options of a file of prompt/answer pairs (``jsonl:``, ``hf:``, ``csv:``)."""


class PairTask:
    """Examples from a list, split deterministically into train and held-out by prompt hash.

    Without ``answer_spec`` the scorer sees the whole stripped completion (``python:``); with
    one, it sees the extracted answer and the reward is the spec's weighted sum
    (:mod:`harness.tasks.answers`)."""

    def __init__(
        self,
        name: str,
        examples: list[Example],
        scorer: Callable[[Example, str], float],
        *,
        eval_fraction: float = 0.1,
        fingerprint: str = "",
        answer_spec: AnswerSpec | None = None,
        options: dict[str, object] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._on_close = on_close
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"task '{name}': eval_fraction must be in (0, 1); got {eval_fraction}")
        self.name = name
        self._scorer = scorer
        self.answer_spec = answer_spec
        self.eval_fraction = eval_fraction
        # Non-default scoring options only, so the fingerprint (a warm-start cache key) of a
        # task configured as before stays what it was.
        self.fingerprint = json.dumps(
            {"task": name, "data": fingerprint, "eval_fraction": eval_fraction, **(options or {})},
            sort_keys=True,
        )
        prompts = sorted({ex.prompt for ex in examples}, key=lambda s: (stable_hash(s), s))
        self.split_note = ""
        if len(prompts) == 1:
            held = set(prompts)
            self.split_note = "only one distinct prompt: it is used for training and evaluation"
            self.train = list(examples)
        else:
            k = max(1, round(eval_fraction * len(prompts)))
            held = set(prompts[:k])
            self.train = [ex for ex in examples if ex.prompt not in held]
        rank = {p: i for i, p in enumerate(prompts)}
        self.held_out = sorted(
            (ex for ex in examples if ex.prompt in held), key=lambda e: rank[e.prompt]
        )
        longest = max(len(self.demonstration(ex)) for ex in examples)
        self.max_new_tokens_hint = longest + 2

    def sample(self, rng: random.Random, n: int) -> list[Example]:
        return [rng.choice(self.train) for _ in range(n)]

    def close(self) -> None:
        """Release what scoring holds (a ``python:`` reward's process); scoring again after
        this starts it anew."""
        if self._on_close is not None:
            self._on_close()

    def eval_examples(self, n: int) -> list[Example]:
        return self.held_out[:n]

    def extreme_examples(self, k: int) -> list[Example]:
        """The ``k`` shortest and longest prompts and the ``k`` longest answers (in characters)
        of train and held-out, so a length probe that samples a few hundred rows never misses
        one outlier row."""
        rows = [*self.train, *self.held_out]
        by_prompt = sorted(rows, key=lambda e: len(e.prompt))
        by_answer = sorted(rows, key=lambda e: len(e.answer))
        return by_prompt[:k] + by_prompt[-k:] + by_answer[-k:]

    def score(self, example: Example, completion: str) -> float:
        fmt, correct = self.score_parts(example, completion)
        return fmt + correct

    def score_parts(self, example: Example, completion: str) -> tuple[float, float]:
        """(format share, correct share) of the reward; the format share is 0 without a spec."""
        spec = self.answer_spec
        if spec is None:
            return 0.0, self._scorer(example, completion.strip())
        return spec.parts(
            completion, lambda got: self._scorer(example, got) if got is not None else 0.0
        )

    def demonstration(self, example: Example) -> str:
        spec = self.answer_spec
        return spec.demonstration(example.answer) if spec is not None else example.answer


Scoring = tuple[Callable[[Example, str], float], AnswerSpec, dict[str, object]]


def answer_options(spec: str, o: PairOptions) -> Scoring:
    """The scorer, the answer spec and the non-default options (for the fingerprint) of a file
    task's scoring options."""
    match = check_match_rule(spec, o.reward, o.answer_format)
    answer_spec = AnswerSpec(o.answer_format, o.format_weight, o.think)
    defaults = {"reward": "numeric", **AnswerSpec().options()}
    chosen = {"reward": o.reward, **answer_spec.options()}
    changed = {k: v for k, v in chosen.items() if v != defaults[k]}
    return (lambda ex, got: match(ex.answer, got)), answer_spec, changed


def file_task(
    spec: str,
    o: PairOptions,
    examples: list[Example],
    scoring: Scoring,
    fingerprint: str,
    options: Mapping[str, object] | None = None,
) -> PairTask:
    """The task of a file of pairs (``jsonl:``, ``csv:``, ``hf:``): ``examples`` scored as
    ``scoring`` (:func:`answer_options` of ``o``, called before the file is read so that a bad
    option is refused first), its reference answers checked to score as right."""
    scorer, answer_spec, changed = scoring
    task = PairTask(
        spec,
        examples,
        scorer,
        eval_fraction=o.eval_fraction,
        fingerprint=fingerprint,
        answer_spec=answer_spec,
        options={**(options or {}), **changed},
    )
    check_reference_answers(task, o.reward)
    return task


class PairReader(Protocol):
    """How a file source reads its pairs: the examples of ``path`` within ``bounds``."""

    def __call__(self, spec: str, path: str, /, *, bounds: limits.DataBounds) -> list[Example]: ...


def pair_file_task(spec: str, path: str, o: PairOptions, read: PairReader) -> PairTask:
    """The task of the file of pairs ``path`` (``jsonl:``, ``csv:``), its rows read by ``read``
    within ``o``'s bounds and fingerprinted by the file's bytes (:func:`file_task`)."""
    scoring = answer_options(spec, o)  # before the file is read: a bad option is refused first
    return file_task(spec, o, read(spec, path, bounds=o.bounds()), scoring, file_digest(path))


def pair_file_source(
    form: str, summary: str, build: Builder, *, rank: int, field_help: str
) -> TaskSource:
    """The source of a file of pairs named by its path (``jsonl:PATH``, ``csv:PATH``): an empty
    path is refused before any option is read, and the options are :class:`PairOptions`."""
    return TaskSource(
        form=form,
        summary=summary,
        build=build,
        options=PairOptions,
        rank=rank,
        argument=nonempty_argument(form),
        field_help=field_help,
    )


#: Distinct reference answers the self-check scores (math-verify takes ~0.1 s an answer).
GOLD_CHECK = 64


def check_reference_answers(task: PairTask, reward: str) -> None:
    """Refuse a reward that cannot score a task's own reference answers as right.

    Each checked answer's ideal completion (``demonstration``) is scored by the task's reward;
    its correct share must be full.  Only ``math_verify`` can fail this (exact and numeric
    match a string to itself): on answers that are not math (``Paris``), or written bare in
    ``answer_format: raw`` where math-verify's free-text extraction misses them (``x^2+1``),
    the right completion would score 0 and a run would train on all-zero rewards.  The first
    ``GOLD_CHECK`` distinct answers by stable hash are checked (a spread over the file)."""
    if reward != "math_verify" or task.answer_spec is None:
        return
    spec = task.answer_spec
    rows: dict[str, Example] = {}
    for ex in [*task.train, *task.held_out]:
        rows.setdefault(ex.answer, ex)
    chosen = sorted(rows, key=lambda a: (stable_hash(a), a))[:GOLD_CHECK]
    bad = [a for a in chosen if not _scores_itself(task, rows[a], spec.answer_format)]
    if bad:
        ex = rows[bad[0]]
        raise ValueError(
            f"task '{task.name}': task_options.reward: math_verify scores {len(bad)} of "
            f"{len(chosen)} checked reference answers 0 against themselves (e.g. {ex.source}: "
            f"{ex.answer[:60]!r}); use reward exact or numeric for answers that are not math, "
            "or an answer_format of tag or last_line"
        )


def _scores_itself(task: PairTask, ex: Example, answer_format: str) -> bool:
    return _gold_self_score(ex.answer, task.demonstration(ex), answer_format) >= 1.0


@functools.lru_cache(maxsize=65_536)
def _gold_self_score(answer: str, demonstration: str, answer_format: str) -> float:
    # Cached: a grid builds the same task once per checked value.

    got = extract_answer(demonstration, answer_format)
    if got is None:
        return 0.0
    return math_verify_match(answer, got, answer_only=answer_format != "raw")


__all__ = [
    "DataLimitOptions",
    "HeldOutOptions",
    "PairOptions",
    "PairReader",
    "PairTask",
    "Scoring",
    "answer_options",
    "check_reference_answers",
    "file_task",
    "pair_file_source",
    "pair_file_task",
]
