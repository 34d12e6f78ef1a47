"""``rg:NAME``: procedural reasoning tasks from the reasoning-gym package, scored by their own
verifiers (``countdown``, ``knights_knaves``, ``basic_arithmetic``, ``gsm_symbolic``, ... every
generator registered in ``reasoning_gym.factory.DATASETS``; nothing is downloaded).

Pools. A reasoning-gym generator makes item ``i`` from ``Random(seed + i)``, so a (seed, index)
pair names an item on every machine. With ``task_options.seed`` (default 0; the pool, not the run
seed: every run of an ablation sees the same held-out set) and ``size`` (default: the generator's
own, 500 for most):

* the held-out pool is the distinct questions of items ``size .. size + eval_size - 1``
  (``eval_size``, default 128; the generator is built with ``size + eval_size`` items);
* training draws item ``rng.randrange(size)`` and redraws any whose question is held out, so no
  training prompt ever equals an evaluation prompt (generators with small spaces repeat
  questions across indices; the index ranges alone would not keep the pools apart).

Prompt: the generator's question, a blank line, then one sentence asking for the answer format
(``answer_format``: ``tag`` by default, or ``last_line``/``raw``). Reward: the generator's own
``score_answer`` on the extracted answer, composed with the format reward by ``format_weight``
(:mod:`harness.tasks.answers`). Demonstration (the warm start): the generator's reference answer
in that format.

Every other option is the generator's own config field (``min_numbers``, ``n_people``,
``difficulty``, ...), checked against its config dataclass before anything is generated.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import random
import time
import types
import typing
from collections.abc import Hashable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, get_args, get_origin

from harness.core import limits
from harness.core.configtools import ConfigError, check_value
from harness.core.fields import meta
from harness.tasks.answers import TASKS_EXTRA, AnswerSpec
from harness.tasks.base import Example, draw_keys

# Options the harness reads itself (beside the generator's config fields).
HARNESS_OPTIONS = ("answer_format", "eval_size", "format_weight", "think")
# The generator's ints have no declared range; these bound them (a --set of 10**30 must be
# refused, not sent into a generator loop). Generators check their own ranges after this.
_INT_BOUND = 10**9
# The training pool's items (``size``); a run draws steps x prompts_per_step of them, far fewer.
# Some generators build a table of ``size`` entries up front (10^8 was a MemoryError).
_SIZE_MAX = 10**6
# Options inside their type's range that make each item (or the generator's construction)
# explode: a loop over 2^n_people assignments, 10^max_digits arithmetic in one C call that no
# timer interrupts, a whole pool built up front. The maximums keep one item well under a second
# and its prompt well under the MAX_TEXT_CHARS bound; a min_ option is bounded with its max_.
EXPENSIVE_OPTIONS: dict[str, dict[str, int]] = {
    "acre": {"size": 5_000},  # builds every item in __init__ (~6 ms each)
    "basic_arithmetic": {
        "min_terms": 1_000,
        "max_terms": 1_000,
        "min_digits": 10,
        "max_digits": 10,
    },
    "chain_sum": {"min_terms": 1_000, "max_terms": 1_000, "min_digits": 100, "max_digits": 100},
    "count_primes": {"min_n": 10**6, "max_n": 10**6},  # a sieve of max_n entries, up front
    "countdown": {"min_numbers": 15, "max_numbers": 15},  # sympy search over the numbers
    "decimal_chain_sum": {
        "min_terms": 1_000,
        "max_terms": 1_000,
        "min_digits": 100,
        "max_digits": 100,
    },
    "knights_knaves": {"n_people": 8, "depth_constraint": 3, "width_constraint": 3},
    "power_function": {"min_exponent": 1_000, "max_exponent": 1_000},
    "products": {"min_terms": 20, "max_terms": 20, "min_digits": 100, "max_digits": 100},
}
# Generated items kept per task object, so the probe's draws and the scoring of a step do not
# generate an item twice (countdown takes ~20-50 ms an item); past this, the cache starts over.
_CACHE_MAX = 200_000


def _reasoning_gym(spec: str) -> Any:
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError:
        raise ValueError(
            f"task '{spec}': needs the optional reasoning-gym package ({TASKS_EXTRA})"
        ) from None
    return reasoning_gym


def _installed_version() -> str:
    # The distribution's version: reasoning_gym.__version__ lags it (0.1.19 in 0.1.25).

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return ""


def _check_field(value: Any, tp: Any, path: str) -> Any:
    """``value`` converted to the generator field type ``tp`` (one-line ConfigError)."""
    origin = get_origin(tp)
    if tp is tuple or tp is list or origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: must be a list; got {value!r}")
        args = [a for a in get_args(tp) if a is not Ellipsis]
        item_tp = args[0] if len(set(args)) == 1 else Any
        items = [_check_field(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (tp is tuple or origin is tuple) else items
    if tp is int:
        return check_value(value, int, meta("", ge=-_INT_BOUND, le=_INT_BOUND), path)
    if tp in (float, bool, str) or origin is typing.Literal:
        return check_value(value, tp, {}, path)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(get_args(tp)):
            return None
        errors = []
        for arg in args:
            try:
                return _check_field(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        raise errors[0]
    return value  # a type the harness does not know: the generator's validate() checks it


class _GeneratorTimeout(BaseException):
    """A generator ran past its time bound.  A BaseException, because generators catch
    ``Exception`` around their own retry loops and would swallow an ``Exception``."""


def _bounded(seconds: float, call: Any) -> Any:
    """``call()`` under a wall-clock bound of ``seconds``: :class:`_GeneratorTimeout` when the
    timer fires, or when ``call`` outran the bound without the timer stopping it (a thread other
    than the main one, or a generator that caught the timeout and went on)."""
    start = time.monotonic()
    with limits.time_bound(seconds, _GeneratorTimeout):
        out = call()
    if time.monotonic() - start > seconds:
        raise _GeneratorTimeout
    return out


class ReasoningGymTask:
    """One reasoning-gym generator as a :class:`~harness.tasks.base.Task` (module docstring)."""

    def __init__(
        self,
        spec: str,
        generator: str,
        config: Any,
        *,
        seed: int,
        size: int,
        eval_size: int,
        answer_spec: AnswerSpec,
        version: str,
    ) -> None:
        rg = _reasoning_gym(spec)
        cls, _ = rg.factory.DATASETS[generator]
        self.name = spec
        self.generator = generator
        self.seed = seed
        self.size = size
        self.eval_size = eval_size
        self.answer_spec = answer_spec
        try:
            self._dataset = _bounded(limits.TASK_BUILD_SECONDS, lambda: cls(config=config))
        except _GeneratorTimeout:
            raise ValueError(
                f"task '{spec}': building the {generator} generator took more than "
                f"{limits.TASK_BUILD_SECONDS:g} s; lower task_options.size or the options that "
                "make its items large"
            ) from None
        self._config = dataclasses.asdict(config)
        self._items: dict[int, dict[str, Any]] = {}
        self._held_out: list[Example] | None = None
        self._held_prompts: set[str] = set()
        self.fingerprint = json.dumps(
            {
                "task": spec,
                "reasoning_gym": version,
                "config": self._config,
                "seed": seed,
                "size": size,
                "eval_size": eval_size,
                **answer_spec.options(),
            },
            sort_keys=True,
            default=str,
        )

    # ---- items
    def _item(self, idx: int) -> dict[str, Any]:
        item = self._items.get(idx)
        if item is None:
            bound = limits.TASK_ITEM_SECONDS
            try:
                item = _bounded(bound, lambda: self._dataset[idx])
            except _GeneratorTimeout:
                raise ValueError(
                    f"task '{self.name}': the generator took more than {bound:g} s on item "
                    f"{idx}; lower the options that make its items large or hard"
                ) from None
            except Exception as err:  # a config the generator accepts but cannot draw from
                first = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ValueError(
                    f"task '{self.name}': the generator failed on item {idx} ({first}); "
                    "change its options"
                ) from None
            self._check_size(idx, item)
            if len(self._items) >= _CACHE_MAX:
                self._items.clear()
            self._items[idx] = item
        return item

    def _check_size(self, idx: int, item: Any) -> None:
        """An item's question and answer are bounded like a data file's prompt and answer (one
        chain_sum item of 10^6 terms was 7 MB; validation reached 5 GB probing such items)."""
        if not isinstance(item, dict) or "question" not in item:
            raise ValueError(
                f"task '{self.name}': the generator returned {type(item).__name__} for item "
                f"{idx}, not an item with a question"
            )
        for key in ("question", "answer"):
            text = item.get(key)
            n = len(text) if isinstance(text, str) else 0
            if n > limits.MAX_TEXT_CHARS:
                raise ValueError(
                    f"task '{self.name}': {self._source(idx)}: its {key} is {n:,} characters; "
                    f"at most {limits.MAX_TEXT_CHARS:,} (lower the options that make items large)"
                )

    def _prompt(self, item: dict[str, Any]) -> str:
        return f"{str(item['question']).rstrip()}\n\n{self.answer_spec.instruction()}"

    def _source(self, idx: int) -> str:
        return f"{self.generator} item {idx} (seed {self.seed})"

    def _example(self, idx: int) -> Example:
        item = self._item(idx)
        answer = item.get("answer")
        return Example(
            prompt=self._prompt(item),
            answer="" if answer is None else str(answer),
            group=self.generator,
            source=self._source(idx),
        )

    def _held(self) -> list[Example]:
        if self._held_out is None:
            seen: set[str] = set()
            out = []
            for idx in range(self.size, self.size + self.eval_size):
                ex = self._example(idx)
                if ex.prompt not in seen:
                    seen.add(ex.prompt)
                    out.append(ex)
            self._held_out, self._held_prompts = out, seen
        return self._held_out

    # ---- the Task protocol
    @property
    def max_new_tokens_hint(self) -> int:
        return max((len(self.demonstration(ex)) for ex in self._held()), default=0) + 2

    def sample(self, rng: random.Random, n: int) -> list[Example]:
        self._held()

        def draw(r: random.Random) -> Hashable:
            return r.randrange(self.size)

        def keep(idx: Hashable) -> bool:
            return self._example(int(str(idx))).prompt not in self._held_prompts

        keys = draw_keys(rng, n, draw, keep, unique=False, max_tries=max(1000, 50 * n))
        if len(keys) < n:
            raise ValueError(
                f"task '{self.name}': the training pool (size {self.size}) has almost no "
                "question outside the held-out pool; raise task_options.size or lower eval_size"
            )
        return [self._example(int(str(k))) for k in keys]

    def eval_examples(self, n: int) -> list[Example]:
        return self._held()[:n]

    def extreme_examples(self, k: int) -> list[Example]:
        """The held-out pool's ``k`` longest prompts and answers (the probe sees the rest)."""
        rows = self._held()
        return (
            sorted(rows, key=lambda e: len(e.prompt))[-k:]
            + sorted(rows, key=lambda e: len(e.answer))[-k:]
        )

    def _entry(self, example: Example) -> dict[str, Any]:
        """The generator's item behind ``example`` (its verifier reads the metadata: countdown's
        numbers and target). Found by the item index in ``source`` and regenerated if the cache
        let it go, so the cache bound never costs a right score."""
        head, _, rest = example.source.partition(" item ")
        idx_text, _, tail = rest.partition(" ")
        if head == self.generator and idx_text.isdigit() and tail == f"(seed {self.seed})":
            item = self._item(int(idx_text))
            if self._prompt(item) == example.prompt:
                return item
        # An example built elsewhere: score against its stated answer alone.
        return {"question": example.prompt, "answer": example.answer, "metadata": {}}

    def _correct(self, example: Example, got: str | None) -> float:
        if got is None:
            return 0.0
        try:
            value = float(self._dataset.score_answer(got, self._entry(example)))
        except Exception:  # model output is arbitrary text: a verifier that raises rejected it
            return 0.0
        return value if 0.0 <= value <= 1.0 else 0.0

    def score_parts(self, example: Example, completion: str) -> tuple[float, float]:
        """(format share, correct share); they add up to :meth:`score`."""
        return self.answer_spec.parts(completion, lambda got: self._correct(example, got))

    def score(self, example: Example, completion: str) -> float:
        fmt, correct = self.score_parts(example, completion)
        return fmt + correct

    def demonstration(self, example: Example) -> str:
        return self.answer_spec.demonstration(example.answer)


