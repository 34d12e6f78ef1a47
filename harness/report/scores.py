"""What the report computes: each run's score (diverged runs scored as the worst value, or left
out), the ranking of the cells with their interval estimates, and the curve fits."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from harness.metrics.stability import RUN_SMOOTH
from harness.report import stats
from harness.report.series import step_matrix
from harness.report.studydata import CellRow, RunData, StudyData

DivergedPolicy = Literal["worst", "exclude"]

APPROX_KL = "policy/approx_kl"
CLIP_LOW, CLIP_HIGH, CLIP_DUAL = (
    "policy/clipfrac_low",
    "policy/clipfrac_high",
    "policy/dual_clipfrac",
)
REWARD = "objective/reward"
CLIP_TAIL = 0.10  # clip fractions are averaged over the last 10 % of a run's logged steps


def _metric_value(run: RunData, metric: str) -> float:
    try:
        v = float(run.summary.get(metric, math.nan))
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _worst_by_task(data: StudyData) -> dict[str, float]:
    """The worst finite ``data.metric`` among completed and diverged runs, per task."""
    pick = min if data.direction == "maximize" else max
    seen: dict[str, list[float]] = {}
    for r in data.runs:
        v = _metric_value(r, data.metric)
        if r.status in ("completed", "diverged") and math.isfinite(v):
            seen.setdefault(r.task, []).append(v)
    return {t: float(pick(vs)) for t, vs in seen.items()}


def run_scores(data: StudyData, *, diverged: DivergedPolicy = "worst") -> list[float]:
    """The score of every run in ``data.runs`` (same order) that the statistics use.

    Completed runs score their ``summary[data.metric]``; diverged runs the study's worst value on
    their task (``"worst"``) or NaN (``"exclude"``); failed and unfinished runs NaN.  NaN scores
    are left out of every statistic and counted.
    """
    if diverged not in ("worst", "exclude"):
        raise ValueError(f"diverged must be 'worst' or 'exclude', got {diverged!r}")
    worst = _worst_by_task(data)
    out = []
    for r in data.runs:
        if r.status == "completed":
            out.append(_metric_value(r, data.metric))
        elif r.status == "diverged" and diverged == "worst":
            out.append(worst.get(r.task, math.nan))
        else:
            out.append(math.nan)
    return out


#: A run's ``stability/collapsed`` flag enters the collapse rate only when the run could show a
#: collapse worth the word: at least this many logged rewards (two of the training loops'
#: RUN_SMOOTH windows, so the peak and the fall each span a smoothed window) ...
MIN_COLLAPSE_STEPS = 2 * RUN_SMOOTH
#: ... and a smoothed peak reward of at least this, in reward units (5 % of the built-in tasks'
#: [0, 1] range): halving a peak of 0.016 is noise around zero, not a policy that lost what it
#: had learned.  A run below either floor has no collapse flag (NaN: "—" when no run has one).
MIN_COLLAPSE_PEAK = 0.05


def collapse_flag(run: RunData, steps: int) -> float:
    """The run's ``stability/collapsed`` flag, or NaN when the run is too short
    (< :data:`MIN_COLLAPSE_STEPS` logged rewards) or its peak too low (trailing mean over
    RUN_SMOOTH rewards never reaching :data:`MIN_COLLAPSE_PEAK`) for the flag to mean a
    collapse.  Without a reward history, ``steps`` (the study's steps per run) and the peak the
    summaries imply (max_drawdown / max_drawdown_frac) stand in."""
    flag = _metric_value(run, "stability/collapsed")
    if math.isnan(flag):
        return math.nan
    rewards = step_matrix([run], REWARD)[0]
    rewards = rewards[np.isfinite(rewards)]
    if rewards.size:
        n = rewards.size
        window = np.ones(min(RUN_SMOOTH, n))
        # trailing means, the first ones over fewer values (as the summaries smooth them)
        sums = np.convolve(rewards, window)[:n]
        peak = float(np.max(sums / np.minimum(np.arange(1, n + 1), window.size)))
    else:
        n = steps
        drop = _metric_value(run, "stability/max_drawdown")
        frac = _metric_value(run, "stability/max_drawdown_frac")
        peak = drop / frac if frac > 0 else math.nan
    if n < MIN_COLLAPSE_STEPS or (math.isfinite(peak) and peak < MIN_COLLAPSE_PEAK):
        return math.nan
    return flag


def _last_finite(run: RunData, key: str) -> float:
    a = step_matrix([run], key)[0]
    ok = np.flatnonzero(np.isfinite(a))
    return float(a[ok[-1]]) if ok.size else math.nan


def _tail_mean(run: RunData, key: str) -> float:
    """Mean of the last 10 % (at least one) of the run's logged values of ``key``."""
    a = step_matrix([run], key)[0]
    a = a[np.isfinite(a)]
    if a.size == 0:
        return math.nan
    k = max(1, math.ceil(CLIP_TAIL * a.size))
    return float(np.mean(a[-k:]))


def _mean_finite(values: Iterable[float]) -> float:
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v)]
    return float(np.mean(v)) if v.size else math.nan


