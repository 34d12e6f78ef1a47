"""Seeds that decide: a cell's comparison is looked at after every batch of seeds, validly.

The question an ablation asks of a cell is "better than the baseline, worse, or the same within a
practical margin?".  With a fixed number of seeds, clear cells waste seeds and close ones stay
undecided.  Here seeds are added in batches to the cells whose answer is still open, and the
answer is read off an interval after each batch.

**Why the intervals are wider than the usual ones.**  Looking after every batch and stopping as
soon as a fixed-sample 95 % interval excludes 0 makes false "better/worse" calls far more often
than 5 % (about 21 % with the 12 looks of ``min: 3, max: 24, batch: 2`` on identical cells,
measured in ``tests/report/test_sequential.py``).  The looks here are *planned* (``min``,
``min + batch``, ..., ``max`` seeds), so they are a group-sequential design (Pocock, "Group
sequential methods in the design and analysis of clinical trials", Biometrika 64(2), 1977):
every look uses the same nominal level ``1 − α'``, with ``α'`` chosen so that the chance that
*any* look's interval misses the true difference is ``α = 1 − confidence``:

    d_i = score(cell, seed i) − score(reference, seed i)        (paired by seed)
    interval at a look with n seeds:  d̄ ± t_{n−1, 1−α'/2} · s_d / √n
    α' :  P_{d_i ~ N(μ, σ²)} ( ∃ look k : |d̄_k − μ| > t_{n_k−1, 1−α'/2} · s_k / √n_k ) = α

The probability has no closed form over t-statistics with growing degrees of freedom, so
``α'`` is found by simulating 200,000 normal studies with a fixed seed (the α-quantile of each
study's smallest p-value over the looks; cached per plan).  Since the intervals of all looks
cover the truth together with probability 1 − α, every decision taken at any look (better,
worse, equivalent) is wrong with probability at most α, whatever the stopping rule.  Why
Pocock's equal levels rather than O'Brien–Fleming's: a clearly different cell should stop at
the first looks, where O'Brien–Fleming spends almost nothing.  Why not a confidence sequence
(Howard et al. 2021): their guarantees hold for any number of looks, which costs width that a
study with at most a dozen planned looks need not pay.  The calibration assumes normal seed
differences; the tests check the error rate on skewed and collapsing scores too.

A decision (``lo``/``hi`` swap for a metric to minimise):

    better      lo > 0
    worse       hi < 0
    equivalent  −margin < lo and hi < margin   (margin > 0)
    open        none of these and n < max      (gets ``batch`` more seeds)
    undecided   none of these at n = max       (the interval it reached is reported)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

Verdict = Literal["better", "worse", "equivalent", "open", "undecided"]
DECIDED: tuple[Verdict, ...] = ("better", "worse", "equivalent")


@dataclass(frozen=True)
class SeedPlan:
    """How many seeds a cell may get and when its comparison is looked at."""

    min: int = 3
    max: int = 24
    batch: int = 2
    confidence: float = 0.95
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.min < 2:
            raise ValueError(
                f"seeds.min must be >= 2 (an interval needs two seeds); got {self.min}"
            )
        if self.max < self.min:
            raise ValueError(f"seeds.max ({self.max}) must be >= seeds.min ({self.min})")
        if self.batch < 1:
            raise ValueError(f"seeds.batch must be >= 1; got {self.batch}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"seeds.confidence must be in [0.5, 1); got {self.confidence}")
        if not (self.margin >= 0 and math.isfinite(self.margin)):
            raise ValueError(f"seeds.margin must be a finite number >= 0; got {self.margin}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def looks(self) -> list[int]:
        """Seed counts at which the comparison is looked at: min, min + batch, ..., max."""
        out = list(range(self.min, self.max, self.batch))
        return out + [self.max]

    def next_look(self, n: int) -> int:
        """The first planned look at or above ``n`` seeds (``max`` past the last)."""
        return next((k for k in self.looks() if k >= n), self.max)


CALIBRATION_STUDIES = 200_000


def look_alpha(plan: SeedPlan) -> float:
    """α': the error level of each look such that all looks together err with probability α."""
    # The margin does not enter: plans that differ only in it share one calibration.
    return _look_alpha(SeedPlan(plan.min, plan.max, plan.batch, plan.confidence))


