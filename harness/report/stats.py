"""Cross-seed statistics for ablation cells: IQM, bootstrap CIs, probability of improvement.

Pure numpy/scipy.  The definitions follow rliable (Agarwal et al. 2021, "Deep Reinforcement
Learning at the Edge of the Statistical Precipice", arXiv 2108.13264) without depending on it
(rliable 1.2 fails to import with pandas 3 through ``arch``).  ``docs/stability.md`` states every
definition once; this module is its implementation.

Conventions, for every function here:

* A *sample* is a 1-D array of per-seed scores of one cell (one value per run).  Several tasks
  are given as a mapping ``task -> sample``; tasks are visited in sorted key order so results do
  not depend on dict insertion order.
* NaN propagates: a sample containing NaN gives a NaN estimate and a NaN interval, as
  ``np.mean`` does.  An empty sample gives NaN.  :func:`summarize_cell` is the place that drops
  non-finite scores, and it reports how many it dropped.
* Every bootstrap is seeded with a ``numpy.random.Generator`` (``np.random.default_rng(seed)``):
  the same call gives the same interval, bit for bit.  Resampling draws
  ``rng.integers(0, n, (n_boot, n))`` per sample, in order, exactly as
  ``scipy.stats.bootstrap`` does, so single-task intervals equal scipy's for the same seed.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

Method = Literal["percentile", "bca"]
Aggregate = Literal["pooled", "task_mean"]
# A statistic over groups: takes arrays shaped (..., n_g), one per group, returns shape (...).
_GroupStat = Callable[[Sequence[np.ndarray]], np.ndarray]

__all__ = [
    "CellSummary",
    "CurveFit",
    "Interval",
    "ProfileBand",
    "bootstrap_ci",
    "cis_overlap",
    "fit_saturating_curve",
    "inseparable_cells",
    "iqm",
    "iqm_ci",
    "mean_ci",
    "median",
    "performance_profile",
    "performance_profile_ci",
    "probability_of_improvement",
    "probability_of_improvement_ci",
    "seeds_to_separate",
    "stratified_bootstrap_ci",
    "stratified_resample",
    "summarize_cell",
]


# --------------------------------------------------------------------------------------------
# Point estimates
# --------------------------------------------------------------------------------------------


def iqm(x: ArrayLike, axis: int | None = None) -> Any:
    """Interquartile mean: the 25 % trimmed mean, ``scipy.stats.trim_mean(x, 0.25)``.

    Sort the n values, drop ``g = floor(0.25 n)`` from each end, average the rest.  This is
    rliable's ``metrics.aggregate_iqm`` (Agarwal et al. 2021, arXiv 2108.13264), which is exactly
    ``trim_mean(scores, 0.25, axis=None)``: with ``axis=None`` all values are pooled.

    Small n: ``g = 0`` for n < 4, so the IQM *is the plain mean* for 1-3 seeds; n = 4..7 trims one
    value per end, n = 8..11 two, and so on.  No fractional weighting of boundary values.

    Returns a float for ``axis=None`` (NaN when x is empty or contains NaN), else an array.
    """
    a = np.asarray(x, dtype=float)
    if axis is None:
        a = a.ravel()
        if a.size == 0 or np.isnan(a).any():
            return math.nan
        return float(stats.trim_mean(a, 0.25))
    out = np.asarray(stats.trim_mean(a, 0.25, axis=axis), dtype=float)
    return np.where(np.isnan(a).any(axis=axis), np.nan, out)


def median(x: ArrayLike, axis: int | None = None) -> Any:
    """Median of the values (``np.median``): NaN when x is empty or contains NaN."""
    a = np.asarray(x, dtype=float)
    if axis is None:
        a = a.ravel()
        return math.nan if a.size == 0 else float(np.median(a))
    return np.median(a, axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _iqm_last(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return iqm(x, axis=axis)


def _poi_arrays(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + ½ P(X = Y) along the last axis, via ranks (Mann-Whitney U1 / (n m))."""
    n, m = x.shape[-1], y.shape[-1]
    lead = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    x, y = np.broadcast_to(x, (*lead, n)), np.broadcast_to(y, (*lead, m))
    ranks = stats.rankdata(np.concatenate([x, y], axis=-1), axis=-1)  # average ranks for ties
    u1 = ranks[..., :n].sum(axis=-1) - n * (n + 1) / 2.0
    return u1 / (n * m)


