"""Tasks over a fixed list of prompt/answer pairs: ``jsonl:PATH`` and ``python:MODULE:FUNCTION``.

Held-out split: the distinct prompts are ranked by ``stable_hash(prompt)`` and the first
``max(1, round(eval_fraction * n_prompts))`` form the evaluation set; every row whose prompt is
held out is evaluation-only, so a duplicated prompt can never leak into training. (A file with a
single distinct prompt cannot be split: it is used for both, and the task says so in its
``split_note``.)

``python:`` tasks run the user's own code, imported with the harness's privileges: only use
modules you trust. Spec forms:

* ``python:MODULE:FUNCTION`` -- ``MODULE`` (a dotted module importable from ``sys.path`` or the
  current directory, or a path to a ``.py`` file) defines ``FUNCTION(prompt, completion,
  answer) -> float`` and ``examples()`` returning a list of ``{"prompt": str, "answer": str}``
  dicts (the answer may be ``""`` when the function needs none);
* ``python:MODULE:FUNCTION@PATH.jsonl`` -- the examples come from a JSONL file instead.

The completion handed to the function is the generated text up to EOS with surrounding
whitespace stripped, as for every task.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from harness.core import limits
from harness.core.configtools import option
from harness.tasks.answers import (
    AnswerOptions,
    AnswerSpec,
    MatchRule,
    check_match_rule,
    extract_answer,
    math_verify_match,
    numeric_or_exact_match,
)
from harness.tasks.base import Example, import_module, stable_hash
from harness.tasks.registry import TaskOptions
from harness.tasks.reward_process import START_TIMEOUT_S, RewardProcess


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


def data_bounds(max_rows: int, max_file_mib: int, max_data_mib: int) -> limits.DataBounds:
    """The bounds a task's ``max_rows`` / ``max_file_mib`` / ``max_data_mib`` options give."""
    return limits.DataBounds.from_options(max_rows, max_file_mib, max_data_mib)


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


def answer_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return None


def pairs_from_records(
    spec: str,
    where: str,
    records: Iterable[tuple[int, Any]],
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    row: str = "",
    only_fields: bool = True,
    bounds: limits.DataBounds = limits.DEFAULT_DATA_BOUNDS,
) -> list[Example]:
    """``where`` names the file ("PATH", rows are "line N") or "examples()" (rows are "item N");
    ``row`` overrides the row word ("row" for a dataset).

    Every row must carry both keys: a missing answer read as ``""`` would score an empty
    completion 1.0.  ``only_fields``: any other key is refused too (a misspelt ``anwser``); a
    dataset whose extra columns are ordinary (``hf:``) passes False.  The prompts and answers
    together may hold at most ``bounds.data_bytes`` of UTF-8 text (what ``hf:`` measures in its
    columns before decoding; here, for JSONL, CSV and ``examples()``, as the rows arrive)."""
    row = row or ("item" if where == "examples()" else "line")
    allowed = (prompt_field, answer_field)
    out = []
    nbytes = 0
    for lineno, obj in records:
        at = f"task '{spec}': {where} {row} {lineno}"
        if isinstance(obj, dict):
            missing = [k for k in allowed if k not in obj]
            extra = [k for k in obj if k not in allowed] if only_fields else []
            if extra:
                raise ValueError(
                    f"{at}: unknown key {str(extra[0])!r} (allowed: '{prompt_field}', "
                    f"'{answer_field}')"
                )
            if missing:
                raise ValueError(
                    f"{at}: missing key '{missing[0]}' (each row needs '{prompt_field}' and "
                    f"'{answer_field}'; give \"\" for an answer the reward does not use)"
                )
        prompt = obj.get(prompt_field) if isinstance(obj, dict) else None
        answer = answer_text(obj.get(answer_field)) if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or answer is None:
            raise ValueError(
                f"{at}: expected an object with a string '{prompt_field}' and a string or number "
                f"'{answer_field}'"
            )
        if not prompt:  # no tokens to condition on: an IndexError in the first rollout
            raise ValueError(
                f"{at}: '{prompt_field}' is empty (a prompt needs at least one character)"
            )
        for key, text in ((prompt_field, prompt), (answer_field, answer)):
            if len(text) > limits.MAX_TEXT_CHARS:
                raise ValueError(
                    f"{at}: '{key}' is {len(text):,} characters; at most {limits.MAX_TEXT_CHARS:,}"
                )
        nbytes += _utf8_size(prompt) + _utf8_size(answer)
        if nbytes > bounds.data_bytes:
            raise ValueError(
                bounds.data_refusal(
                    f"task '{spec}': the prompts and answers of {where} up to {row} {lineno} "
                    f"hold {nbytes:,} bytes"
                )
            )
        out.append(Example(prompt=prompt, answer=answer, source=f"{where} {row} {lineno}"))
    if not out:
        raise ValueError(f"task '{spec}': {where} holds no examples")
    return out