@functools.lru_cache(maxsize=64)
def _look_alpha(plan: SeedPlan) -> float:
    rng = np.random.default_rng(20260101)
    looks = plan.looks()
    smallest = np.ones(CALIBRATION_STUDIES)
    # In blocks, so 200k studies × max seeds never sit in memory at once.
    block = max(1, 4_000_000 // plan.max)
    for start in range(0, CALIBRATION_STUDIES, block):
        d = rng.standard_normal((min(block, CALIBRATION_STUDIES - start), plan.max))
        total, squares = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
        p = np.ones(d.shape[0])
        for n in looks:
            mean = total[:, n - 1] / n
            var = np.maximum(squares[:, n - 1] - n * mean * mean, 1e-300) / (n - 1)
            tstat = np.abs(mean) / np.sqrt(var / n)
            p = np.minimum(p, 2.0 * stats.t.sf(tstat, n - 1))
        smallest[start : start + d.shape[0]] = p
    return float(np.quantile(smallest, plan.alpha))


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    n: int  # paired seeds the decision used
    estimate: float  # mean difference (cell − reference), in the metric's units
    lo: float
    hi: float
    level: float  # the interval's own coverage, 1 − α'

    def line(self) -> str:
        iv = f"{self.estimate:+.4g} [{self.lo:+.4g}, {self.hi:+.4g}]"
        if self.verdict == "equivalent":
            return f"decided at {self.n} seeds: equivalent, difference {iv}"
        if self.verdict in DECIDED:
            return f"decided at {self.n} seeds: {self.verdict} by {iv}"
        if self.verdict == "open":
            return f"open at {self.n} seeds: {iv}"
        return f"undecided at max ({self.n} seeds): {iv}"

    def words(self) -> str:
        """:meth:`line` for the report's prose: a better or worse verdict says which way and by
        how much before the signed interval ("worse, lower by 0.15 (difference -0.15 [...])"),
        where ``line`` reads "worse by -0.15", a double negative."""
        if self.verdict not in ("better", "worse"):
            return self.line()
        iv = f"{self.estimate:+.4g} [{self.lo:+.4g}, {self.hi:+.4g}]"
        way = "higher" if self.estimate > 0 else "lower"
        return (
            f"decided at {self.n} seeds: {self.verdict}, {way} by {abs(self.estimate):.4g} "
            f"(difference {iv})"
        )


def paired_interval(diffs: Sequence[float], level: float) -> tuple[float, float, float]:
    """Mean and two-sided paired-t interval of ``diffs`` at ``level``."""
    d = np.asarray(diffs, dtype=float)
    n = d.size
    mean = float(d.mean())
    if n < 2:
        return mean, -math.inf, math.inf
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def decide(diffs: Sequence[float], plan: SeedPlan, *, maximize: bool = True) -> Decision:
    """The verdict on one comparison after ``len(diffs)`` paired seeds (cell − reference)."""
    n = len(diffs)
    if n < plan.min:
        mean = float(np.mean(diffs)) if n else math.nan
        return Decision("open", n, mean, -math.inf, math.inf, 0.0)
    level = 1.0 - look_alpha(plan)
    mean, lo, hi = paired_interval(diffs, level)
    if not maximize:  # "better" means lower: flip the sign of the difference
        mean, lo, hi = -mean, -hi, -lo
    verdict: Verdict
    if lo > 0:
        verdict = "better"
    elif hi < 0:
        verdict = "worse"
    elif plan.margin > 0 and -plan.margin < lo and hi < plan.margin:
        verdict = "equivalent"
    else:
        verdict = "undecided" if n >= plan.max else "open"
    return Decision(verdict, n, mean, lo, hi, level)


def decide_ranking(
    scores: Mapping[str, Sequence[float]], plan: SeedPlan, *, maximize: bool = True
) -> tuple[str, str, Decision]:
    """``decide: ranking``: the top cell against the runner-up, paired by seed.

    ``scores`` maps each cell to its seeds' scores (the same seeds, in the same order; at least
    two cells).  The top cell and its runner-up are the two best by mean; the verdict is
    ``decide(top − runner-up)``: *better* (the top is the winner), *equivalent* (the two are the
    same within the margin, either may be called the best) or open/undecided.  Whichever two
    cells are on top at a look, the simultaneous coverage of the looks' intervals holds for each
    fixed pair; the choice of the pair by the data makes "better" slightly optimistic when three
    or more cells are close (docs/seeds.md says so)."""
    if len(scores) < 2:
        raise ValueError("decide: ranking needs at least two cells")
    sign = 1.0 if maximize else -1.0
    means = {c: sign * float(np.mean(v)) for c, v in scores.items()}
    top, runner = sorted(means, key=lambda c: -means[c])[:2]
    diffs = [a - b for a, b in zip(scores[top], scores[runner], strict=True)]
    return top, runner, decide(diffs, plan, maximize=maximize)


def fixed_design_seeds(effect: float, sd: float, plan: SeedPlan, power: float) -> int:
    """Seeds per cell a fixed design needs for ``power`` at the same confidence (paired t-test).

    Smallest n with P(two-sided t-test at α rejects | mean difference ``effect``, sd ``sd``) ≥
    ``power``, from the noncentral t distribution; what the adaptive design is compared with."""
    alpha = plan.alpha
    for n in range(2, 100_000):
        df = n - 1
        crit = stats.t.ppf(1 - alpha / 2, df)
        nc = abs(effect) / sd * math.sqrt(n)
        if stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) >= power:
            return n
    return 100_000