def _tasks(data: Mapping[str, ArrayLike]) -> list[str]:
    if len(data) == 0:
        raise ValueError("need at least one task")
    return sorted(data)


def _flat(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=float).ravel()


def probability_of_improvement(
    x: ArrayLike | Mapping[str, ArrayLike], y: ArrayLike | Mapping[str, ArrayLike]
) -> float:
    """Probability that a run of X scores higher than a run of Y: P(X > Y) + ½ P(X = Y).

    Computed as the Mann-Whitney statistic ``U1 / (n_x n_y)`` where ``U1 = #{(i, j): x_i > y_j}
    + ½ #{(i, j): x_i = y_j}`` (``scipy.stats.mannwhitneyu(x, y).statistic``), as rliable's
    ``metrics.probability_of_improvement`` (Agarwal et al. 2021, arXiv 2108.13264).  With tasks
    (mappings with the same keys) it is the average over tasks of the per-task value.

    0.5 means "no better than Y", 1.0 "every run of X beats every run of Y".  NaN if either
    sample is empty or contains NaN.
    """
    if isinstance(x, Mapping) or isinstance(y, Mapping):
        if not (isinstance(x, Mapping) and isinstance(y, Mapping)) or set(x) != set(y):
            raise ValueError("x and y must both be mappings with the same task keys")
        return float(np.mean([probability_of_improvement(x[t], y[t]) for t in _tasks(x)]))
    xa, ya = _flat(x), _flat(y)
    if xa.size == 0 or ya.size == 0 or np.isnan(xa).any() or np.isnan(ya).any():
        return math.nan
    return float(_poi_arrays(xa, ya))


