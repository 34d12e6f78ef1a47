"""The ablation report: ranking, warnings, conclusion and plots, from a ``StudyData`` alone.

Why it exists: an ablation is only useful when a reader who did not run it can trust its
conclusion.  RL runs are noisy, so every cell is shown as an interval estimate next to its seed
count, its diverged runs and its collapse rate (Agarwal et al. 2021, arXiv 2108.13264), and the
conclusion says plainly when the seeds cannot separate the cells.  ``docs/report.md`` explains
each section; ``docs/stability.md`` defines the statistics (implemented in :mod:`harness.report.stats`).

Only ``StudyData`` goes in (no Optuna, MLflow or torch), so the report can be rebuilt and tested
from stored runs.  Every number in the text is computed here from the data.

Diverged runs (``status == "diverged"``) are never dropped.  By default (``diverged="worst"``)
each one is scored as the worst value of ``data.metric`` observed in the study on the same task
(lowest for ``maximize``, highest for ``minimize``), so a cell that diverges is penalized in its
IQM, mean, median, P(improve) and performance profile instead of being flattered by losing its
worst seed.  ``diverged="exclude"`` leaves them out of the statistics instead.  Either way
``n_diverged`` is printed next to every interval.  Failed (crashed) and unfinished runs have no
score and are excluded, and counted.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.table import Table

from harness.core.configtools import flatten
from harness.report import progress as report_progress
from harness.report import stats
from harness.report.plots import (
    PlotFile,
    plot_clip_fractions,
    plot_intervals,
    plot_metric_curves,
    plot_performance_profile,
    step_matrix,
)
from harness.report.stats import Interval
from harness.report.studydata import CellRow, RunData, StudyData

__all__ = [
    "CellRow",
    "CurveFitRow",
    "ReportFiles",
    "build_report",
    "conclusion",
    "fit_curves",
    "fmt",
    "fmt_interval",
    "fmt_pct",
    "fmt_pct_interval",
    "ranking",
    "render_ranking_table",
    "run_scores",
    "warnings_for",
]

DivergedPolicy = Literal["worst", "exclude"]

APPROX_KL = "policy/approx_kl"
CLIP_LOW, CLIP_HIGH, CLIP_DUAL = (
    "policy/clipfrac_low",
    "policy/clipfrac_high",
    "policy/dual_clipfrac",
)
REWARD = "objective/reward"
CLIP_TAIL = 0.10  # clip fractions are averaged over the last 10 % of a run's logged steps


# --------------------------------------------------------------------------------------------
# Formatting: one place, so the tests can rebuild the exact strings the report prints
# --------------------------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    """A number with 3 significant digits; "—" for None or NaN (never "nan" in a report)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if 1e3 <= abs(x) < 1e6:
        return f"{x:.0f}"
    return f"{x:.3g}"


def fmt_interval(iv: Interval | None) -> str:
    """``point [low, high]`` with :func:`fmt` numbers."""
    if iv is None:
        return "—"
    if math.isnan(iv.point):
        return "—"
    return f"{fmt(iv.point)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def fmt_pct(x: float | None) -> str:
    """A probability as a whole percentage, "83 %"."""
    if x is None or math.isnan(x):
        return "—"
    return f"{100.0 * x:.0f} %"


def fmt_pct_interval(iv: Interval | None) -> str:
    """A probability interval as percentages, "83 % [61 %, 97 %]"."""
    if iv is None or math.isnan(iv.point):
        return "—"
    return f"{fmt_pct(iv.point)} [{fmt_pct(iv.low)}, {fmt_pct(iv.high)}]"


