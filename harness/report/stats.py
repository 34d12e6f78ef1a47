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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from harness.report.bootstrap import (
    Interval,
    _check,
    _resample,
    bootstrap_ci,
    iqm_ci,
    mean_ci,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
    stratified_resample,
)
from harness.report.curvefit import CurveFit, fit_saturating_curve
from harness.report.estimators import (
    _flat,
    _iqm_last,
    _mean,
    _tasks,
    iqm,
    median,
    probability_of_improvement,
)
from harness.report.studydata import CellSummary

__all__ = [
    "CellSummary",
    "CurveFit",
    "Interval",
    "MIN_SEEDS_FOR_VERDICT",
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
# Can the CIs separate the cells?
# --------------------------------------------------------------------------------------------


#: Fewer scored runs than this in a cell (or in the baseline, or completed runs for a
#: start-vs-final change) and the report gives no verdict from a bootstrap interval: with 1 or
#: 2 values a percentile bootstrap has (almost) no width and says nothing about seed noise.
#: Verdicts of the adaptive seed rule are its own (a paired-t interval that accounts for its
#: looks) and stand at any count it allows.
MIN_SEEDS_FOR_VERDICT = 3


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
# Per-cell summary (the record, :class:`CellSummary`, is plain data in ``studydata``)
# --------------------------------------------------------------------------------------------


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
