"""Point estimates over seeds: IQM, median, probability of improvement (the conventions are
:mod:`harness.report.stats`'s)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


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
