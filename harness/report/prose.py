"""The report's sentences, built from the numbers: warnings (too few seeds, diverged or collapsed
runs, cells the seeds cannot separate) and the conclusion (its verdicts on each cell are in
:mod:`~harness.report.verdicts`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.core.failures import count_reasons, short_reason
from harness.report import progress as report_progress
from harness.report import stats
from harness.report.adaptive import decided_cells, interim_reason
from harness.report.format import _clip_triple, _code, fmt, fmt_interval, fmt_pct
from harness.report.scores import paired_ranking
from harness.report.stats import MIN_SEEDS_FOR_VERDICT
from harness.report.studydata import CellRow, StudyData
from harness.report.verdicts import (
    _separates,
    _too_small,
    adaptive_verdicts,
    p_improve_verdicts,
)


def warnings_for(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """The warnings the harness knows, as markdown bullet texts (empty list: nothing to warn)."""
    out = _inert_warning(rows) + _diverged_warnings(rows, data) + _unscored_warnings(rows, data)
    out += _collapse_warnings(rows)
    base = next((r for r in rows if r.is_baseline), None)
    if base is not None:
        out += _seed_warnings(rows, data, base)
    elif data.baseline is None:
        out.append("No baseline cell is named, so P(improve) is not computed.")
    return out


def _inert_warning(rows: Sequence[CellRow]) -> list[str]:
    """The cells whose clipping cannot act (ratio ≡ 1), with their measured clip fractions."""
    inert = [r for r in rows if r.inert_clip]
    if not inert:
        return []
    measured = "; ".join(f"{_code(r.label)}: {_clip_triple(r)}" for r in inert)
    return [
        f"**Inert clipping (ratio ≡ 1)** in {', '.join(_code(r.label) for r in inert)}: the "
        "policy ratio π_θ/π_prox is identically 1 in these cells, so `eps_clip`, "
        "`eps_clip_higher` and `c_clip` cannot change the loss there; differences between "
        "such cells are seed noise. Measured clip fractions low / high / dual (last 10 % of "
        f"steps): {measured}."
    ]


def _diverged_warnings(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """Per cell with diverged runs: how many, how the statistics scored them, and why."""
    out = []
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
    return out


def _unscored_warnings(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """Per cell: the runs without a score (failed or unfinished, with their reasons) and the
    completed runs that logged no finite value of the metric."""
    out = []
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
    return out


def _collapse_warnings(rows: Sequence[CellRow]) -> list[str]:
    """Per cell with collapsed runs: how many, and the collapse rate."""
    return [
        f"**Collapse** in {_code(r.label)}: {r.n_collapsed} of {r.n_seeds} runs lost more "
        "than the collapse fraction of their peak reward (`stability/collapsed`), "
        f"collapse rate {fmt_pct(r.collapse_rate)}."
        for r in rows
        if r.n_collapsed
    ]


def _seed_warnings(rows: Sequence[CellRow], data: StudyData, base: CellRow) -> list[str]:
    """The cells with too few scored runs for any verdict, and the cells whose IQM CI overlaps
    the baseline's with the seeds each would need to separate; cells the seed rule decided are
    left out of both (no seeds are missing for its verdict)."""
    out = []
    close = stats.inseparable_cells({r.label: r.iqm for r in rows}, base.label)
    decided = decided_cells(data)
    small = [r for r in rows if _too_small(r) and r.label not in decided and r.n_seeds > 0]
    if small:
        out.append(
            "**Too few seeds for any verdict** in "
            + "; ".join(
                f"{_code(r.label)} ({r.n_used} scored run{'s' if r.n_used != 1 else ''})"
                for r in small
            )
            + f": at least {MIN_SEEDS_FOR_VERDICT} per cell are needed before an interval "
            "says anything about seed noise."
        )
    small_base = _too_small(base)
    parts = [
        f"{_code(r.label)} (IQM {fmt_interval(r.iqm)} vs baseline "
        f"{fmt_interval(base.iqm)}; {_seeds_hint(r, base)})"
        for r in rows
        if r.label in close and r.label not in decided and not _too_small(r) and not small_base
    ]
    if parts:
        out.append(
            "**Too few seeds for the CI to separate these cells** from the baseline: "
            + "; ".join(parts)
            + ". The seed estimate is a heuristic (half-widths shrinking as 1/√n), "
            "not a power analysis."
        )
    return out


def _seeds_hint(r: CellRow, base: CellRow) -> str:
    """How many seeds per cell would separate ``r``'s IQM CI from the baseline's."""
    n = min(r.n_used, base.n_used)
    need = stats.seeds_to_separate(r.iqm, base.iqm, max(n, 1))
    if math.isnan(need):
        return "no interval to compare"
    if math.isinf(need):
        return "same IQM as the baseline: more seeds would not separate them"
    if need > 20 * n:
        return (
            f"≈ {need:.0f} seeds per cell would be needed (now {n}): the difference is "
            "too small to resolve in practice"
        )
    return f"≈ {need:.0f} seeds per cell would be needed (now {n})"


def conclusion(rows: Sequence[CellRow], data: StudyData) -> list[str]:
    """A short plain-language conclusion, one markdown paragraph or bullet per sentence.

    It makes only the decisions the study's rule has made: none while the study is interim
    (runs running or waiting, or cells the adaptive seed rule has not settled) except the seed
    rule's own; none from cells with fewer than :data:`MIN_SEEDS_FOR_VERDICT` scored runs; and
    in an adaptive study the verdict on each cell is the seed rule's, on the seeds it paired."""
    better = "higher" if data.direction == "maximize" else "lower"
    ended = [r.status for r in data.runs if r.status in ("completed", "failed", "diverged")]
    if ended and "completed" not in ended:
        return no_run_completed(data)
    usable = [r for r in rows if math.isfinite(r.iqm.point)]
    if not usable:
        return ["No cell has a usable score yet: nothing can be concluded."]
    best = usable[0]
    base = next((r for r in rows if r.is_baseline), None)
    interim = interim_reason(data)
    # Where the runs ended against where they started: a ranking alone would hide a grid in
    # which every cell ends below its warm start.
    progress = report_progress.conclusion_lines(
        data, [r.label for r in rows], base.label if base else None, code=_code
    )
    out: list[str] = []
    if interim:
        out.append(
            f"**Interim report**: the study has not finished ({interim}). The standings below "
            "are provisional; the only verdicts are those the seed rule has already taken."
        )
    if base is not None and paired_ranking(data):
        verdicts = adaptive_verdicts(rows, data, base, better, bool(interim))
        return out + verdicts + _inert_lines(rows) + progress
    out += _lead_lines(usable, data, better, bool(interim))
    if interim:
        return out + progress
    if base is None:
        return out + _runner_up_lines(usable) + progress
    out += _against_baseline(best, base, better)
    return out + p_improve_verdicts(rows, data, best, base) + _inert_lines(rows) + progress


