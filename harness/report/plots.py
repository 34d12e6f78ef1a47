"""The report's figures: matplotlib PNGs drawn from a ``StudyData`` and the ranking rows.

Why a module of its own: :mod:`harness.report` decides what the numbers are; this module only
draws them, so a figure can change without touching a statistic.  It never uses ``pyplot``: each
figure is a ``matplotlib.figure.Figure`` saved through the Agg canvas, so importing it changes no
global backend and leaks no open figures in a long-lived process (the sweep).

Every ``plot_*`` function returns a :class:`PlotFile` (path, title, caption) or ``None`` when the
study has nothing to draw (for example no run logged ``policy/behave_ess``), so the report can
say "not logged" instead of showing empty axes.  Figures are small (about 8 x 3.5 in at 90 dpi):
readable at a glance, cheap to render in tests.  The per-step arrays they draw come from
:mod:`~harness.report.series` (``step_matrix`` and ``smooth`` are importable from here too).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.core.fsutil import atomic_write
from harness.report import stats
from harness.report.series import default_window, nanstat, smooth, step_matrix
from harness.report.studydata import CellRow, StudyData

__all__ = [
    "DPI",
    "PlotFile",
    "cell_colors",
    "plain",
    "plot_clip_fractions",
    "plot_intervals",
    "plot_metric_curves",
    "plot_performance_profile",
    "smooth",
    "step_matrix",
]

DPI = 90
REWARD = "objective/reward"
CLIP_KEYS = (
    ("policy/clipfrac_low", "low (A<0, r<1−ε)"),
    ("policy/clipfrac_high", "high (A>0, r>1+ε_hi)"),
    ("policy/dual_clipfrac", "dual (c·|A| binds)"),
)


@dataclass(frozen=True)
class PlotFile:
    """One written figure: where it is, its heading in the report, and what it shows."""

    path: Path
    title: str
    caption: str


def cell_colors(labels: Sequence[str]) -> dict[str, Any]:
    """A fixed colour per cell, in grid order, so every figure uses the same colour for a cell."""
    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def plain(text: str) -> str:
    """User text (a cell label, a metric name) as matplotlib shows it literally: a ``$`` pair
    would otherwise start mathtext, and a label such as ``cost $x^$`` fails to parse and takes
    the whole report down.  Matplotlib renders an escaped ``\\$`` as a plain ``$``."""
    return str(text).replace("$", r"\$")


def _legend_label(label: str, data: StudyData) -> str:
    return plain(f"{label} (baseline)" if label == data.baseline else label)


def _save(fig: Figure, path: Path) -> Path:
    """Write the PNG whole (temp file + rename): a concurrent report of the same study, or a
    full disk, never leaves a missing or half-written plot behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    return atomic_write(path, buf.getvalue())


def _finish_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)


def _auto_log(ax: Axes, values: np.ndarray) -> bool:
    """Log y axis when every value is positive and they span more than two decades."""
    v = values[np.isfinite(values)]
    if v.size and (v > 0).all() and v.max() / v.min() > 100.0:
        ax.set_yscale("log")
        return True
    return False


# --------------------------------------------------------------------------------------------
# Per-step curves
# --------------------------------------------------------------------------------------------


def plot_metric_curves(
    data: StudyData,
    key: str,
    path: Path,
    *,
    title: str,
    ylabel: str,
    markers: bool = False,
    cells: Sequence[str] | None = None,
) -> PlotFile | None:
    """Mean over a cell's seeds per step (line) with the min–max over seeds (band), per cell
    (``cells``: only these, in this order, e.g. the top of the ranking and the baseline).

    Light centered smoothing (:func:`default_window`) keeps the seed band readable; sparse
    metrics (``markers=True``, e.g. eval accuracy every k steps) are drawn unsmoothed at the
    steps where they were logged.  Diverged runs are marked × at their last logged value.
    Returns None when no run logged ``key``.
    """
    labels = list(data.cells) if cells is None else list(cells)
    colors = cell_colors(labels)
    mats = {c: step_matrix(data.runs_of(c), key, data.steps) for c in labels}
    if not any(np.isfinite(m).any() for m in mats.values()):
        return None
    n_steps = max(m.shape[1] for m in mats.values())
    window = 1 if markers else default_window(n_steps)
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    everything = []
    any_diverged = False
    for c in labels:
        m = mats[c]
        if not np.isfinite(m).any():
            continue
        x = np.arange(m.shape[1])
        mean = nanstat(np.nanmean, m)
        lo, hi = nanstat(np.nanmin, m), nanstat(np.nanmax, m)
        everything.append(m[np.isfinite(m)])
        if markers:
            ok = np.isfinite(mean)
            ax.plot(x[ok], mean[ok], "o-", ms=3, lw=1.4, color=colors[c])
            ax.fill_between(x[ok], lo[ok], hi[ok], color=colors[c], alpha=0.15, lw=0)
        else:
            ax.plot(x, smooth(mean, window), lw=1.4, color=colors[c])
            ax.fill_between(
                x, smooth(lo, window), smooth(hi, window), color=colors[c], alpha=0.15, lw=0
            )
        for run, row in zip(data.runs_of(c), m, strict=True):
            last = np.flatnonzero(np.isfinite(row))
            if run.status == "diverged" and last.size:
                any_diverged = True
                ax.plot(last[-1], row[last[-1]], "x", ms=8, mew=2, color=colors[c])
    log = _auto_log(ax, np.concatenate(everything)) if everything else False
    _finish_axes(ax, title, "step", ylabel + (" (log scale)" if log else ""))
    handles = [
        Line2D([], [], color=colors[c], lw=2, label=_legend_label(c, data))
        for c in labels
        if np.isfinite(mats[c]).any()
    ]
    if any_diverged:
        handles.append(Line2D([], [], color="0.3", marker="x", ls="", label="run diverged"))
    ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)
    smooth_note = (
        f" Lines and bands are smoothed with a centered moving average over {window} steps."
        if window > 1
        else ""
    )
    caption = (
        f"Mean of `{key}` over each cell's seeds per step (line) and the min–max over seeds "
        f"(band).{smooth_note}"
        + (" × marks the last logged step of a diverged run." if any_diverged else "")
        + _subset_note(labels, data)
    )
    return PlotFile(_save(fig, path), title, caption)


