"""Per-step series of a study's runs as numpy arrays: the NaN-padded step matrix of a metric,
NaN-aware smoothing and statistics over runs.  Numpy only, so the scores and tables read the
histories without importing matplotlib; :mod:`~harness.report.plots` draws from them."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.report.studydata import RunData


def step_matrix(runs: Sequence[RunData], key: str, length: int = 0) -> np.ndarray:
    """Per-step values of ``key`` as an ``(n_runs, T)`` float matrix, NaN-padded.

    T is the longest history (at least ``length``).  Runs that never logged the key are all NaN,
    so a diverged run simply stops contributing after its last step.
    """
    rows: list[np.ndarray] = []
    for r in runs:
        try:
            a = np.asarray(r.history.get(key, []), dtype=float).ravel()
        except (TypeError, ValueError):
            a = np.empty(0)
        a[~np.isfinite(a)] = np.nan
        rows.append(a)
    width = max([length, *(a.size for a in rows)]) if rows else length
    out = np.full((len(rows), width), np.nan)
    for i, a in enumerate(rows):
        out[i, : a.size] = a
    return out


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """NaN-aware centered moving average over ``window`` steps (1 = no smoothing).

    NaN steps are skipped in each window rather than poisoning it, and a step whose own value is
    NaN stays NaN, so smoothing never invents values past a diverged run's last step.
    """
    y = np.asarray(y, dtype=float)
    if window <= 1 or y.size == 0:
        return y
    ok = np.isfinite(y)
    kernel = np.ones(window)
    num = np.convolve(np.where(ok, y, 0.0), kernel, mode="same")
    den = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / den
    out[~ok] = np.nan
    return out


def default_window(n_steps: int) -> int:
    """Light smoothing: about 1/40 of the run, odd, at least 1 (no smoothing below 40 steps)."""
    w = max(1, int(round(n_steps / 40)))
    return w if w % 2 == 1 else w + 1


def nanstat(fn: Any, m: np.ndarray) -> np.ndarray:
    """``np.nanmean``/``nanmin``/``nanmax`` over runs without the all-NaN-column warning."""
    if m.shape[0] == 0:
        return np.full(m.shape[1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(m, axis=0)
