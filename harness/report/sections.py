"""The report's sections after the header and the conclusion: the ranking, the stability
summaries, the measured statistics (pass@k, correction, mismatch split), factor effects, curve
fits and the configuration held fixed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.core.configtools import level_str
from harness.report.configview import held_fixed, study_has_mismatch, varied_keys
from harness.report.factors import study_effects
from harness.report.format import _code, fmt, value_str
from harness.report.render import RANKING_HEADER, _Doc, _ranking_cells
from harness.report.scores import (
    MIN_COLLAPSE_PEAK,
    MIN_COLLAPSE_STEPS,
    CurveFitRow,
    DivergedPolicy,
    _tasks_of,
    _worst_by_task,
    paired_ranking,
)
from harness.report.studydata import CellRow, StudyData
from harness.report.tables import (
    ASYNC_SUMMARY_COLUMNS,
    CORRECTION_COLUMNS,
    EVAL_SAMPLED_COLUMNS,
    MISMATCH_SPLIT_COLUMNS,
    logged_columns,
    measured_table,
    summary_table,
    with_k,
)


def ranking_section(
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
        "(ties count half). Collapse = share of runs flagged `stability/collapsed` among runs "
        f"long enough to tell (at least {MIN_COLLAPSE_STEPS} logged rewards, smoothed peak at "
        f"least {fmt(MIN_COLLAPSE_PEAK)}; — when none is); final KL = "
        "mean over runs of the last logged `policy/approx_kl`; clip fractions = mean over runs of "
        "the last 10 % of logged steps."
    )
    header = list(RANKING_HEADER)
    cells = [_ranking_cells(i, r) for i, r in enumerate(rows, 1)]
    if paired_ranking(data):
        doc.para(
            "The cells of this adaptive study ran different numbers of seeds (a decided cell "
            "stops early), so IQMs over their own seeds are not comparable: the cells are "
            "**ranked by the mean paired difference from the baseline on the seeds both ran** "
            "(the pairs the seed rule decided on; > 0 is better), and P(improve) counts those "
            "pairs only. The IQM column stays each cell's own."
        )
        header.insert(2, "paired Δ vs baseline (seeds)")
        for row, r in zip(cells, rows, strict=True):
            row.insert(
                2,
                "0 (baseline)"
                if r.is_baseline
                else f"{r.paired_diff:+.3g} ({r.n_paired})"
                if r.n_paired
                else "—",
            )
    doc.table(header, cells, code_col=1)


def measured_sections(doc: _Doc, data: StudyData) -> None:
    """pass@k, the correction's own statistics and the mismatch's numerics/lag parts, each
    where the study measured them."""
    sampled = measured_table(data, EVAL_SAMPLED_COLUMNS, history=False)
    if sampled:
        header, table, k_said = with_k(data, *sampled)
        doc.heading(2, "Sampled evaluation: pass@1 and pass@k")
        doc.para(
            "With `eval.samples` > 0 every eval also samples completions of each held-out prompt "
            f"at the rollout temperature: pass@1 and pass@k ({k_said}) are the unbiased "
            "estimates 1 − C(n−c, k)/C(n, k) averaged over prompts (c of n samples pass "
            "`eval.threshold`). *start* is before the first update, *final* the last eval; "
            "means over each cell's runs."
        )
        doc.table(header, table, code_col=0)
    corr = measured_table(data, CORRECTION_COLUMNS, history=True)
    if corr:
        doc.heading(2, "The correction's own statistics")
        doc.para(
            "Means over each run's logged steps, then over the cell's runs: the fraction of "
            "valid tokens the correction took out of the loss (masked) or whose weight it "
            "clipped (truncated), and the spread of the behaviour weights it applied (smallest, "
            "largest, effective sample size as a fraction of tokens); docs/corrections.md."
        )
        doc.table(*corr, code_col=0)
    split = (
        measured_table(data, MISMATCH_SPLIT_COLUMNS, history=True)
        if study_has_mismatch(data)
        else None
    )
    if split:
        doc.heading(2, "Mismatch: numerics and policy lag")
        doc.para(
            "The sampler-vs-learner KL split into its numerics part (the sampler against the "
            "learner's forward of the same weights) and its policy-lag part (those weights "
            "against the current ones, 0 without `rollout.staleness` or `rollout.async`); means over "
            "logged steps "
            "and runs (docs/mismatch.md)."
        )
        doc.table(*split, code_col=0)


def summary_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "Stability summaries per cell")
    mismatch = (
        "; mismatch KL = the k3 estimate of KL(π_sampler ‖ π_learner) per step, "
        "docs/mismatch.md, shown because a cell has a mismatch source"
        if study_has_mismatch(data)
        else ""
    )
    lags = (
        "; token lag = how many updates behind the learner a generated token was sampled "
        "(rollout.async; mean over steps of the batch mean, and the largest), mixed-version "
        "frac = mean share of sequences sampled by two versions or more (in-flight updates, "
        "partial rollouts), docs/async.md; — for a cell that sampled synchronously or with "
        "`rollout.staleness`"
        if logged_columns(data, ASYNC_SUMMARY_COLUMNS)
        else ""
    )
    doc.para(
        "Mean over each cell's completed and diverged runs of the run-level summaries defined in "
        "docs/stability.md (start reward = mean of the first 10 steps' batch reward; **eval "
        "acc** = fraction of the held-out prompts whose greedy completion scores at least "
        "`eval.threshold` (exact answers on the built-in tasks), at the last eval; **eval "
        "reward** = the mean reward of those same greedy completions, before the first update "
        "(start) and at the last eval (final); entropy end/start < 1 "
        "means the policy sharpened; spikes are steps per run above 5× the run's own running "
        "median, so a KL that is high throughout is not a spike; clip frac = mean "
        f"policy/clipfrac{mismatch}{lags})."
    )
    header, rows = summary_table(data)
    doc.table(header, rows, code_col=0)


def factor_section(doc: _Doc, data: StudyData, rows: Sequence[CellRow]) -> None:
    """Main effects and two-way interactions of a factorial grid (nothing for one axis)."""
    effects, why = study_effects(data, rows)
    if not effects and len(data.axes) < 2:
        return
    doc.heading(2, "Factor effects")
    if not effects:
        doc.para(f"No factor effects: {why}.")
        return
    n = effects[0].n_seeds
    doc.para(
        f"Which setting matters, in units of {_code(data.metric)} "
        f"({'higher' if data.direction == 'maximize' else 'lower'} is better). The *main effect* "
        "of a level is the mean over every setting of the other axes of (cell at that level − "
        "cell at the reference level), the reference being the baseline's level; a *two-way "
        "interaction* a × b is how much more level a moves the metric when the other axis is at "
        "b instead of its reference (averaged over the remaining axes). Each is computed per "
        f"seed on the {n} seeds every cell scored and shown with a 95 % paired-t interval "
        "across those seeds (docs/report.md)."
    )
    # The effects hold each level as its JSON key; show it as the cell labels spell it.
    spelled = {(a, value_str(v)): level_str(v) for a, vs in data.axes.items() for v in vs}

    def name(axes: Sequence[str], levels: Sequence[Any]) -> str:
        return " × ".join(
            f"{a}={spelled.get((a, v), v)}" for a, v in zip(axes, levels, strict=True)
        )

    table = []
    for e in effects:
        what, ref = name(e.axes, e.levels), name(e.axes, e.reference)
        table.append(
            [
                what,
                e.kind,
                ref,
                f"{e.estimate:+.3g} [{e.low:+.3g}, {e.high:+.3g}]",
                "interval excludes 0" if e.separated else "",
            ]
        )
    doc.table(["effect", "kind", "against", "estimate [95 % CI]", "note"], table, code_col=0)


def fit_section(doc: _Doc, fits: Sequence[CurveFitRow]) -> None:
    doc.heading(2, "Saturating curve fits")
    doc.para(
        "A sigmoid r(t) = r0 + (A − r0) / (1 + (t_half / t)^B) fitted to each cell's mean reward "
        "curve over its completed runs (ScaleRL, arXiv 2510.13786, with steps for compute). "
        "A is the fitted ceiling; the half-step is where half of the gain A − r0 is reached "
        "(efficiency). The fit is bounded: A and r0 within the range of rewards the study "
        "logged, the half-step within the run's steps; a curve still rising at the end has no "
        "identified ceiling and shows none."
    )
    rows = []
    for f in fits:
        c = f.fit
        note = c.reason if not c.ok else ("extrapolated" if c.extrapolated else "")
        if c.ok and c.at_bound:
            note = "ceiling held at the edge of the rewards logged: the curve may go further"
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


def fixed_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "What was held fixed")
    varied = varied_keys(data)
    flat, notes = held_fixed(data)
    doc.para(
        "The base configuration every cell starts from, flattened; keys a cell overrides "
        f"({', '.join(_code(k) for k in sorted(varied)) or 'none'}) are listed under "
        "*What was varied* instead; `seed` is each run's seed (see *seeds* above)."
        + (" Left out as inactive in every cell: " + "; ".join(notes) + "." if notes else "")
    )
    half = (len(flat) + 1) // 2
    left, right = flat[:half], flat[half:]
    table_rows = []
    for i in range(half):
        rk, rv = right[i] if i < len(right) else ("", "")
        table_rows.append([f"`{left[i][0]}`", left[i][1], f"`{rk}`" if rk else "", rv])
    doc.table(["key", "value", "key", "value"], table_rows)