def _subset_note(labels: Sequence[str], data: StudyData) -> str:
    if len(labels) >= len(data.cells):
        return ""
    return (
        f" Only {len(labels)} of the {len(data.cells)} cells are drawn (the top of the ranking "
        "and the baseline), so the lines stay legible; the ranking table has every cell."
    )


def plot_clip_fractions(
    data: StudyData, path: Path, *, cells: Sequence[str] | None = None
) -> PlotFile | None:
    """Clip fractions low / high / dual per cell in three panels (mean over seeds, smoothed).

    Separating the three shows *which* bound binds: a cell whose lines are all zero never clipped
    (inert clipping, or a step size too small to reach the clip range).
    """
    labels = list(data.cells) if cells is None else list(cells)
    colors = cell_colors(labels)
    mats = {
        (c, k): step_matrix(data.runs_of(c), k, data.steps) for c in labels for k, _ in CLIP_KEYS
    }
    if not any(np.isfinite(m).any() for m in mats.values()):
        return None
    n_steps = max(m.shape[1] for m in mats.values())
    window = default_window(n_steps)
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    axes = fig.subplots(1, 3, sharex=True)
    for ax, (k, name) in zip(axes, CLIP_KEYS, strict=True):
        for c in labels:
            m = mats[(c, k)]
            if np.isfinite(m).any():
                ax.plot(smooth(nanstat(np.nanmean, m), window), lw=1.3, color=colors[c])
        _finish_axes(ax, f"clip fraction {name}", "step", "fraction of tokens")
    handles = [Line2D([], [], color=colors[c], lw=2, label=_legend_label(c, data)) for c in labels]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(labels)), fontsize=7)
    title = "Clip fractions (low / high / dual)"
    caption = (
        "Mean over seeds per step of `policy/clipfrac_low`, `policy/clipfrac_high` and "
        "`policy/dual_clipfrac`"
        + (f", smoothed over {window} steps." if window > 1 else ".")
        + " All-zero lines mean the clip never bound in that cell."
        + _subset_note(labels, data)
    )
    return PlotFile(_save(fig, path), title, caption)


# --------------------------------------------------------------------------------------------
# Cross-seed statistics
# --------------------------------------------------------------------------------------------


def _row_label(row: CellRow, baseline: str | None) -> str:
    tag = " (baseline)" if row.label == baseline else ""
    unscored = row.n_failed + row.n_unfinished
    extra = f", {unscored} unscored" if unscored else ""
    return (
        f"{plain(row.label)}{tag}\n{row.n_used} scored, {row.n_diverged}/{row.n_seeds} "
        f"diverged{extra}"
    )


