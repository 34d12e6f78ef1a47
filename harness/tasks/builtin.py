"""Built-in generated tasks on digit strings: reverse, add, sort, and the mixed-scale mixture.

Each is small enough that a 2-layer character model learns it on CPU in minutes, and each has
a canonical key per prompt so the held-out rule of :mod:`harness.tasks.base` applies.

Prompt formats (every prompt ends with ``=``, the answer follows directly):
``rev 40213=`` -> ``31204``; ``sort 40213=`` -> ``01234``; ``17+25=`` -> ``42``.
"""

from __future__ import annotations

import json
import math
import random

from harness.tasks.base import Example, draw_keys, is_held_out, position_credit


class _DigitTask:
    """Shared machinery: keys are strings; training draws avoid held-out keys."""

    name = "digits"
    max_new_tokens_hint = 8

    def _draw_key(self, rng: random.Random) -> str:
        raise NotImplementedError

    def _example(self, key: str) -> Example:
        raise NotImplementedError

    def _options(self) -> dict[str, object]:
        return {}

    @property
    def fingerprint(self) -> str:
        """Everything the task's prompts and scores depend on, as canonical JSON."""
        return json.dumps({"task": self.name, **self._options()}, sort_keys=True)

    def sample(self, rng: random.Random, n: int) -> list[Example]:
        keys = draw_keys(
            rng, n, self._draw_key, lambda k: not is_held_out(self.name, str(k)), unique=False
        )
        return [self._example(str(k)) for k in keys]

    def eval_examples(self, n: int) -> list[Example]:
        # A fixed stream of its own: eval_examples(k) is a prefix of eval_examples(k + 1).
        rng = random.Random(f"{self.name}|eval")
        keys = draw_keys(
            rng, n, self._draw_key, lambda k: is_held_out(self.name, str(k)), unique=True
        )
        return [self._example(str(k)) for k in keys]

    def demonstration(self, example: Example) -> str:
        return example.answer


class _DigitStringTask(_DigitTask):
    """A random digit string of length ``min_len..max_len`` (uniform length, then digits)."""

    verb = ""

    def __init__(self, *, min_len: int, max_len: int) -> None:
        if min_len > max_len:  # each one's range is declared with the source (tasks/sources)
            raise ValueError(
                f"task '{self.name}': need min_len <= max_len; got {min_len}, {max_len}"
            )
        self.min_len = min_len
        self.max_len = max_len
        self.max_new_tokens_hint = max_len + 2

    def _options(self) -> dict[str, object]:
        return {"min_len": self.min_len, "max_len": self.max_len}

    def _draw_key(self, rng: random.Random) -> str:
        length = rng.randint(self.min_len, self.max_len)
        return "".join(rng.choice("0123456789") for _ in range(length))

    def _answer(self, digits: str) -> str:
        raise NotImplementedError

    def _example(self, key: str) -> Example:
        return Example(prompt=f"{self.verb} {key}=", answer=self._answer(key), group=self.name)

    def score(self, example: Example, completion: str) -> float:
        """Partial credit: the fraction of positions right (see ``position_credit``)."""
        return position_credit(example.answer, completion)


class ReverseTask(_DigitStringTask):
    """Reverse a digit string; reward = fraction of positions correct, in [0, 1]."""

    name = "reverse"
    verb = "rev"

    def _answer(self, digits: str) -> str:
        return digits[::-1]


class SortTask(_DigitStringTask):
    """Sort a digit string ascending; reward = fraction of positions correct, in [0, 1]."""

    name = "sort"
    verb = "sort"

    def _answer(self, digits: str) -> str:
        return "".join(sorted(digits))


class AddTask(_DigitTask):
    """``a+b=`` with ``0 <= a, b <= max_operand``; reward ``scale`` on an exact match, else 0."""

    name = "add"

    def __init__(self, *, max_operand: int, scale: float) -> None:
        self.max_operand = max_operand
        self.scale = float(scale)
        self.max_new_tokens_hint = len(str(2 * max_operand)) + 2

    def _options(self) -> dict[str, object]:
        return {"max_operand": self.max_operand, "scale": self.scale}

    def _draw_key(self, rng: random.Random) -> str:
        return f"{rng.randint(0, self.max_operand)}+{rng.randint(0, self.max_operand)}"

    def _example(self, key: str) -> Example:
        a, b = key.split("+")
        return Example(prompt=f"{key}=", answer=str(int(a) + int(b)), group=self.name)

    def score(self, example: Example, completion: str) -> float:
        return self.scale if completion.strip() == example.answer else 0.0


class MixedScaleTask:
    """Reverse (reward in [0, 1]) mixed with add (reward in {0, 10}): scales differ ~10x.

    Why: with rewards of different scales in one batch, batch-level normalisation lets the
    large-scale prompts dominate the advantages while group-level normalisation (per prompt's n
    samples) treats both fairly. ``Example.group`` is ``"reverse"`` or ``"add"``. Training draws
    pick add with probability ``add_fraction``; evaluation alternates reverse, add, reverse, ...
    Held-out keys are those of the ``reverse`` and ``add`` tasks themselves.
    """

    name = "mixed-scale"

    def __init__(
        self,
        *,
        min_len: int,
        max_len: int,
        max_operand: int,
        add_scale: float,
        add_fraction: float,
    ) -> None:
        self.reverse = ReverseTask(min_len=min_len, max_len=max_len)
        self.add = AddTask(max_operand=max_operand, scale=add_scale)
        self.add_fraction = add_fraction
        self.max_new_tokens_hint = max(
            self.reverse.max_new_tokens_hint, self.add.max_new_tokens_hint
        )

    @property
    def fingerprint(self) -> str:
        return json.dumps(
            {
                "task": self.name,
                "reverse": json.loads(self.reverse.fingerprint),
                "add": json.loads(self.add.fingerprint),
                "add_fraction": self.add_fraction,
            },
            sort_keys=True,
        )

    def _sub(self, group: str) -> ReverseTask | AddTask:
        if group == "reverse":
            return self.reverse
        if group == "add":
            return self.add
        raise ValueError(f"task 'mixed-scale': unknown example group {group!r}")

    def sample(self, rng: random.Random, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            sub = self.add if rng.random() < self.add_fraction else self.reverse
            out.extend(sub.sample(rng, 1))
        return out

    def eval_examples(self, n: int) -> list[Example]:
        rev = self.reverse.eval_examples(math.ceil(n / 2))
        add = self.add.eval_examples(n // 2)
        out: list[Example] = []
        for i in range(max(len(rev), len(add))):
            out.extend(rev[i : i + 1])
            out.extend(add[i : i + 1])
        return out[:n]

    def score(self, example: Example, completion: str) -> float:
        return self._sub(example.group).score(example, completion)

    def demonstration(self, example: Example) -> str:
        return example.answer


__all__ = ["AddTask", "MixedScaleTask", "ReverseTask", "SortTask"]