def _fmt_duration(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min {sec:02d} s"
    if m:
        return f"{m} min {sec:02d} s"
    return f"{seconds:.1f} s"


def _code(text: str) -> str:
    """Inline code span (labels and keys), with backticks in the text made harmless."""
    return "`" + str(text).replace("`", "'") + "`"


# --------------------------------------------------------------------------------------------
# Ranking
# --------------------------------------------------------------------------------------------


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
    scores = run_scores(data, diverged=diverged)
    score_of = {id(r): s for r, s in zip(data.runs, scores, strict=True)}
    tasks = _tasks_of(data.runs)
    sign = 1.0 if data.direction == "maximize" else -1.0
    base_vals = None
    if data.baseline is not None and data.baseline in data.cells:
        base_runs = data.runs_of(data.baseline)
        base_vals = _by_task(base_runs, [score_of[id(r)] for r in base_runs], tasks)
    rows: list[CellRow] = []
    for label, overrides in data.cells.items():
        runs = data.runs_of(label)
        vals_list = [score_of[id(r)] for r in runs]
        vals = _by_task(runs, vals_list, tasks)
        collapsed = [_metric_value(r, "stability/collapsed") for r in runs]
        div_flags = [1.0 if r.status == "diverged" else 0.0 for r in runs]
        summary = stats.summarize_cell(
            vals,
            collapsed=np.asarray(collapsed, dtype=float),
            diverged=np.asarray(div_flags, dtype=float),
            seed=seed,
            n_boot=n_boot,
        )
        p_iv = None
        if base_vals is not None and label != data.baseline:
            p_iv = stats.probability_of_improvement_ci(
                _flip(_finite_only(vals), sign),
                _flip(_finite_only(base_vals), sign),
                n_boot=n_boot,
                seed=seed,
            )
        flags = np.asarray(collapsed, dtype=float)
        rows.append(
            CellRow(
                label=label,
                overrides=dict(overrides),
                is_baseline=label == data.baseline,
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
                    r.status == "completed" and math.isnan(_metric_value(r, data.metric))
                    for r in runs
                ),
            )
        )
    order = {label: i for i, label in enumerate(data.cells)}

    def key(r: CellRow) -> tuple[bool, float, int]:
        bad = math.isnan(r.iqm.point)
        return bad, 0.0 if bad else -sign * r.iqm.point, order[r.label]

    return sorted(rows, key=key)


def _run_note(run: RunData) -> str:
    task = f" ({run.task})" if run.task else ""
    reason = run.reason or f"status {run.status}, no reason recorded"
    if run.status in ("running", "waiting"):
        reason = f"{run.status}, not finished"
    return f"seed {run.seed}{task}: {reason}"


def _clip_triple(r: CellRow) -> str:
    return f"{fmt(r.clipfrac_low)} / {fmt(r.clipfrac_high)} / {fmt(r.dual_clipfrac)}"


def _notes(r: CellRow) -> str:
    out = []
    if r.is_baseline:
        out.append("baseline")
    if r.inert_clip:
        out.append("inert clip")
    if r.n_failed:
        out.append(f"{r.n_failed} failed")
    if r.n_unfinished:
        out.append(f"{r.n_unfinished} unfinished")
    if r.n_missing_metric:
        out.append(f"{r.n_missing_metric} without metric")
    return ", ".join(out)


RANKING_HEADER = (
    "#",
    "cell",
    "IQM [95 % CI]",
    "mean [95 % CI]",
    "median",
    "P(improve) [95 % CI]",
    "collapse",
    "diverged/seeds",
    "final KL",
    "clip low / high / dual",
    "notes",
)


def _ranking_cells(i: int, r: CellRow) -> list[str]:
    return [
        str(i),
        r.label,
        fmt_interval(r.iqm),
        fmt_interval(r.mean),
        fmt(r.median),
        "baseline" if r.is_baseline else fmt_pct_interval(r.p_improve),
        fmt_pct(r.collapse_rate),
        f"{r.n_diverged}/{r.n_seeds}",
        fmt(r.final_kl),
        _clip_triple(r),
        _notes(r),
    ]


def render_ranking_table(rows: Sequence[CellRow], data: StudyData) -> Table:
    """The ranking as a ``rich`` table for the terminal (``harness ablate`` prints it at the end).

    Same columns as the report's table; the baseline row is bold, diverged counts are red and
    inert-clipping cells yellow, so the failure counts are seen together with the intervals.
    """
    arrow = "↑" if data.direction == "maximize" else "↓"
    table = Table(
        title=f"{data.study}: IQM of {data.metric} {arrow} (95 % bootstrap CI)",
        caption="P(improve) = chance a run of the cell beats a run of the baseline",
        show_header=True,
        header_style="bold",
    )
    for h in RANKING_HEADER:
        table.add_column(h, justify="left" if h in ("cell", "notes") else "right")
    for i, r in enumerate(rows, 1):
        cells = _ranking_cells(i, r)
        if r.n_diverged:
            cells[7] = f"[red]{cells[7]}[/red]"
        if r.inert_clip:
            cells[10] = f"[yellow]{cells[10]}[/yellow]"
        table.add_row(
            *(_rich_escape(c) if j not in (7, 10) else c for j, c in enumerate(cells)),
            style="bold" if r.is_baseline else None,
        )
    return table