def _by_task(runs: Sequence[RunData], values: Sequence[float], tasks: Sequence[str]) -> Any:
    """Values as an array (one task) or a task -> array mapping (stratified statistics)."""
    if len(tasks) <= 1:
        return np.asarray(values, dtype=float)
    return {
        t: np.asarray([v for r, v in zip(runs, values, strict=True) if r.task == t], dtype=float)
        for t in tasks
    }


def _finite_only(values: Any) -> Any:
    if isinstance(values, Mapping):
        return {t: v[np.isfinite(v)] for t, v in values.items()}
    return values[np.isfinite(values)]


def _flip(values: Any, sign: float) -> Any:
    if isinstance(values, Mapping):
        return {t: sign * v for t, v in values.items()}
    return sign * values


def _tasks_of(runs: Sequence[RunData]) -> list[str]:
    return sorted({r.task for r in runs})


def ranking(
    data: StudyData,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    diverged: DivergedPolicy = "worst",
) -> list[CellRow]:
    """One :class:`CellRow` per cell, best first by the IQM of ``data.metric``.

    Statistics come from :func:`harness.report.stats.summarize_cell` on the scores of
    :func:`run_scores` (IQM and mean with 95 % percentile-bootstrap CIs, median, collapse rate);
    with several distinct ``RunData.task`` values they use the stratified bootstrap (runs
    resampled within each task).  P(improve over the baseline) uses
    :func:`harness.report.stats.probability_of_improvement_ci`; for ``direction="minimize"`` it is
    computed on negated scores, so it always means "probability of doing better".  Every
    bootstrap uses the same ``seed``: the same call gives the same numbers.  Cells whose IQM is
    NaN (no usable run) sort last; ties keep grid order.
    """
    ctx = _study_scores(data, diverged)
    rows = [
        _cell_row(data, label, overrides, ctx, n_boot=n_boot, seed=seed)
        for label, overrides in data.cells.items()
    ]
    order = {label: i for i, label in enumerate(data.cells)}

    def key(r: CellRow) -> tuple[bool, float, int]:
        if ctx.by_paired:
            v = 0.0 if r.is_baseline else r.paired_diff
            bad = math.isnan(v)
            return bad, 0.0 if bad else -v, order[r.label]
        bad = math.isnan(r.iqm.point)
        return bad, 0.0 if bad else -ctx.sign * r.iqm.point, order[r.label]

    return sorted(rows, key=key)


@dataclass(frozen=True)
class _StudyScores:
    """What each cell's row is computed against: every run's score (keyed by ``id`` of the run),
    the study's tasks, the sign that makes larger better, the baseline's runs and their scores
    (``base_vals`` None without a baseline cell) and whether cells are compared with the
    baseline on the seeds both ran (:func:`paired_ranking`)."""

    score_of: dict[int, float]
    tasks: list[str]
    sign: float
    base_runs: list[RunData]
    base_vals: Any
    by_paired: bool