def _utf8_size(text: str) -> int:
    # isascii() reads a flag CPython keeps on the string: only non-ASCII text is encoded.
    return len(text) if text.isascii() else len(text.encode())


def utf8_lines(spec: str, path: str, fh: BinaryIO) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a task file opened for bytes, decoded as UTF-8; a byte that is
    not UTF-8 is one error naming its line."""
    for lineno, raw in enumerate(fh, start=1):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"task '{spec}': {path} line {lineno}: is not valid UTF-8 (byte {exc.start} "
                "of the line)"
            ) from None


def read_jsonl(
    spec: str,
    path: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    only_fields: bool = True,
    bounds: limits.DataBounds = limits.DEFAULT_DATA_BOUNDS,
) -> list[Example]:
    """Parse a JSONL file of ``{"prompt": ..., "answer": ...}`` lines (blank lines skipped; the
    two field names are configurable). ``~`` is expanded; a relative path is relative to the
    current directory.

    Bounded before parsing: at most ``bounds.file_bytes`` (by default ``MAX_TASK_FILE_BYTES``,
    harness.core.limits) and ``bounds.rows`` rows, UTF-8 line by line (a bad byte names its
    line)."""
    p = Path(path).expanduser()
    kind = limits.not_regular(p)
    if kind is not None:  # never opened: a FIFO would block the read until a writer came
        raise ValueError(f"task '{spec}': '{path}' is {kind}, not a regular file")
    if not p.is_file():
        raise ValueError(f"task '{spec}': file '{path}' does not exist")
    records: list[tuple[int, Any]] = []
    try:
        fh = limits.open_bounded(
            p, bounds.file_bytes, "a task file", shown=path, option=bounds.file_option
        )
    except ValueError as err:
        raise ValueError(f"task '{spec}': {err}") from None
    with fh:
        for lineno, line in utf8_lines(spec, path, fh):
            if not line.strip():
                continue
            if len(records) >= bounds.rows:
                raise ValueError(
                    bounds.rows_refusal(
                        f"task '{spec}': {path} holds more than {bounds.rows:,} rows"
                    )
                )
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"task '{spec}': {path} line {lineno}: invalid JSON ({exc.msg})"
                ) from None
            except RecursionError:  # json nests by recursion: [[[[...]]]] deeper than Python's
                raise ValueError(
                    f"task '{spec}': {path} line {lineno}: JSON nested too deeply to read "
                    "(arrays or objects within each other past Python's recursion limit)"
                ) from None
    return pairs_from_records(
        spec,
        path,
        records,
        prompt_field=prompt_field,
        answer_field=answer_field,
        only_fields=only_fields,
        bounds=bounds,
    )


def file_digest(path: str | Path) -> str:
    # Read in blocks: a file a run allowed past the default bound need not be held twice.
    h = hashlib.sha256()
    with Path(path).expanduser().open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def answer_options(
    spec: str, reward: str, answer_format: str, format_weight: float, think: bool
) -> tuple[Callable[[Example, str], float], AnswerSpec, dict[str, object]]:
    """The scorer, the answer spec and the non-default options (for the fingerprint) of a file
    task's scoring options."""
    match = check_match_rule(spec, reward, answer_format)
    answer_spec = AnswerSpec(answer_format, format_weight, think)
    defaults = {"reward": "numeric", **AnswerSpec().options()}
    chosen = {"reward": reward, **answer_spec.options()}
    changed = {k: v for k, v in chosen.items() if v != defaults[k]}
    return (lambda ex, got: match(ex.answer, got)), answer_spec, changed


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


