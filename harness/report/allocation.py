"""Which seeds each cell of an adaptive study runs: a pure function of the finished seeds.

A study with ``seeds: {min, max, batch, decide, ...}`` has every (cell, seed) of seeds
``0..max-1`` enqueued once when it opens (the usual exactly-once enqueue by key); a seed is
*held* until the allocation *releases* it, and *cancelled* once its cell is decided.  The
allocation is computed here from the finished seeds alone:

* the look at ``n`` seeds of a cell is taken once seeds ``0..n-1`` of the cell and of its
  reference have finished (completed or diverged); until then the look is *pending* and nothing
  beyond ``n`` is released;
* a look that leaves the cell open releases the next ``batch`` seeds; a decided one freezes the
  cell at ``n`` (its seeds ``>= n`` are cancelled); at ``max`` an open cell is *undecided*.

The decision at a look uses only seeds below it, which are finished and never change, so every
process that computes the allocation gets the same answer whatever it saw before: two workers
computing the same look release and cancel the same seeds, and a coordinator killed between a
decision and its cancellations computes the same decision again when it resumes.  What a
process may claim only grows (a decided cell's released count is the look at which it was
decided, which is what every earlier view released too), so a released seed is never cancelled.

A diverged seed has no score; it counts as the worst finite score of the two compared cells
among the seeds of that look (the pessimistic value the report's ranking imputes, and a pure
function of the same finished seeds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.report.sequential import Decision as Decision
from harness.report.sequential import SeedPlan, decide, decide_ranking

DecideMode = Literal["baseline", "ranking"]
# ranked: decide: ranking ended and this cell is not the winner (nor equivalent to it)
CellStatus = Literal["better", "worse", "equivalent", "undecided", "open", "reference", "ranked"]


@dataclass(frozen=True)
class AdaptivePlan:
    """A study's adaptive seed plan: the sequential test's plan and what each cell is compared
    with (``baseline``: every cell against the baseline; ``ranking``: the top cell against the
    runner-up)."""

    plan: SeedPlan
    decide: DecideMode = "baseline"

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "min": p.min,
            "max": p.max,
            "batch": p.batch,
            "decide": self.decide,
            "confidence": p.confidence,
            "margin": p.margin,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AdaptivePlan:
        plan = SeedPlan(
            min=int(d["min"]),
            max=int(d["max"]),
            batch=int(d["batch"]),
            confidence=float(d["confidence"]),
            margin=float(d["margin"]),
        )
        return cls(plan=plan, decide="ranking" if d.get("decide") == "ranking" else "baseline")


@dataclass(frozen=True)
class CellState:
    """Where one cell of an adaptive study stands."""

    cell: str
    status: CellStatus  # decided (better/worse/equivalent), undecided at max, open, reference
    released: int  # seeds 0..released-1 are to run
    done: int  # of those, finished (completed or diverged)
    versus: str | None  # what it is compared with (None for the reference itself)
    decision: Decision | None  # the last look's verdict and interval (None before a look)

    @property
    def settled(self) -> bool:
        """Nothing more will run for this cell: decided or undecided, and its seeds done."""
        return self.status != "open" and self.done >= self.released

    def line(self, *, words: bool = False) -> str:
        """Where the cell stands, in one line; ``words``: the decision as the report's prose
        writes it (:meth:`Decision.words`)."""
        if self.status == "ranked":
            return f"{self.done}/{self.released} seeds done, below {self.versus} (ranking decided)"
        if self.status == "reference":
            return f"{self.done}/{self.released} seeds done (the reference)"
        d = self.decision
        what = (d.words() if words else d.line()) if d else "no look yet"
        vs = f" vs {self.versus}" if self.versus else ""
        return f"{self.done}/{self.released} seeds done, {what}{vs}"


Scores = Mapping[str, Mapping[int, float]]  # cell -> seed -> score (NaN: diverged), finished only


def _pairs(a: Mapping[int, float], b: Mapping[int, float], n: int, sign: float) -> list[float]:
    """Paired differences a − b over seeds 0..n-1, a diverged score as the worst of the look."""
    vals = [a[s] for s in range(n)] + [b[s] for s in range(n)]
    finite = [sign * v for v in vals if math.isfinite(v)]
    worst = sign * min(finite) if finite else 0.0

    def score(v: float) -> float:
        return v if math.isfinite(v) else worst

    return [score(a[s]) - score(b[s]) for s in range(n)]


def _have(scores: Scores, cell: str, n: int) -> bool:
    got = scores.get(cell, {})
    return all(s in got for s in range(n))


def _done(scores: Scores, cell: str, released: int) -> int:
    got = scores.get(cell, {})
    return sum(1 for s in range(released) if s in got)


def allocate(
    scores: Scores,
    cells: Sequence[str],
    adaptive: AdaptivePlan,
    *,
    baseline: str | None,
    maximize: bool = True,
) -> dict[str, CellState]:
    """The state of every cell given the finished seeds' ``scores`` (a pure function)."""
    if adaptive.decide == "ranking" or baseline is None:
        return _allocate_ranking(scores, cells, adaptive.plan, maximize)
    plan = adaptive.plan
    looks = plan.looks()
    out: dict[str, CellState] = {}
    for cell in cells:
        if cell == baseline:
            continue
        released, status, decision = looks[0], "open", None
        for k, n in enumerate(looks):
            released = n
            if not (_have(scores, cell, n) and _have(scores, baseline, n)):
                break  # the look at n is pending
            diffs = _pairs(scores[cell], scores[baseline], n, 1.0 if maximize else -1.0)
            decision = decide(diffs, plan, maximize=maximize)
            if decision.verdict != "open":
                status = decision.verdict
                break
            if k + 1 < len(looks):
                released = looks[k + 1]
        out[cell] = CellState(
            cell,
            status,  # type: ignore[arg-type]
            released,
            _done(scores, cell, released),
            baseline,
            decision,
        )
    # The reference runs every seed some cell still compares with it.
    ref_released = max((s.released for s in out.values()), default=looks[0])
    ref = CellState(
        baseline, "reference", ref_released, _done(scores, baseline, ref_released), None, None
    )
    return {c: (ref if c == baseline else out[c]) for c in cells}


