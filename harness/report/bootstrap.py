"""Intervals and the bootstrap engine: percentile and BCa bootstrap CIs, stratified over tasks,
seeded so that the same call gives the same interval bit for bit (conventions:
:mod:`harness.report.stats`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from harness.report.estimators import _flat, _iqm_last, _mean, _poi_arrays, _tasks

Method = Literal["percentile", "bca"]
Aggregate = Literal["pooled", "task_mean"]
# A statistic over groups: takes arrays shaped (..., n_g), one per group, returns shape (...).
_GroupStat = Callable[[Sequence[np.ndarray]], np.ndarray]


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


class BootstrapOptions(TypedDict, total=False):
    """The keyword options :func:`bootstrap_ci` takes (and its defaults), for its shorthands."""

    n_boot: int
    confidence: float
    seed: int
    method: Method


def mean_ci(x: ArrayLike, **options: Unpack[BootstrapOptions]) -> Interval:
    """Mean of the sample with its bootstrap CI (:func:`bootstrap_ci` with ``np.mean``)."""
    return bootstrap_ci(x, _mean, vectorized=True, **options)


def iqm_ci(x: ArrayLike, **options: Unpack[BootstrapOptions]) -> Interval:
    """IQM of the sample with its bootstrap CI (:func:`bootstrap_ci` with :func:`iqm`)."""
    return bootstrap_ci(x, _iqm_last, vectorized=True, **options)


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