def _rich_escape(text: str) -> str:
    """Escape rich markup in data (a cell label such as ``[a,b]`` must print literally)."""
    return text.replace("[", r"\[")


# --------------------------------------------------------------------------------------------
# Curve fits
# --------------------------------------------------------------------------------------------


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
    out = []
    for label in data.cells:
        runs = [r for r in data.runs_of(label) if r.status == "completed"]
        m = step_matrix(runs, REWARD, data.steps)
        if runs and np.isfinite(m).any():
            with np.errstate(all="ignore"):
                cnt = np.isfinite(m).sum(axis=0)
                mean = np.where(cnt > 0, np.nansum(m, axis=0) / np.maximum(cnt, 1), np.nan)
            fit = stats.fit_saturating_curve(np.arange(mean.size), mean)
        else:
            fit = stats.CurveFit("sigmoid", False, "no completed run logged objective/reward")
        out.append(CurveFitRow(label, fit, len(runs)))
    return out


# --------------------------------------------------------------------------------------------
# Warnings and conclusion: sentences built from the numbers
# --------------------------------------------------------------------------------------------


def _separates(a: Interval, b: Interval) -> bool:
    return not stats.cis_overlap(a, b)


def warnings_for(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """The warnings the harness knows, as markdown bullet texts (empty list: nothing to warn)."""
    out: list[str] = []
    inert = [r for r in rows if r.inert_clip]
    if inert:
        measured = "; ".join(f"{_code(r.label)}: {_clip_triple(r)}" for r in inert)
        out.append(
            f"**Inert clipping (ratio ≡ 1)** in {', '.join(_code(r.label) for r in inert)}: the "
            "policy ratio π_θ/π_prox is identically 1 in these cells, so `eps_clip`, "
            "`eps_clip_higher` and `c_clip` cannot change the loss there; differences between "
            "such cells are seed noise. Measured clip fractions low / high / dual (last 10 % of "
            f"steps): {measured}."
        )
    for r in rows:
        if r.n_diverged:
            runs = data.runs_of(r.label)
            scored = sum(
                x.status == "diverged" and math.isfinite(s)
                for x, s in zip(runs, r.scores, strict=True)
            )
            how = (
                "scored as the worst observed value"
                if scored == r.n_diverged
                else f"{scored} scored as the worst observed value, the rest left out"
                if scored
                else "left out of the statistics"
            )
            out.append(
                f"**Diverged seeds** in {_code(r.label)}: {r.n_diverged} of {r.n_seeds} "
                f"({how}): " + "; ".join(r.diverged_reasons) + "."
            )
    for r in rows:
        if r.failed_reasons:
            out.append(
                f"**Runs without a score** in {_code(r.label)} (left out of the statistics): "
                + "; ".join(r.failed_reasons)
                + "."
            )
        if r.n_missing_metric:
            out.append(
                f"**Missing metric** in {_code(r.label)}: {r.n_missing_metric} completed run(s) "
                f"have no finite {_code(data.metric)}; they are left out of the statistics."
            )
    for r in rows:
        if r.n_collapsed:
            out.append(
                f"**Collapse** in {_code(r.label)}: {r.n_collapsed} of {r.n_seeds} runs lost more "
                "than the collapse fraction of their peak reward (`stability/collapsed`), "
                f"collapse rate {fmt_pct(r.collapse_rate)}."
            )
    base = next((r for r in rows if r.is_baseline), None)
    if base is not None:
        close = stats.inseparable_cells({r.label: r.iqm for r in rows}, base.label)
        parts = []
        for r in (r for r in rows if r.label in close):
            n = min(r.n_used, base.n_used)
            need = stats.seeds_to_separate(r.iqm, base.iqm, max(n, 1))
            if math.isnan(need):
                hint = "no interval to compare"
            elif math.isinf(need):
                hint = "same IQM as the baseline: more seeds would not separate them"
            elif need > 20 * n:
                hint = (
                    f"≈ {need:.0f} seeds per cell would be needed (now {n}): the difference is "
                    "too small to resolve in practice"
                )
            else:
                hint = f"≈ {need:.0f} seeds per cell would be needed (now {n})"
            parts.append(
                f"{_code(r.label)} (IQM {fmt_interval(r.iqm)} vs baseline "
                f"{fmt_interval(base.iqm)}; {hint})"
            )
        if parts:
            out.append(
                "**Too few seeds for the CI to separate these cells** from the baseline: "
                + "; ".join(parts)
                + ". The seed estimate is a heuristic (half-widths shrinking as 1/√n), "
                "not a power analysis."
            )
    elif data.baseline is None:
        out.append("No baseline cell is named, so P(improve) is not computed.")
    return out


def conclusion(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """A short plain-language conclusion, one markdown paragraph or bullet per sentence."""
    better = "higher" if data.direction == "maximize" else "lower"
    ended = [r.status for r in data.runs if r.status in ("completed", "failed", "diverged")]
    if ended and "completed" not in ended:
        return no_run_completed(data)
    usable = [r for r in rows if math.isfinite(r.iqm.point)]
    if not usable:
        return ["No cell has a usable score yet: nothing can be concluded."]
    best = usable[0]
    base = next((r for r in rows if r.is_baseline), None)
    # Where the runs ended against where they started: a ranking alone would hide a grid in
    # which every cell ends below its warm start.
    progress = report_progress.conclusion_lines(
        data, [r.label for r in rows], base.label if base else None, code=_code
    )
    out = [
        f"**{_code(best.label)} ranks first** by the IQM of {_code(data.metric)} ({better} is "
        f"better): {fmt_interval(best.iqm)} over {best.n_used} scored runs "
        f"({best.n_diverged}/{best.n_seeds} diverged)."
    ]
    if base is None:
        if len(usable) > 1:
            second = usable[1]
            sep = _separates(best.iqm, second.iqm)
            out.append(
                f"Its 95 % CI {'is separated from' if sep else 'overlaps'} that of the runner-up "
                f"{_code(second.label)} ({fmt_interval(second.iqm)})"
                + ("." if sep else ": these seeds cannot tell the two apart.")
            )
        return out + progress
    if best.label == base.label:
        out.append(f"The baseline ranks first: no cell has a {better} IQM.")
    elif math.isfinite(base.iqm.point):
        sep = _separates(best.iqm, base.iqm)
        out.append(
            f"Its CI {'does not overlap' if sep else 'overlaps'} the baseline's "
            f"({_code(base.label)}: {fmt_interval(base.iqm)})"
            + (
                ": the seeds separate it from the baseline."
                if sep
                else ": with these seeds it is not separated from the baseline."
            )
        )
    verdicts = []
    separated: list[str] = []
    for r in rows:
        p = r.p_improve
        if r.is_baseline or p is None or math.isnan(p.point):
            continue
        if p.low > 0.5:
            tail = "better than the baseline (CI above 50 %)"
        elif p.high < 0.5:
            tail = "worse than the baseline (CI below 50 %)"
        else:
            tail = "not distinguishable from the baseline (CI contains 50 %)"
        if p.low > 0.5 or p.high < 0.5 or _separates(r.iqm, base.iqm):
            separated.append(r.label)
        verdicts.append(
            f"{_code(r.label)} beat the baseline in {fmt_pct_interval(p)} of seed pairs: {tail}."
        )
    out.extend(verdicts)
    if verdicts and not separated:
        out.append(
            "**Nothing separates from the baseline**: no cell's IQM CI clears the baseline's and "
            "no P(improve) CI excludes 50 %. Do not act on this ranking without more seeds."
        )
    elif separated:
        out.append(
            "Separated from the baseline (IQM CIs apart or P(improve) CI excluding 50 %): "
            + ", ".join(_code(c) for c in separated)
            + "."
        )
    inert = [r.label for r in rows if r.inert_clip]
    if inert:
        out.append(
            f"Clipping is inert in {', '.join(_code(c) for c in inert)}: these results say "
            "nothing about the clip settings."
        )
    return out + progress


def no_run_completed(data: StudyData) -> list[str]:
    """The conclusion of a study in which no run completed: what happened to each run, and why
    (each distinct reason once, with how many runs it hit)."""
    from harness.core.failures import count_reasons, short_reason

    n = {s: sum(r.status == s for r in data.runs) for s in ("failed", "diverged")}
    pending = sum(r.status in ("running", "waiting") for r in data.runs)
    expected = len(data.cells) * len(data.seeds)
    out = [
        f"**No run completed**: of {expected} runs, {n['failed']} failed, {n['diverged']} "
        f"diverged and {pending} have not finished, so there is no ranking and nothing can be "
        "concluded. Fix the cause below and run the same command again (failed runs are run "
        "again; diverged ones are results)."
    ]
    for status, what in (("failed", "Failed"), ("diverged", "Diverged")):
        reasons = [r.reason for r in data.runs if r.status == status]
        if reasons:
            parts = [
                f"{k} run{'s' if k != 1 else ''}: {_code(short_reason(text))}"
                for text, k in count_reasons(reasons)
            ]
            out.append(f"{what}: " + "; ".join(parts) + ".")
    return out


# --------------------------------------------------------------------------------------------
# Markdown + HTML writer
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1250px;
margin:2em auto;padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #eee}
h3{font-size:1.05em}
.tw{overflow-x:auto}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}
th,td{border:1px solid #d0d0d0;padding:.25em .55em;vertical-align:top}
th{background:#f3f3f3;text-align:left}
tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{background:#f2f2f2;padding:0 .25em;border-radius:3px;font-size:.92em}
td.label code{white-space:nowrap;font-size:1em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;border-radius:4px}
figure{margin:1em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}
ul.warnings li{background:#fff7e0;border-left:4px solid #e0a800;padding:.3em .6em;
margin:.3em 0;list-style:none}
ul.conclusion li{margin:.25em 0}
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])")


def _inline_html(text: str) -> str:
    """Escape text for HTML, then render the inline marks the report uses: `code`, **bold**,
    *italic* (code spans first, so a `*` inside code stays literal)."""
    parts = re.split(r"(`[^`]+`)", html.escape(text, quote=True))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{part[1:-1]}</code>")
        else:
            out.append(_ITALIC.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", part)))
    return "".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


_NUMERIC = re.compile(r"^[\s\d.,%\[\]—−+e/\-∞]+$")


@dataclass
class _Doc:
    """Writes the same content as markdown and as HTML, block by block."""

    md: list[str] = field(default_factory=list)
    html: list[str] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.md += ["#" * level + " " + text, ""]
        self.html.append(f"<h{level}>{_inline_html(text)}</h{level}>")

    def para(self, text: str) -> None:
        self.md += [text, ""]
        self.html.append(f"<p>{_inline_html(text)}</p>")

    def bullets(self, items: Sequence[str], css: str = "") -> None:
        self.md += [f"- {t}" for t in items] + [""]
        cls = f' class="{css}"' if css else ""
        self.html.append(
            f"<ul{cls}>" + "".join(f"<li>{_inline_html(t)}</li>" for t in items) + "</ul>"
        )

    def code(self, text: str) -> None:
        self.md += ["```", text, "```", ""]
        self.html.append(f"<pre><code>{html.escape(text)}</code></pre>")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], code_col: int = -1):
        """A table; column ``code_col`` (cell labels, config keys) is shown as code."""

        def cell_md(j: int, c: str) -> str:
            return _code(c) if j == code_col and c else _md_cell(c)

        self.md.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
        self.md.append("|" + "|".join("---" for _ in header) + "|")
        self.md += ["| " + " | ".join(cell_md(j, c) for j, c in enumerate(r)) + " |" for r in rows]
        self.md.append("")
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = []
        for r in rows:
            tds = []
            for j, c in enumerate(r):
                inner = f"<code>{html.escape(c)}</code>" if j == code_col and c else _inline_html(c)
                cls = ' class="num"' if c and j != code_col and _NUMERIC.match(c) else ""
                cls = ' class="label"' if j == code_col else cls  # a cell label: one line
                tds.append(f"<td{cls}>{inner}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        self.html.append(
            f'<div class="tw"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>"
        )

    def figure(self, plot: PlotFile, rel: str) -> None:
        self.md += [f"### {plot.title}", "", f"![{plot.title}]({rel})", "", plot.caption, ""]
        b64 = base64.b64encode(plot.path.read_bytes()).decode("ascii")
        self.html.append(
            f"<figure><h3>{html.escape(plot.title)}</h3>"
            f'<img src="data:image/png;base64,{b64}" alt="{html.escape(plot.title)}">'
            f"<figcaption>{_inline_html(plot.caption)}</figcaption></figure>"
        )

    def render_html(self, title: str) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(self.html)
            + "\n</body></html>\n"
        )