def jsonl_task(
    spec: str,
    path: str,
    *,
    eval_fraction: float,
    reward: str,
    answer_format: str,
    format_weight: float,
    think: bool,
    max_rows: int = limits.MAX_TASK_ROWS,
    max_file_mib: int = limits.MAX_TASK_FILE_BYTES // limits.MIB,
    max_data_mib: int = limits.MAX_TASK_DATA_BYTES // limits.MIB,
) -> PairTask:
    """``jsonl:PATH``: by default exact match, or numeric match within 1e-6 when both sides are
    numbers, of the whole completion; ``reward``/``answer_format``/``format_weight``/``think``
    as in :mod:`harness.tasks.answers`; ``max_*`` bound the data (:class:`DataLimitOptions`)."""
    scorer, answer_spec, changed = answer_options(spec, reward, answer_format, format_weight, think)
    bounds = data_bounds(max_rows, max_file_mib, max_data_mib)
    examples = read_jsonl(spec, path, bounds=bounds)
    task = PairTask(
        spec,
        examples,
        scorer,
        eval_fraction=eval_fraction,
        fingerprint=file_digest(path),
        answer_spec=answer_spec,
        options=changed,
    )
    check_reference_answers(task, reward)
    return task


def python_task(
    spec: str,
    target: str,
    *,
    eval_fraction: float,
    reward_timeout_s: float,
    max_rows: int = limits.MAX_TASK_ROWS,
    max_file_mib: int = limits.MAX_TASK_FILE_BYTES // limits.MIB,
    max_data_mib: int = limits.MAX_TASK_DATA_BYTES // limits.MIB,
) -> PairTask:
    """``python:MODULE:FUNCTION[@PATH.jsonl]`` (see the module docstring). Runs user code: the
    examples here, the reward in a child process with each call bounded by
    ``reward_timeout_s`` (:mod:`harness.tasks.reward_process`).  ``max_*`` bound the examples
    (:class:`DataLimitOptions`); ``max_file_mib`` only the ``@PATH.jsonl`` file, so it is
    refused without one (``examples()`` reads no file it could bound)."""
    target, _, data_path = target.partition("@")
    bounds = data_bounds(max_rows, max_file_mib, max_data_mib)
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
        make = getattr(mod, "examples", None)
        if not callable(make):
            raise ValueError(
                f"task '{spec}': module '{module}' defines no examples(); add one or use "
                f"python:{target}@PATH.jsonl"
            )
        try:
            records = list(itertools.islice(make(), bounds.rows + 1))
        except Exception as exc:
            raise ValueError(
                f"task '{spec}': examples() raised {type(exc).__name__}: {exc}"
            ) from exc
        if len(records) > bounds.rows:
            raise ValueError(
                bounds.rows_refusal(
                    f"task '{spec}': examples() returns more than {bounds.rows:,} examples"
                )
            )
        examples = pairs_from_records(
            spec, "examples()", enumerate(records, start=1), bounds=bounds
        )
        data = ""
    source = getattr(mod, "__file__", None)
    code = file_digest(source) if source and Path(source).is_file() else ""
    child = RewardProcess(spec, module, func_name, reward_timeout_s)

    def scorer(ex: Example, completion: str) -> float:
        where = (
            f"task '{spec}': {func_name}(prompt={ex.prompt[:40]!r}, completion={completion[:40]!r})"
        )
        return child.call(where, ex.prompt, completion, ex.answer)

    return PairTask(
        spec,
        examples,
        scorer,
        eval_fraction=eval_fraction,
        fingerprint=f"{code}:{data}",
        on_close=child.close,
    )


__all__ = [
    "DataLimitOptions",
    "HeldOutOptions",
    "PairOptions",
    "PairTask",
    "answer_options",
    "check_reference_answers",
    "answer_text",
    "data_bounds",
    "file_digest",
    "import_module",
    "jsonl_task",
    "numeric_or_exact_match",
    "pairs_from_records",
    "python_task",
    "read_jsonl",
]