def reasoning_task(spec: str, generator: str, options: dict[str, Any]) -> ReasoningGymTask:
    """Build ``rg:GENERATOR`` from ``options``: the harness's own (``answer_format``,
    ``eval_size``, ``format_weight``, ``think``, all given, checked by the caller: the source's
    options block in :mod:`harness.tasks.sources.rg`) and the generator's config fields, checked
    here against its dataclass. Raises a one-line ``ValueError``."""
    rg = _reasoning_gym(spec)
    datasets = rg.factory.DATASETS
    if generator not in datasets:
        # reasoning-gym ships ~100 generators: name the close ones, not all of them
        close = difflib.get_close_matches(generator, sorted(datasets), n=5, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "no installed name is close"
        raise ValueError(
            f"task '{spec}': unknown reasoning-gym generator '{generator}' ({hint}; "
            f"{len(datasets)} installed, listed by reasoning_gym.factory.DATASETS)"
        )
    _, config_cls = datasets[generator]
    hints = typing.get_type_hints(config_cls)
    fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
    gen_opts = {k: v for k, v in options.items() if k not in HARNESS_OPTIONS}
    unknown = sorted(set(gen_opts) - fields)
    if unknown:
        allowed = sorted(fields | set(HARNESS_OPTIONS))
        raise ValueError(
            f"task '{spec}': unknown option(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})"
        )
    checked = {}
    for key, value in gen_opts.items():
        path = f"task_options.{key}"
        if key == "seed":
            checked[key] = check_value(value, int, meta("", ge=0, le=2**32 - 1), path)
        elif key == "size":
            checked[key] = check_value(value, int, meta("", ge=1, le=_SIZE_MAX), path)
        else:
            checked[key] = _check_field(value, hints.get(key, Any), path)
    for key, top in EXPENSIVE_OPTIONS.get(generator, {}).items():
        if key in checked and isinstance(checked[key], int) and checked[key] > top:
            raise ValueError(
                f"task_options.{key}: must be at most {top:,} for {spec} (larger values make "
                f"each item too slow or too large to generate); got {checked[key]:,}"
            )
    checked.setdefault("seed", 0)  # the generator's None would be a random pool per process
    try:
        config = config_cls(**checked)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as err:  # generators check with assert, ValueError, ...: all bad input
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"task '{spec}': invalid options for {generator} ({first})") from None
    answer_spec = AnswerSpec(
        options["answer_format"], float(options["format_weight"]), bool(options["think"])
    )
    size = int(getattr(config, "size", 500) or 500)
    eval_size = int(options["eval_size"])
    if "size" in fields:  # some generators index per-item tables of `size` rows: cover both pools
        config = dataclasses.replace(config, size=size + eval_size)
    return ReasoningGymTask(
        spec,
        generator,
        config,
        seed=int(config.seed),
        size=size,
        eval_size=eval_size,
        answer_spec=answer_spec,
        version=_installed_version(),
    )


__all__ = ["HARNESS_OPTIONS", "ReasoningGymTask", "reasoning_task"]