def _lead_lines(
    usable: Sequence[CellRow], data: StudyData, better: str, interim: bool
) -> list[str]:
    """Which cell ranks first (or leads so far) by the IQM, bold only when every usable cell
    has enough scored runs for a verdict, and which cells have too few."""
    best = usable[0]
    small = [r for r in usable if _too_small(r)]
    lead = f"{_code(best.label)} ranks first"
    if interim:
        lead = f"{_code(best.label)} leads so far"
    elif not small:
        lead = f"**{lead}**"
    # Below the minimum the bootstrap interval is the runs' own values: the point alone.
    value = fmt(best.iqm.point) if _too_small(best) else fmt_interval(best.iqm)
    out = [
        f"{lead} by the IQM of {_code(data.metric)} ({better} is better): "
        f"{value} over {best.n_used} scored run{'s' if best.n_used != 1 else ''} "
        f"({best.n_diverged}/{best.n_seeds} diverged)."
    ]
    if small:
        names = ", ".join(f"{_code(r.label)} ({r.n_used})" for r in small)
        out.append(
            f"**Sample too small for a verdict** in {names}: fewer than "
            f"{MIN_SEEDS_FOR_VERDICT} scored runs, so their bootstrap intervals have (almost) "
            "no width and say nothing about seed noise. Run more seeds before comparing them."
        )
    return out


def _runner_up_lines(usable: Sequence[CellRow]) -> list[str]:
    """Without a baseline: whether the leader's IQM CI separates from the runner-up's."""
    if len(usable) < 2:
        return []
    best, second = usable[0], usable[1]
    if _too_small(best) or _too_small(second):
        return []
    sep = _separates(best.iqm, second.iqm)
    return [
        f"Its 95 % CI {'is separated from' if sep else 'overlaps'} that of the runner-up "
        f"{_code(second.label)} ({fmt_interval(second.iqm)})"
        + ("." if sep else ": these seeds cannot tell the two apart.")
    ]


def _against_baseline(best: CellRow, base: CellRow, better: str) -> list[str]:
    """Whether the leader is the baseline, or whether its IQM CI overlaps the baseline's."""
    if best.label == base.label:
        return [f"The baseline ranks first: no cell has a {better} IQM."]
    if not math.isfinite(base.iqm.point) or _too_small(best) or _too_small(base):
        return []
    sep = _separates(best.iqm, base.iqm)
    return [
        f"Its CI {'does not overlap' if sep else 'overlaps'} the baseline's "
        f"({_code(base.label)}: {fmt_interval(base.iqm)})"
        + (
            ": the seeds separate it from the baseline."
            if sep
            else ": with these seeds it is not separated from the baseline."
        )
    ]


def _inert_lines(rows: Sequence[CellRow]) -> list[str]:
    inert = [r.label for r in rows if r.inert_clip]
    if not inert:
        return []
    return [
        f"Clipping is inert in {', '.join(_code(c) for c in inert)}: these results say "
        "nothing about the clip settings."
    ]


def no_run_completed(data: StudyData) -> list[str]:
    """The conclusion of a study in which no run completed: what happened to each run, and why
    (each distinct reason once, with how many runs it hit)."""
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