def _allocate_ranking(
    scores: Scores, cells: Sequence[str], plan: SeedPlan, maximize: bool
) -> dict[str, CellState]:
    """``decide: ranking``: all cells advance together until the top one is decided against the
    runner-up (better or equivalent), or ``max``."""
    looks = plan.looks()
    sign = 1.0 if maximize else -1.0
    released, status, decision, top, runner = looks[0], "open", None, None, None
    if len(cells) < 2:
        return {
            c: CellState(c, "reference", looks[0], _done(scores, c, looks[0]), None, None)
            for c in cells
        }
    for k, n in enumerate(looks):
        released = n
        if not all(_have(scores, c, n) for c in cells):
            break
        # A diverged seed: the worst finite score of the look over all cells.
        finite = [sign * scores[c][s] for c in cells for s in range(n)]
        finite = [v for v in finite if math.isfinite(v)]
        worst = sign * min(finite) if finite else 0.0
        table = {
            c: [scores[c][s] if math.isfinite(scores[c][s]) else worst for s in range(n)]
            for c in cells
        }
        top, runner, decision = decide_ranking(table, plan, maximize=maximize)
        if decision.verdict != "open":
            status = decision.verdict
            break
        if k + 1 < len(looks):
            released = looks[k + 1]
    out: dict[str, CellState] = {}
    for c in cells:
        if c == top:
            out[c] = CellState(c, status, released, _done(scores, c, released), runner, decision)  # type: ignore[arg-type]
        else:
            # Every other cell runs as long as the race does; its verdict is the race's.
            st = status if status in ("open", "undecided") else "ranked"
            if c == runner and status == "equivalent":
                st = "equivalent"
            out[c] = CellState(c, st, released, _done(scores, c, released), top, None)  # type: ignore[arg-type]
    return out


def race(
    values: Sequence[float], incumbent: Sequence[float], plan: SeedPlan, *, maximize: bool = True
) -> Decision | None:
    """Racing a search point against the incumbent (the best completed point so far): the
    paired decision on the seeds both ran, at a planned look (None between looks, or when the
    incumbent ran fewer seeds).  A point decided *worse* or *equivalent* stops (it cannot be
    the new best); *better* or open runs on to ``max``, so every incumbent has all its seeds."""
    n = len(values)
    if n not in plan.looks() or len(incumbent) < n:
        return None
    scores = {0: dict(enumerate(values)), 1: dict(enumerate(incumbent[:n]))}
    sign = 1.0 if maximize else -1.0
    return decide(_pairs(scores[0], scores[1], n, sign), plan, maximize=maximize)


def settled(states: Mapping[str, CellState]) -> bool:
    """Every cell decided or undecided with its seeds done: the adaptive study is complete."""
    return bool(states) and all(s.settled for s in states.values())


def seeds_used(states: Mapping[str, CellState]) -> int:
    return sum(s.released for s in states.values())


__all__ = [
    "AdaptivePlan",
    "race",
    "CellState",
    "Decision",
    "allocate",
    "seeds_used",
    "settled",
]