def _value_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, default=str)
    except (TypeError, ValueError):
        return str(v)


def _varied_keys(data: StudyData) -> set[str]:
    """Config keys that differ between runs: the grid's overrides and the run seed."""
    keys = {k for k in data.axes if k != "variant"} | {"seed"}
    for ov in data.cells.values():
        keys |= set(flatten(ov))
    return keys


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`build_report` wrote (the CLI logs these as MLflow artifacts)."""

    markdown: Path
    html: Path
    pngs: list[Path]


PLOT_DIR = "plots"
_CURVES = (
    # (file stem, history key, title, y label, sparse)
    ("reward", REWARD, "Reward per step", "mean reward of the batch", False),
    ("eval_accuracy", "eval/accuracy", "Eval accuracy", "greedy exact-match accuracy", True),
    ("approx_kl", APPROX_KL, "Approximate KL per update", "approx KL (k3)", False),
    ("grad_norm", "stability/grad_norm", "Gradient norm (before clipping)", "grad norm", False),
    ("entropy", "policy/entropy", "Policy entropy", "entropy (nats/token)", False),
    ("behave_ess", "policy/behave_ess", "Behaviour-weight ESS", "ESS / tokens", False),
)


def _plots(
    data: StudyData, rows: Sequence[CellRow], plot_dir: Path, n_boot: int, seed: int
) -> tuple[list[PlotFile], list[str]]:
    """Draw every figure; returns the written ones and the metrics that nobody logged."""
    written: list[PlotFile] = []
    absent: list[str] = []

    def keep(p: PlotFile | None, what: str) -> None:
        if p is None:
            absent.append(what)
        else:
            written.append(p)

    for stem, key, title, ylabel, sparse in _CURVES[:2]:
        keep(
            plot_metric_curves(
                data, key, plot_dir / f"{stem}.png", title=title, ylabel=ylabel, markers=sparse
            ),
            key,
        )
    keep(plot_clip_fractions(data, plot_dir / "clip_fractions.png"), "policy/clipfrac_*")
    for stem, key, title, ylabel, sparse in _CURVES[2:]:
        keep(
            plot_metric_curves(
                data, key, plot_dir / f"{stem}.png", title=title, ylabel=ylabel, markers=sparse
            ),
            key,
        )
    scored = [
        plot_intervals(rows, data, plot_dir / "intervals.png"),
        plot_performance_profile(
            rows, data, plot_dir / "performance_profile.png", n_boot=n_boot, seed=seed
        ),
    ]
    written += [p for p in scored if p is not None]
    return written, absent


def _header(doc: _Doc, data: StudyData, rows: Sequence[CellRow]) -> None:
    runs = data.runs
    count = {s: sum(r.status == s for r in runs) for s in ("completed", "diverged", "failed")}
    unfinished = sum(r.status in ("running", "waiting") for r in runs)
    tasks = _tasks_of(runs)
    doc.heading(1, f"Ablation report: {data.study}")
    if data.description:
        doc.para(data.description.strip())
    facts = [
        ("study", data.study),
        ("experiment", data.experiment),
        ("metric", f"{data.metric} ({data.direction})"),
        ("baseline", data.baseline or "none"),
        ("cells", str(len(data.cells))),
        ("seeds", ", ".join(str(s) for s in data.seeds)),
        ("steps per run", str(data.steps)),
        (
            "runs",
            f"{len(runs)}: {count['completed']} completed, {count['diverged']} diverged, "
            f"{count['failed']} failed, {unfinished} unfinished",
        ),
        ("wall time (sum over runs)", _fmt_duration(data.wall_time)),
    ]
    if tasks != [""]:
        facts.insert(-1, ("tasks", ", ".join(t or "(unnamed)" for t in tasks)))
    doc.table(["", "value"], [list(f) for f in facts])
    doc.heading(2, "What was varied")
    doc.table(
        ["axis", "values"],
        [[k, ", ".join(_value_str(v) for v in vs)] for k, vs in data.axes.items()],
        code_col=0,
    )
    by_label = {r.label: r for r in rows}
    doc.table(
        ["cell", "overrides", "runs"],
        [
            [
                label,
                ", ".join(f"{k}={_value_str(v)}" for k, v in flatten(ov).items()) or "(base)",
                f"{by_label[label].n_seeds}" if label in by_label else "0",
            ]
            for label, ov in data.cells.items()
        ],
        code_col=0,
    )
    if data.command:
        doc.para("Produced by:")
        doc.code(data.command)


def _ranking_section(
    doc: _Doc,
    data: StudyData,
    rows: Sequence[CellRow],
    n_boot: int,
    seed: int,
    diverged: DivergedPolicy,
) -> None:
    doc.heading(2, "Ranking")
    strat = len(_tasks_of(data.runs)) > 1
    worst = _worst_by_task(data)
    if diverged == "worst":
        wtxt = ", ".join(f"{fmt(v)}" + (f" on {t}" if t else "") for t, v in sorted(worst.items()))
        div_txt = (
            "Diverged runs are **scored as the worst value of the metric observed in the study** "
            f"on their task ({wtxt or '—'}), so divergence counts against a cell"
        )
    else:
        div_txt = "Diverged runs are **left out of the statistics** (and counted)"
    doc.para(
        f"Cells ranked by the IQM (25 % trimmed mean) of each run's {_code(data.metric)} "
        f"({'higher' if data.direction == 'maximize' else 'lower'} is better). Intervals are 95 % "
        f"percentile-bootstrap CIs ({n_boot} resamples, seed {seed}"
        + ("; stratified: runs resampled within each task" if strat else "")
        + f"). {div_txt}; failed and unfinished runs have no score and are left out. "
        "P(improve) is the probability that a run of the cell beats a run of the baseline "
        "(ties count half). Collapse = share of runs flagged `stability/collapsed`; final KL = "
        "mean over runs of the last logged `policy/approx_kl`; clip fractions = mean over runs of "
        "the last 10 % of logged steps."
    )
    doc.table(
        list(RANKING_HEADER), [_ranking_cells(i, r) for i, r in enumerate(rows, 1)], code_col=1
    )


SUMMARY_COLUMNS = (
    ("start/reward", "start reward"),
    ("final/reward", "final reward"),
    ("best/reward", "best reward"),
    ("final/eval_accuracy", "eval acc"),
    ("start/eval_reward", "start eval reward"),
    ("final/eval_reward", "final eval reward"),
    ("stability/entropy_ratio", "entropy end/start"),
    ("stability/mean_approx_kl", "mean KL"),
    ("stability/max_approx_kl", "max KL"),
    ("stability/kl_spikes", "KL spikes"),
    ("stability/grad_norm_spikes", "grad-norm spikes"),
    ("stability/mean_clipfrac", "clip frac (mean)"),
    ("stability/max_drawdown", "max drawdown"),
)


def summary_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """Per cell: the mean over its completed and diverged runs of each run-level summary."""
    header = ["cell", "runs"] + [label for _, label in SUMMARY_COLUMNS]
    rows = []
    for cell in data.cells:
        runs = [r for r in data.runs_of(cell) if r.status in ("completed", "diverged")]
        values = [
            fmt(_mean_finite(r.summary.get(key, math.nan) for r in runs))
            for key, _ in SUMMARY_COLUMNS
        ]
        rows.append([cell, str(len(runs)), *values])
    return header, rows


def _summary_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "Stability summaries per cell")
    doc.para(
        "Mean over each cell's completed and diverged runs of the run-level summaries defined in "
        "docs/stability.md (start reward = mean of the first 10 steps; entropy end/start < 1 "
        "means the policy sharpened; spikes are steps per run above 5× the run's own running "
        "median, so a KL that is high throughout is not a spike; clip frac = mean "
        "policy/clipfrac)."
    )
    header, rows = summary_table(data)
    doc.table(header, rows, code_col=0)


def _fit_section(doc: _Doc, fits: Sequence[CurveFitRow]) -> None:
    doc.heading(2, "Saturating curve fits")
    doc.para(
        "A sigmoid r(t) = r0 + (A − r0) / (1 + (t_half / t)^B) fitted to each cell's mean reward "
        "curve over its completed runs (ScaleRL, arXiv 2510.13786, with steps for compute). "
        "A is the fitted ceiling; the half-step is where half of the gain A − r0 is reached "
        "(efficiency). An extrapolated fit (half-step beyond the last step) is a guess."
    )
    rows = []
    for f in fits:
        c = f.fit
        note = c.reason if not c.ok else ("extrapolated" if c.extrapolated else "")
        rows.append(
            [
                f.label,
                fmt(c.asymptote),
                fmt(c.half_step),
                fmt(c.r0),
                fmt(c.rmse),
                str(f.n_runs),
                note,
            ]
        )
    doc.table(["cell", "asymptote A", "half-step", "r0", "rmse", "runs", "note"], rows, code_col=0)


def _fixed_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "What was held fixed")
    varied = _varied_keys(data)
    base = flatten(data.base_config)
    if "steps" in base:  # every run used the study's steps, not the base config's
        base["steps"] = data.steps
    flat = [(k, _value_str(v)) for k, v in base.items() if k not in varied]
    doc.para(
        "The base configuration every cell starts from, flattened; keys a cell overrides "
        f"({', '.join(_code(k) for k in sorted(varied)) or 'none'}) are listed under "
        "*What was varied* instead; `seed` is each run's seed (see *seeds* above)."
    )
    half = (len(flat) + 1) // 2
    left, right = flat[:half], flat[half:]
    table_rows = []
    for i in range(half):
        rk, rv = right[i] if i < len(right) else ("", "")
        table_rows.append([f"`{left[i][0]}`", left[i][1], f"`{rk}`" if rk else "", rv])
    doc.table(["key", "value", "key", "value"], table_rows)


def build_report(
    data: StudyData,
    out_dir: Path,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    diverged: DivergedPolicy = "worst",
    fit: bool = True,
) -> ReportFiles:
    """Write ``out_dir/report.md``, ``out_dir/report.html`` and ``out_dir/plots/*.png``.

    The HTML is self-contained (inline CSS, PNGs as base64 data URIs, no scripts, no external
    resources) so it can be mailed or attached to an MLflow run and still open.  The markdown
    links the PNGs relatively.  Sections: header (study, varied axes and cells, command),
    conclusion, warnings, ranking, plots, saturating fits (``fit=True``), held-fixed config.
    """
    import time

    from harness.core.fsutil import atomic_write

    out_dir = Path(out_dir)
    plot_dir = out_dir / PLOT_DIR
    plot_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = ranking(data, n_boot=n_boot, seed=seed, diverged=diverged)
    plots, absent = _plots(data, rows, plot_dir, n_boot, seed)
    doc = _Doc()
    _header(doc, data, rows)
    doc.heading(2, "Conclusion")
    doc.bullets(conclusion(rows, data), css="conclusion")
    doc.heading(2, "Warnings")
    warns = warnings_for(rows, data)
    if warns:
        doc.bullets(warns, css="warnings")
    else:
        doc.para(
            "None: no inert clipping, no diverged or failed runs, no collapses, and every "
            "cell's CI separates from the baseline's."
        )
    _ranking_section(doc, data, rows, n_boot, seed, diverged)
    _summary_section(doc, data)
    doc.heading(2, "Plots")
    if absent:
        doc.para("Not logged by any run (no plot): " + ", ".join(_code(a) for a in absent) + ".")
    if not any(math.isfinite(r.iqm.point) for r in rows):
        doc.para("No run has a score yet, so there is no interval plot or performance profile.")
    for p in plots:
        doc.figure(p, f"{PLOT_DIR}/{p.path.name}")
    if fit:
        _fit_section(doc, fit_curves(data))
    _fixed_section(doc, data)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    # Each file is replaced whole, so two coordinators reporting on one study at once (or a
    # full disk) leave a complete report, never a missing or half-written file.
    atomic_write(md_path, "\n".join(doc.md).rstrip() + "\n")
    atomic_write(html_path, doc.render_html(f"Ablation report: {data.study}"))
    _remove_stale_plots(plot_dir, {p.path.name for p in plots}, started)
    return ReportFiles(markdown=md_path, html=html_path, pngs=[p.path for p in plots])


def _remove_stale_plots(plot_dir: Path, keep: set[str], started: float) -> None:
    """Remove plots of an earlier report that this one no longer draws (a metric no longer
    logged).  Plots written since this report started belong to a concurrent writer: kept."""
    for png in plot_dir.glob("*.png"):
        if png.name in keep:
            continue
        try:
            if png.stat().st_mtime < started:
                png.unlink()
        except FileNotFoundError:
            pass  # another writer removed it first