def _study_scores(data: StudyData, diverged: DivergedPolicy) -> _StudyScores:
    """The run scores of :func:`run_scores` and the baseline's, as every cell's row needs them."""
    scores = run_scores(data, diverged=diverged)
    score_of = {id(r): s for r, s in zip(data.runs, scores, strict=True)}
    tasks = _tasks_of(data.runs)
    base_vals = None
    base_runs: list[RunData] = []
    if data.baseline is not None and data.baseline in data.cells:
        base_runs = data.runs_of(data.baseline)
        base_vals = _by_task(base_runs, [score_of[id(r)] for r in base_runs], tasks)
    sign = 1.0 if data.direction == "maximize" else -1.0
    return _StudyScores(score_of, tasks, sign, base_runs, base_vals, paired_ranking(data))


def _cell_row(
    data: StudyData,
    label: str,
    overrides: Mapping[str, Any],
    ctx: _StudyScores,
    *,
    n_boot: int,
    seed: int,
) -> CellRow:
    """One cell's :class:`CellRow`: its interval statistics, its comparison with the baseline,
    its run counts and its diagnostics (collapses, final KL, clip fractions, reasons)."""
    runs = data.runs_of(label)
    vals_list = [ctx.score_of[id(r)] for r in runs]
    vals = _by_task(runs, vals_list, ctx.tasks)
    collapsed = [collapse_flag(r, data.steps) for r in runs]
    div_flags = [1.0 if r.status == "diverged" else 0.0 for r in runs]
    summary = stats.summarize_cell(
        vals,
        collapsed=np.asarray(collapsed, dtype=float),
        diverged=np.asarray(div_flags, dtype=float),
        seed=seed,
        n_boot=n_boot,
    )
    is_base = label == data.baseline
    p_iv, paired_diff, n_paired = _against_baseline(
        runs, vals_list, vals, ctx, is_base=is_base, n_boot=n_boot, seed=seed
    )
    flags = np.asarray(collapsed, dtype=float)
    return CellRow(
        label=label,
        overrides=dict(overrides),
        is_baseline=is_base,
        n_seeds=len(runs),
        n_completed=sum(r.status == "completed" for r in runs),
        n_diverged=summary.n_diverged,
        n_failed=sum(r.status == "failed" for r in runs),
        n_unfinished=sum(r.status in ("running", "waiting") for r in runs),
        n_used=summary.n_used,
        iqm=summary.iqm,
        mean=summary.mean,
        median=summary.median,
        p_improve=p_iv,
        collapse_rate=summary.collapse_rate,
        n_collapsed=int(np.sum(flags[np.isfinite(flags)] > 0)),
        final_kl=_mean_finite(_last_finite(r, APPROX_KL) for r in runs),
        clipfrac_low=_mean_finite(_tail_mean(r, CLIP_LOW) for r in runs),
        clipfrac_high=_mean_finite(_tail_mean(r, CLIP_HIGH) for r in runs),
        dual_clipfrac=_mean_finite(_tail_mean(r, CLIP_DUAL) for r in runs),
        inert_clip=any(r.inert_clip for r in runs),
        scores=tuple(vals_list),
        diverged_reasons=tuple(_run_note(r) for r in runs if r.status == "diverged"),
        failed_reasons=tuple(
            _run_note(r) for r in runs if r.status in ("failed", "running", "waiting")
        ),
        n_missing_metric=sum(
            r.status == "completed" and math.isnan(_metric_value(r, data.metric)) for r in runs
        ),
        paired_diff=paired_diff,
        n_paired=n_paired,
    )