def plot_intervals(rows: Sequence[CellRow], data: StudyData, path: Path) -> PlotFile | None:
    """Interval estimates, rliable style: IQM with its 95 % CI per cell, and P(improve) with CI.

    Cells are listed in ranking order (best on top); the baseline's IQM interval is shaded across
    the panel so overlaps can be read off directly; the P(improve) panel marks 0.5 ("no better
    than the baseline").  Every row label carries its seed and divergence counts.
    """
    usable = [r for r in rows if math.isfinite(r.iqm.point)]
    if not usable:
        return None
    colors = cell_colors(list(data.cells))
    has_p = any(r.p_improve is not None for r in rows)
    fig = Figure(figsize=(10 if has_p else 7, 0.55 * len(rows) + 1.4), layout="constrained")
    axes = fig.subplots(1, 2 if has_p else 1, sharey=True, squeeze=False)[0]
    y = np.arange(len(rows))[::-1]
    ax = axes[0]
    base = next((r for r in rows if r.label == data.baseline), None)
    if base is not None and math.isfinite(base.iqm.low):
        ax.axvspan(base.iqm.low, base.iqm.high, color="0.85", zorder=0, label="baseline CI")
    for yi, r in zip(y, rows, strict=True):
        if math.isfinite(r.iqm.point):
            ax.plot([r.iqm.low, r.iqm.high], [yi, yi], lw=6, color=colors[r.label], alpha=0.6)
            ax.plot(r.iqm.point, yi, "|", ms=14, mew=2, color="black")
    ax.set_yticks(y, [_row_label(r, data.baseline) for r in rows], fontsize=7)
    metric = plain(data.metric)
    _finish_axes(ax, f"IQM of {metric} ({data.direction}) with 95 % CI", metric, "")
    if has_p:
        ax = axes[1]
        ax.axvline(0.5, color="0.4", ls="--", lw=1)
        for yi, r in zip(y, rows, strict=True):
            p = r.p_improve
            if p is not None and math.isfinite(p.point):
                ax.plot([p.low, p.high], [yi, yi], lw=6, color=colors[r.label], alpha=0.6)
                ax.plot(p.point, yi, "|", ms=14, mew=2, color="black")
        ax.set_xlim(-0.02, 1.02)
        _finish_axes(ax, "P(improve over baseline) with 95 % CI", "probability", "")
    title = "Interval estimates"
    caption = (
        f"Left: IQM (25 % trimmed mean) of the run-level `{data.metric}` per cell, bar = 95 % "
        "percentile-bootstrap CI, tick = point estimate"
        + ("; grey band = the baseline's CI." if base is not None else ".")
        + (
            " Right: probability that a run of the cell beats a run of the baseline, with its CI; "
            "the dashed line at 0.5 means no better than the baseline."
            if has_p
            else ""
        )
    )
    return PlotFile(_save(fig, path), title, caption)


def plot_performance_profile(
    rows: Sequence[CellRow],
    data: StudyData,
    path: Path,
    *,
    n_boot: int,
    seed: int,
    cells: Sequence[str] | None = None,
) -> PlotFile | None:
    """Performance profile: the fraction of a cell's runs scoring better than τ, for each τ.

    For ``direction="maximize"`` this is rliable's F(τ) = fraction of runs with score > τ; for
    ``minimize`` it is the fraction with score < τ (computed as the profile of the negated
    scores), so a curve further up-right is always better.  Bands are pointwise bootstrap CIs.
    Uses the same scores as the ranking (diverged runs at their imputed score).
    """
    if cells is not None:
        rows = [r for r in rows if r.label in set(cells)]
    scores = {r.label: np.asarray([s for s in r.scores if math.isfinite(s)]) for r in rows}
    scores = {c: s for c, s in scores.items() if s.size}
    if not scores:
        return None
    allv = np.concatenate(list(scores.values()))
    lo, hi = float(allv.min()), float(allv.max())
    pad = 0.05 * (hi - lo) if hi > lo else max(abs(lo) * 0.05, 0.05)
    taus = np.linspace(lo - pad, hi + pad, 121)
    sign = 1.0 if data.direction == "maximize" else -1.0
    bands = stats.performance_profile_ci(
        {c: sign * s for c, s in scores.items()}, sign * taus, n_boot=n_boot, seed=seed
    )
    colors = cell_colors(list(data.cells) if cells is None else list(cells))
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    for r in rows:
        if r.label not in bands:
            continue
        b = bands[r.label]
        ax.step(taus, b.point, where="post", lw=1.5, color=colors[r.label])
        ax.fill_between(taus, b.low, b.high, step="post", color=colors[r.label], alpha=0.12, lw=0)
    cmp = ">" if sign > 0 else "<"
    _finish_axes(
        ax,
        "Performance profile",
        f"threshold τ on {plain(data.metric)}",
        f"fraction of runs {cmp} τ",
    )
    ax.set_ylim(-0.02, 1.02)
    handles = [
        Line2D([], [], color=colors[r.label], lw=2, label=_legend_label(r.label, data))
        for r in rows
        if r.label in bands
    ]
    ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)
    caption = (
        f"Fraction of each cell's scored runs with `{data.metric}` {cmp} τ (step line) and its "
        "pointwise 95 % bootstrap band.  A curve that lies above another for every τ dominates "
        "it; crossing curves mean the ranking depends on the threshold."
        + _subset_note([r.label for r in rows], data)
    )
    return PlotFile(_save(fig, path), "Performance profile", caption)