# --------------------------------------------------------------------------------------------
# Intervals and the bootstrap engine
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval ``[low, high]`` (NaN when undefined)."""

    point: float
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    def contains(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)

    def __str__(self) -> str:
        return f"{self.point:.3g} [{self.low:.3g}, {self.high:.3g}]"


_NAN_INTERVAL = Interval(math.nan, math.nan, math.nan)


def _check(n_boot: int, confidence: float, method: str) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if method not in ("percentile", "bca"):
        raise ValueError(f"method must be 'percentile' or 'bca', got {method!r}")


def _resample(groups: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> list:
    """One (n_boot, n_g) matrix of resamples with replacement per group, drawn in order."""
    return [g[rng.integers(0, g.size, (n_boot, g.size))] for g in groups]


def _jackknife_acceleration(groups: Sequence[np.ndarray], stat: _GroupStat) -> float:
    """BCa acceleration from the leave-one-out jackknife (Efron & Tibshirani 1993, eq. 14.15).

    Several groups are handled as in ``scipy.stats.bootstrap``: each group is left out one value at
    a time while the others stay whole.  Groups with fewer than 2 values are skipped (their
    jackknife is undefined); a zero denominator gives acceleration 0.
    """
    num = den = 0.0
    for j, g in enumerate(groups):
        n = g.size
        if n < 2:
            continue
        keep = ~np.eye(n, dtype=bool)
        loo = np.broadcast_to(g, (n, n))[keep].reshape(n, n - 1)
        args = [loo if k == j else np.broadcast_to(h, (n, h.size)) for k, h in enumerate(groups)]
        theta = np.asarray(stat(args), dtype=float)
        u = (n - 1) * (theta.mean() - theta)
        num += float(np.sum(u**3)) / n**3
        den += float(np.sum(u**2)) / n**2
    if den <= 0.0 or not np.isfinite(den):
        return 0.0
    return num / (6.0 * den**1.5)


def _bootstrap(
    groups: Sequence[np.ndarray],
    stat: _GroupStat,
    *,
    n_boot: int,
    confidence: float,
    seed: int,
    method: str,
) -> tuple[Interval, np.ndarray]:
    """Percentile or BCa bootstrap interval of ``stat`` over independently resampled groups."""
    _check(n_boot, confidence, method)
    if any(g.size == 0 or np.isnan(g).any() for g in groups):
        return _NAN_INTERVAL, np.full(n_boot, np.nan)
    point = float(stat(list(groups)))
    reps = np.asarray(stat(_resample(groups, n_boot, np.random.default_rng(seed))), dtype=float)
    alpha = (1.0 - confidence) / 2.0
    if method == "percentile":
        q = np.array([alpha, 1.0 - alpha])
    else:
        # Bias correction z0 from the "mean" percentile of the point among the replicates.
        frac = (np.count_nonzero(reps < point) + np.count_nonzero(reps <= point)) / (2 * reps.size)
        z0 = special.ndtri(frac)
        a = _jackknife_acceleration(groups, stat)
        z = special.ndtri(np.array([alpha, 1.0 - alpha]))
        q = special.ndtr(z0 + (z0 + z) / (1.0 - a * (z0 + z)))
    low, high = np.quantile(reps, q)
    return Interval(point, float(low), float(high)), reps


def _accepts_axis(statistic: Callable[..., Any]) -> bool:
    try:
        return "axis" in inspect.signature(statistic).parameters
    except (TypeError, ValueError):
        return False


def _vectorize(statistic: Callable[..., Any], vectorized: bool | None) -> Callable:
    """``f(a)`` over the last axis of ``a``: ``statistic(a, axis=-1)`` if it takes ``axis``."""
    if vectorized is None:
        vectorized = _accepts_axis(statistic)
    if vectorized:
        return lambda a: statistic(a, axis=-1)

    def looped(a: np.ndarray) -> Any:
        if a.ndim == 1:
            return statistic(a)
        return np.apply_along_axis(statistic, -1, a)

    return looped


def bootstrap_ci(
    x: ArrayLike,
    statistic: Callable[..., Any],
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    method: Method = "percentile",
    vectorized: bool | None = None,
) -> Interval:
    """Bootstrap confidence interval of ``statistic`` over one sample of per-seed scores.

    Draw ``n_boot`` resamples of the n values with replacement, compute the statistic on each,
    and take the ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles of the replicates
    (linear interpolation, ``np.quantile``):

    * ``"percentile"`` (default; recommended for 3-10 seeds, where BCa is unstable);
    * ``"bca"``: bias-corrected and accelerated (Efron & Tibshirani 1993, ch. 14), quantile levels
      ``Φ(z0 + (z0 + z_α)/(1 − a (z0 + z_α)))`` with z0 from the fraction of replicates below the
      point and the acceleration a from the jackknife.  Same as ``scipy.stats.bootstrap``.

    ``point`` is the statistic of the original sample.  ``statistic`` takes a 1-D array; if its
    signature has ``axis`` (``np.mean``, :func:`iqm`, ...) it is called once on the
    ``(n_boot, n)`` matrix with ``axis=-1``.  n = 1 gives the degenerate interval
    ``[x0, x0]``; an empty sample or NaN gives NaN.
    """
    a = _flat(x)
    f = _vectorize(statistic, vectorized)
    interval, _ = _bootstrap(
        [a], lambda gs: f(gs[0]), n_boot=n_boot, confidence=confidence, seed=seed, method=method
    )
    return interval


def mean_ci(
    x: ArrayLike,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    method: Method = "percentile",
) -> Interval:
    """Mean of the sample with its bootstrap CI (:func:`bootstrap_ci` with ``np.mean``)."""
    return bootstrap_ci(
        x, _mean, n_boot=n_boot, confidence=confidence, seed=seed, method=method, vectorized=True
    )


def iqm_ci(
    x: ArrayLike,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    method: Method = "percentile",
) -> Interval:
    """IQM of the sample with its bootstrap CI (:func:`bootstrap_ci` with :func:`iqm`)."""
    return bootstrap_ci(
        x,
        _iqm_last,
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
        method=method,
        vectorized=True,
    )


def stratified_resample(
    scores_by_task: Mapping[str, ArrayLike], *, n_boot: int = 2000, seed: int = 0
) -> dict[str, np.ndarray]:
    """The resamples a stratified bootstrap uses: per task, an ``(n_boot, n_task)`` matrix.

    Each row resamples that task's runs with replacement, within the task only, so every
    replicate keeps each task's run count (Agarwal et al. 2021, arXiv 2108.13264, "stratified
    bootstrap").  Tasks are drawn in sorted key order from ``np.random.default_rng(seed)``.
    """
    keys = _tasks(scores_by_task)
    mats = _resample([_flat(scores_by_task[t]) for t in keys], n_boot, np.random.default_rng(seed))
    return dict(zip(keys, mats, strict=True))


def stratified_bootstrap_ci(
    scores_by_task: Mapping[str, ArrayLike],
    statistic: Callable[..., Any],
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    method: Method = "percentile",
    aggregate: Aggregate = "pooled",
    vectorized: bool | None = None,
) -> Interval:
    """Stratified bootstrap CI of a statistic over several tasks (rliable's default bootstrap).

    Each replicate resamples runs with replacement *within each task* (:func:`stratified_resample`)
    and then aggregates:

    * ``aggregate="pooled"`` (default): the statistic of all tasks' runs pooled together.  This is
      what rliable's ``aggregate_iqm`` computes on its ``(runs, tasks)`` matrix (``axis=None``).
      Tasks with more runs weigh more; put scores on a common scale (normalize) first.
    * ``aggregate="task_mean"``: the mean over tasks of the per-task statistic (each task weighs
      the same).

    Tasks may have different run counts.  One task reduces to :func:`bootstrap_ci`.
    """
    if aggregate not in ("pooled", "task_mean"):
        raise ValueError(f"aggregate must be 'pooled' or 'task_mean', got {aggregate!r}")
    keys = _tasks(scores_by_task)
    groups = [_flat(scores_by_task[t]) for t in keys]
    f = _vectorize(statistic, vectorized)

    def stat(gs: Sequence[np.ndarray]) -> np.ndarray:
        if aggregate == "pooled":
            return np.asarray(f(np.concatenate(gs, axis=-1)), dtype=float)
        return np.mean([np.asarray(f(g), dtype=float) for g in gs], axis=0)

    interval, _ = _bootstrap(
        groups, stat, n_boot=n_boot, confidence=confidence, seed=seed, method=method
    )
    return interval


def probability_of_improvement_ci(
    x: ArrayLike | Mapping[str, ArrayLike],
    y: ArrayLike | Mapping[str, ArrayLike],
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    method: Method = "percentile",
) -> Interval:
    """:func:`probability_of_improvement` of X over Y with a bootstrap CI.

    The runs of X and the runs of Y are resampled independently (two-sample bootstrap, as
    ``scipy.stats.bootstrap((x, y), ...)`` and rliable do).  With tasks (mappings with the same
    keys) the resampling is stratified: within each task, for X and Y separately; the replicate is
    the task-averaged probability.  Draw order: sorted tasks, X before Y within a task.
    """
    if isinstance(x, Mapping) or isinstance(y, Mapping):
        if not (isinstance(x, Mapping) and isinstance(y, Mapping)) or set(x) != set(y):
            raise ValueError("x and y must both be mappings with the same task keys")
        keys = _tasks(x)
        groups = [g for t in keys for g in (_flat(x[t]), _flat(y[t]))]
    else:
        groups = [_flat(x), _flat(y)]

    def stat(gs: Sequence[np.ndarray]) -> np.ndarray:
        per_task = [_poi_arrays(gs[i], gs[i + 1]) for i in range(0, len(gs), 2)]
        return np.mean(per_task, axis=0)

    interval, _ = _bootstrap(
        groups, stat, n_boot=n_boot, confidence=confidence, seed=seed, method=method
    )
    return interval


# --------------------------------------------------------------------------------------------
# Can the CIs separate the cells?
# --------------------------------------------------------------------------------------------


def cis_overlap(a: Interval, b: Interval) -> bool:
    """True when ``[a.low, a.high]`` and ``[b.low, b.high]`` intersect, or either is NaN.

    Non-overlapping 95 % CIs are a conservative sign of a real difference; overlapping ones mean
    *these seeds cannot separate the cells* (not that the cells are equal).  For a direct test use
    :func:`probability_of_improvement_ci` and check whether its CI excludes 0.5.
    """
    vals = (a.low, a.high, b.low, b.high)
    if any(math.isnan(v) for v in vals):
        return True
    return bool(a.low <= b.high and b.low <= a.high)


def inseparable_cells(intervals: Mapping[str, Interval], baseline: str) -> list[str]:
    """Cells (other than ``baseline``) whose interval overlaps the baseline's, in sorted order.

    Used for the report's warning "too few seeds for the CI to separate these cells from the
    baseline".
    """
    if baseline not in intervals:
        raise KeyError(f"baseline cell {baseline!r} not among {sorted(intervals)}")
    base = intervals[baseline]
    return sorted(c for c, iv in intervals.items() if c != baseline and cis_overlap(iv, base))


def seeds_to_separate(a: Interval, b: Interval, n_seeds: int) -> float:
    """Rough number of seeds per cell at which the two CIs would stop overlapping.

    Assumes both intervals came from ``n_seeds`` seeds, that the point estimates stay put, and that
    half-widths shrink as ``1/sqrt(n)``: with half-widths ``h_a``, ``h_b`` and gap
    ``d = |a.point − b.point|``, the CIs separate once ``sqrt(n_seeds / n) (h_a + h_b) < d``,
    i.e. ``n > n_seeds ((h_a + h_b) / d)^2``.  Returns that n rounded up (at least ``n_seeds``
    when already separated), ``inf`` when ``d = 0``, NaN when an input is NaN.  A planning
    heuristic only, not a power analysis.
    """
    h = (a.high - a.low) / 2.0 + (b.high - b.low) / 2.0
    d = abs(a.point - b.point)
    if any(math.isnan(v) for v in (h, d)):
        return math.nan
    if d == 0.0:
        return math.inf
    return float(max(n_seeds, math.ceil(n_seeds * (h / d) ** 2)))


# --------------------------------------------------------------------------------------------
# Per-cell summary
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellSummary:
    """What the report shows for one cell: intervals always next to seeds, collapses, divergences.

    ``n_seeds`` counts every run given; ``n_used`` the finite scores the statistics were computed
    on (non-finite scores are dropped).  ``p_improve`` is None without a baseline.
    ``collapse_rate`` is the fraction of runs flagged collapsed among runs whose flag is defined
    (NaN when no flags were given); ``n_diverged`` counts diverged runs (see
    :func:`summarize_cell`).
    """

    n_seeds: int
    n_used: int
    iqm: Interval
    mean: Interval
    median: float
    p_improve: Interval | None
    collapse_rate: float
    n_diverged: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat float dict (MLflow-loggable): ``iqm``, ``iqm_low``, ``iqm_high``, ... ."""
        out: dict[str, float] = {
            "n_seeds": float(self.n_seeds),
            "n_used": float(self.n_used),
            "median": self.median,
            "collapse_rate": self.collapse_rate,
            "n_diverged": float(self.n_diverged),
        }
        for name, iv in (("iqm", self.iqm), ("mean", self.mean), ("p_improve", self.p_improve)):
            iv = iv or _NAN_INTERVAL
            out |= {name: iv.point, f"{name}_low": iv.low, f"{name}_high": iv.high}
        return {prefix + k: v for k, v in out.items()}


def _pool(values: ArrayLike | Mapping[str, ArrayLike]) -> np.ndarray:
    if isinstance(values, Mapping):
        return np.concatenate([_flat(values[t]) for t in _tasks(values)])
    return _flat(values)


def _finite(values: ArrayLike | Mapping[str, ArrayLike]) -> Any:
    if isinstance(values, Mapping):
        return {t: v[np.isfinite(v)] for t in _tasks(values) for v in [_flat(values[t])]}
    v = _flat(values)
    return v[np.isfinite(v)]


def summarize_cell(
    values: ArrayLike | Mapping[str, ArrayLike],
    *,
    baseline: ArrayLike | Mapping[str, ArrayLike] | None = None,
    collapsed: ArrayLike | Mapping[str, ArrayLike] | None = None,
    diverged: ArrayLike | Mapping[str, ArrayLike] | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    confidence: float = 0.95,
) -> CellSummary:
    """Summarize one cell's per-seed scores (e.g. each run's ``final/reward``).

    * IQM and mean with percentile-bootstrap CIs (stratified and pooled when ``values`` maps
      task -> scores); the median of the (pooled) scores;
    * P(improve over ``baseline``) with its CI when a baseline sample is given (task-averaged
      and stratified with tasks);
    * ``collapse_rate`` = mean of the per-run ``collapsed`` flags (1/0; NaN flags ignored; NaN
      when not given); ``n_diverged`` = sum of the per-run ``diverged`` flags, or, when not
      given, the number of non-finite scores.

    Non-finite scores (NaN, ±inf) are dropped from every statistic, in the cell and in the
    baseline; ``n_used`` says how many were kept.  All intervals use the same ``seed``.
    """
    n_seeds = int(_pool(values).size)
    kept = _finite(values)
    pooled = _pool(kept)
    boot: dict[str, Any] = {"n_boot": n_boot, "confidence": confidence, "seed": seed}
    if isinstance(kept, Mapping):
        iqm_iv = stratified_bootstrap_ci(kept, _iqm_last, vectorized=True, **boot)
        mean_iv = stratified_bootstrap_ci(kept, _mean, vectorized=True, **boot)
    else:
        iqm_iv, mean_iv = iqm_ci(kept, **boot), mean_ci(kept, **boot)
    p_iv = None
    if baseline is not None:
        p_iv = probability_of_improvement_ci(kept, _finite(baseline), **boot)
    if collapsed is None:
        collapse_rate = math.nan
    else:
        flags = _pool(collapsed)
        flags = flags[~np.isnan(flags)]
        collapse_rate = float(np.mean(flags > 0)) if flags.size else math.nan
    if diverged is None:
        n_diverged = n_seeds - int(pooled.size)
    else:
        n_diverged = int(np.nansum(_pool(diverged) > 0))
    return CellSummary(
        n_seeds=n_seeds,
        n_used=int(pooled.size),
        iqm=iqm_iv,
        mean=mean_iv,
        median=median(pooled),
        p_improve=p_iv,
        collapse_rate=collapse_rate,
        n_diverged=n_diverged,
    )


# --------------------------------------------------------------------------------------------
# Performance profiles
# --------------------------------------------------------------------------------------------


def performance_profile(
    scores: Mapping[str, ArrayLike], thresholds: ArrayLike
) -> dict[str, np.ndarray]:
    """Run-score distribution per cell: the fraction of runs with score > τ, for each τ.

    ``F(τ) = (1/n) Σ_i 1[x_i > τ]`` (rliable's ``create_performance_profile`` on run scores,
    Agarwal et al. 2021, arXiv 2108.13264).  A NaN score never exceeds τ, so a diverged run counts
    as a failure at every threshold.  Returns, per cell, an array shaped like ``thresholds``.
    """
    taus = np.asarray(thresholds, dtype=float)
    out = {}
    for cell, x in scores.items():
        a = _flat(x)
        out[cell] = (
            np.full(taus.shape, np.nan)
            if a.size == 0
            else np.mean(a[:, None] > taus.ravel()[None, :], axis=0).reshape(taus.shape)
        )
    return out


@dataclass(frozen=True)
class ProfileBand:
    """A performance profile with a pointwise bootstrap band (arrays over the thresholds)."""

    thresholds: np.ndarray
    point: np.ndarray
    low: np.ndarray
    high: np.ndarray


def performance_profile_ci(
    scores: Mapping[str, ArrayLike],
    thresholds: ArrayLike,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, ProfileBand]:
    """:func:`performance_profile` with pointwise percentile-bootstrap bands.

    Each cell's runs are resampled (``np.random.default_rng(seed)`` per cell, so a cell's band does
    not depend on the other cells); at each τ the band is the ``(1 ± confidence)/2`` quantiles of
    the resampled fractions.  Bands are pointwise, not simultaneous.
    """
    _check(n_boot, confidence, "percentile")
    taus = np.asarray(thresholds, dtype=float).ravel()
    alpha = (1.0 - confidence) / 2.0
    point = performance_profile(scores, taus)
    out = {}
    for cell, x in scores.items():
        a = _flat(x)
        if a.size == 0:
            nan = np.full(taus.shape, np.nan)
            out[cell] = ProfileBand(taus, nan, nan, nan)
            continue
        (res,) = _resample([a], n_boot, np.random.default_rng(seed))
        reps = np.mean(res[:, :, None] > taus[None, None, :], axis=1)  # (n_boot, T)
        low, high = np.quantile(reps, [alpha, 1.0 - alpha], axis=0)
        out[cell] = ProfileBand(taus, point[cell], low, high)
    return out


# --------------------------------------------------------------------------------------------
# Saturating learning-curve fit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveFit:
    """A fitted saturating reward curve; ``ok`` False (and NaN numbers) with a ``reason`` if not.

    ``asymptote`` is A, ``r0`` the reward at step 0, ``half_step`` the step at which half of the
    gain ``A − r0`` is reached (ScaleRL's C_mid), ``exponent`` the sigmoid's B (NaN for the
    exponential form), ``rmse`` the root-mean-square residual, ``extrapolated`` True when
    ``half_step`` lies beyond the last observed step (then A is an extrapolation).
    """

    form: str
    ok: bool
    reason: str
    asymptote: float = math.nan
    r0: float = math.nan
    half_step: float = math.nan
    exponent: float = math.nan
    rmse: float = math.nan
    extrapolated: bool = False

    def predict(self, steps: ArrayLike) -> np.ndarray:
        t = np.asarray(steps, dtype=float)
        if self.form == "sigmoid":
            return _sigmoid(t, self.r0, self.asymptote, self.half_step, self.exponent)
        return _exponential(t, self.r0, self.asymptote, self.half_step)


def _sigmoid(t: np.ndarray, r0: float, a: float, c_mid: float, b: float) -> np.ndarray:
    # r0 + (A − r0) / (1 + (C_mid/t)^B), written as expit(B (ln t − ln C_mid)) so t = 0 gives r0.
    with np.errstate(divide="ignore"):
        return r0 + (a - r0) * special.expit(b * (np.log(t) - np.log(c_mid)))


def _exponential(t: np.ndarray, r0: float, a: float, t_half: float) -> np.ndarray:
    # A − (A − r0) · 2^(−t / t_half): half the gain at t_half.
    return a - (a - r0) * np.exp2(-t / t_half)


def fit_saturating_curve(
    steps: ArrayLike,
    rewards: ArrayLike,
    *,
    form: Literal["sigmoid", "exponential"] = "sigmoid",
) -> CurveFit:
    """Fit a saturating curve to a (cell's mean) reward curve; never raises for bad data.

    * ``form="sigmoid"`` (ScaleRL, Khatri et al. 2025, arXiv 2510.13786, with compute replaced by
      steps): ``r(t) = r0 + (A − r0) / (1 + (C_mid / t)^B)``; four parameters, ``r(0) = r0``.
    * ``form="exponential"``: ``r(t) = A − (A − r0) 2^(−t / t_half)``; three parameters.

    Both report ``half_step`` = the step where half of the gain ``A − r0`` is reached (C_mid or
    t_half): "efficiency", separate from the ceiling A.  Fitted with
    ``scipy.optimize.curve_fit`` (trust-region, bounded: ``C_mid``, ``t_half`` in
    ``(0, 100 t_max]``, ``B`` in ``[0.05, 20]``) from a few starting points, keeping the best.

    Steps must be >= 0.  Non-finite points are ignored.  Returns ``CurveFit(ok=False, reason=...)``
    when there are too few points, no variation, or the optimizer fails.
    """
    if form not in ("sigmoid", "exponential"):
        raise ValueError(f"form must be 'sigmoid' or 'exponential', got {form!r}")
    n_params = 4 if form == "sigmoid" else 3
    try:
        t = np.asarray(steps, dtype=float).ravel()
        r = np.asarray(rewards, dtype=float).ravel()
    except (TypeError, ValueError) as e:
        return CurveFit(form, False, f"could not read steps/rewards as numbers: {e}")
    if t.shape != r.shape:
        return CurveFit(form, False, f"steps {t.shape} and rewards {r.shape} differ in length")
    keep = np.isfinite(t) & np.isfinite(r)
    t, r = t[keep], r[keep]
    if t.size < n_params + 1:
        return CurveFit(form, False, f"{t.size} finite points; need at least {n_params + 1}")
    if (t < 0).any():
        return CurveFit(form, False, "steps must be >= 0")
    span = float(r.max() - r.min())
    if span == 0.0 or float(t.max() - t.min()) == 0.0:
        return CurveFit(form, False, "no variation in the rewards or the steps")
    t_max = float(t.max())
    order = np.argsort(t)
    head = float(np.mean(r[order][: max(1, t.size // 10)]))
    tail = float(np.mean(r[order][-max(1, t.size // 10) :]))
    lo_r, hi_r = float(r.min()) - 10 * span, float(r.max()) + 10 * span
    if form == "sigmoid":
        model: Callable[..., np.ndarray] = _sigmoid
        lower, upper = [lo_r, lo_r, 1e-9 * t_max, 0.05], [hi_r, hi_r, 100 * t_max, 20.0]
        starts = [[head, tail, c * t_max, b] for c in (0.1, 0.3, 1.0) for b in (1.0, 2.5)]
    else:
        model = _exponential
        lower, upper = [lo_r, lo_r, 1e-9 * t_max], [hi_r, hi_r, 100 * t_max]
        starts = [[head, tail, c * t_max] for c in (0.05, 0.2, 1.0)]
    best, best_sse, last_err = None, math.inf, "optimizer did not converge"
    for start in starts:
        p0 = np.clip(start, lower, upper)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", optimize.OptimizeWarning)
                p, _ = optimize.curve_fit(
                    model, t, r, p0=p0, bounds=(lower, upper), method="trf", maxfev=5000
                )
                sse = float(np.sum((model(t, *p) - r) ** 2))
        except (RuntimeError, ValueError, optimize.OptimizeWarning, FloatingPointError) as e:
            last_err = f"curve_fit failed: {e}"
            continue
        if np.all(np.isfinite(p)) and np.isfinite(sse) and sse < best_sse:
            best, best_sse = p, sse
    if best is None:
        return CurveFit(form, False, last_err)
    r0, a, half = float(best[0]), float(best[1]), float(best[2])
    b = float(best[3]) if form == "sigmoid" else math.nan
    return CurveFit(
        form=form,
        ok=True,
        reason="",
        asymptote=a,
        r0=r0,
        half_step=half,
        exponent=b,
        rmse=math.sqrt(best_sse / t.size),
        extrapolated=half > t_max,
    )