def sequential_verdicts(d: np.ndarray, plan: SeedPlan) -> tuple[np.ndarray, np.ndarray]:
    """``decide`` over every look, vectorized: for each row of paired differences ``d``
    (studies x max seeds, higher = better), the first decided verdict (else "undecided") and
    the seeds it used.  The same rule as :func:`decide`, checked against it in the tests."""
    studies = d.shape[0]
    level = 1.0 - look_alpha(plan)
    verdict = np.full(studies, "open", dtype=object)
    used = np.full(studies, plan.max)
    for n in plan.looks():
        x = d[:, :n]
        mean = x.mean(axis=1)
        half = stats.t.ppf(0.5 + level / 2.0, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
        lo, hi = mean - half, mean + half
        now = np.full(studies, "open", dtype=object)
        now[lo > 0] = "better"
        now[hi < 0] = "worse"
        if plan.margin > 0:  # as in decide: better/worse first (lo > 0 and hi < margin: better)
            inside = (lo > -plan.margin) & (hi < plan.margin) & (now == "open")
            now[inside] = "equivalent"
        fresh = (verdict == "open") & (now != "open")
        verdict[fresh] = now[fresh]
        used[fresh] = n
    verdict[verdict == "open"] = "undecided"
    return verdict, used


def simulate_ranking(
    effects: Sequence[float], plan: SeedPlan, *, studies: int, seed: int = 0
) -> dict[str, Any]:
    """``decide: ranking`` on ``studies`` simulated studies of cells whose true means are
    ``effects`` (in units of the sd of a paired difference; normal seed scores): how often the
    race ended "better", "equivalent" or undecided, how often a "better" named a cell that is
    not the unique best (``wrong_winner``), and the mean seeds per cell."""
    rng = np.random.default_rng(seed)
    k = len(effects)
    mu = np.asarray(effects, dtype=float)
    # Each cell's score has sd 1/√2, so a difference of two cells has sd 1.
    x = rng.standard_normal((studies, k, plan.max)) / math.sqrt(2.0) + mu[None, :, None]
    level = 1.0 - look_alpha(plan)
    verdict = np.full(studies, "open", dtype=object)
    used = np.full(studies, plan.max)
    winner = np.full(studies, -1)
    rows = np.arange(studies)
    for n in plan.looks():
        order = np.argsort(-x[:, :, :n].mean(axis=2), axis=1)
        top, runner = order[:, 0], order[:, 1]
        d = x[rows, top, :n] - x[rows, runner, :n]
        mean = d.mean(axis=1)
        half = stats.t.ppf(0.5 + level / 2.0, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
        now = np.full(studies, "open", dtype=object)
        now[mean - half > 0] = "better"
        if plan.margin > 0:
            inside = (mean - half > -plan.margin) & (mean + half < plan.margin) & (now == "open")
            now[inside] = "equivalent"
        fresh = (verdict == "open") & (now != "open")
        verdict[fresh], used[fresh], winner[fresh] = now[fresh], n, top[fresh]
    best = mu.max()
    unique = int((mu == best).sum()) == 1
    called = verdict == "better"
    wrong = called & ((mu[np.maximum(winner, 0)] < best) | (not unique))
    return {
        "better": float(called.mean()),
        "equivalent": float((verdict == "equivalent").mean()),
        "undecided": float((verdict == "open").mean()),
        "wrong_winner": float(wrong.mean()),
        "mean_seeds": float(used.mean()),
    }


def simulate(
    effect: float,
    plan: SeedPlan,
    *,
    studies: int,
    seed: int = 0,
    scores: Literal["normal", "skewed", "collapse"] = "normal",
) -> dict[str, float]:
    """Run ``studies`` sequential comparisons of a cell against a baseline whose true mean
    difference is ``effect`` (in units of the seed-to-seed sd of the difference): the fraction
    of each verdict and the mean number of seeds used.

    ``scores`` is how one run's score varies over seeds, in both cells alike: ``normal``;
    ``skewed`` (lognormal, skewness ≈ 6); ``collapse`` (a run collapses to a low score one time in
    five, as RL runs do). The difference of two cells' scores on a seed is what is tested."""
    rng = np.random.default_rng(seed)
    shape = (studies, plan.max)

    def runs() -> np.ndarray:
        if scores == "normal":
            return rng.standard_normal(shape)
        if scores == "skewed":
            return rng.lognormal(0.0, 1.0, shape)
        return np.where(rng.random(shape) < 0.2, 0.0, 1.0) + 0.1 * rng.standard_normal(shape)

    d = runs() - runs()
    d = effect + d / d.std()
    verdict, used = sequential_verdicts(d, plan)
    out = {k: float(np.mean(verdict == k)) for k in ("better", "worse", "equivalent", "undecided")}
    out["mean_seeds"] = float(used.mean())
    return out


__all__ = [
    "DECIDED",
    "Decision",
    "SeedPlan",
    "Verdict",
    "decide",
    "decide_ranking",
    "fixed_design_seeds",
    "look_alpha",
    "paired_interval",
    "sequential_verdicts",
    "simulate",
    "simulate_ranking",
]
