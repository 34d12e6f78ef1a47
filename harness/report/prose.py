"""The report's sentences, built from the numbers: warnings (too few seeds, diverged or collapsed
runs, cells the seeds cannot separate) and the conclusion."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.report import progress as report_progress
from harness.report import stats
from harness.report.format import _clip_triple, _code, fmt_interval, fmt_pct, fmt_pct_interval
from harness.report.stats import Interval
from harness.report.studydata import CellRow, StudyData


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