def _against_baseline(
    runs: Sequence[RunData],
    vals_list: Sequence[float],
    vals: Any,
    ctx: _StudyScores,
    *,
    is_base: bool,
    n_boot: int,
    seed: int,
) -> tuple[stats.Interval | None, float, int]:
    """A cell against the baseline: P(improve) with its CI (None for the baseline itself or
    without one), and the mean paired difference (> 0 better; NaN for the baseline) with the
    number of (task, seed) pairs both scored (0 for the baseline)."""
    pr, mine, theirs = _paired_scores(runs, vals_list, ctx.base_runs, ctx.score_of)
    paired_diff = ctx.sign * float(np.mean(np.subtract(mine, theirs))) if mine else math.nan
    p_iv = None
    if ctx.base_vals is not None and not is_base:
        if ctx.by_paired:
            # Cells of an adaptive study ran different seed counts: compare on the seeds
            # both ran (the pairs the sequential decision used), not 3 seeds against 8.
            cell_p = _by_task(pr, mine, ctx.tasks)
            base_p = _by_task(pr, theirs, ctx.tasks)
        else:
            cell_p, base_p = _finite_only(vals), _finite_only(ctx.base_vals)
        p_iv = stats.probability_of_improvement_ci(
            _flip(cell_p, ctx.sign),
            _flip(base_p, ctx.sign),
            n_boot=n_boot,
            seed=seed,
        )
    if is_base:
        return p_iv, math.nan, 0
    return p_iv, paired_diff, len(mine)


def paired_ranking(data: StudyData) -> bool:
    """Whether the ranking compares each cell with the baseline on the seeds both ran: in an
    adaptive study deciding against the baseline, where a decided cell stops at fewer seeds than
    the baseline runs, so IQMs over different seed sets are not comparable."""
    return (
        data.adaptive is not None
        and data.adaptive.get("decide", "baseline") == "baseline"
        and data.baseline is not None
        and data.baseline in data.cells
    )


def _paired_scores(
    runs: Sequence[RunData],
    values: Sequence[float],
    base_runs: Sequence[RunData],
    score_of: Mapping[int, float],
) -> tuple[list[RunData], list[float], list[float]]:
    """The cell's runs, their scores and the baseline's on the (task, seed) pairs both scored,
    in the cell's run order."""
    base = {(r.task, r.seed): score_of[id(r)] for r in base_runs}
    paired: list[RunData] = []
    mine: list[float] = []
    theirs: list[float] = []
    for r, v in zip(runs, values, strict=True):
        b = base.get((r.task, r.seed), math.nan)
        if math.isfinite(v) and math.isfinite(b):
            paired.append(r)
            mine.append(v)
            theirs.append(b)
    return paired, mine, theirs


def _run_note(run: RunData) -> str:
    task = f" ({run.task})" if run.task else ""
    reason = run.reason or f"status {run.status}, no reason recorded"
    if run.status in ("running", "waiting"):
        reason = f"{run.status}, not finished"
    return f"seed {run.seed}{task}: {reason}"


@dataclass(frozen=True)
class CurveFitRow:
    """A saturating fit of one cell's mean reward curve (completed runs only)."""

    label: str
    fit: stats.CurveFit
    n_runs: int


def fit_curves(data: StudyData) -> list[CurveFitRow]:
    """Fit ``stats.fit_saturating_curve`` (sigmoid) to each cell's mean reward curve.

    Only completed runs enter the mean: a diverged run's truncated curve would bend the mean
    where it stops.  A fit that fails is kept with its reason.
    """
    # The fit is bounded by what the reward was seen to reach in the study and by the run
    # length: a ceiling above every value any run logged, or a half-step past the horizon, is
    # an extrapolation the data cannot support.
    seen = step_matrix([r for r in data.runs if r.status == "completed"], REWARD, data.steps)
    finite = seen[np.isfinite(seen)]
    value_range = (float(finite.min()), float(finite.max())) if finite.size else None
    out = []
    for label in data.cells:
        runs = [r for r in data.runs_of(label) if r.status == "completed"]
        m = step_matrix(runs, REWARD, data.steps)
        if runs and np.isfinite(m).any():
            with np.errstate(all="ignore"):
                cnt = np.isfinite(m).sum(axis=0)
                mean = np.where(cnt > 0, np.nansum(m, axis=0) / np.maximum(cnt, 1), np.nan)
            fit = stats.fit_saturating_curve(
                np.arange(mean.size),
                mean,
                value_range=value_range,
                max_half_step=float(max(data.steps, mean.size - 1)),
            )
        else:
            fit = stats.CurveFit("sigmoid", False, "no completed run logged objective/reward")
        out.append(CurveFitRow(label, fit, len(runs)))
    return out
