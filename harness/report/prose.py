"""The report's sentences, built from the numbers: warnings (too few seeds, diverged or collapsed
runs, cells the seeds cannot separate) and the conclusion."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.core.failures import count_reasons, short_reason
from harness.report import progress as report_progress
from harness.report import stats
from harness.report.adaptive import adaptive_states, decided_cells, interim_reason
from harness.report.format import (
    _clip_triple,
    _code,
    fmt,
    fmt_interval,
    fmt_pct,
    fmt_pct_interval,
)
from harness.report.scores import paired_ranking
from harness.report.stats import MIN_SEEDS_FOR_VERDICT, Interval
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
        decided = decided_cells(data)  # the seed rule's verdict stands: no seeds are missing
        parts = []
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
        for r in (
            r
            for r in rows
            if r.label in close and r.label not in decided and not _too_small(r) and not small_base
        ):
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


def _too_small(r: CellRow) -> bool:
    return r.n_used < MIN_SEEDS_FOR_VERDICT


def _fmt_signed(x: float) -> str:
    return f"{x:+.3g}"


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
        verdicts = _adaptive_verdicts(rows, data, base, better, bool(interim))
        return out + verdicts + _inert_lines(rows) + progress
    small = [r for r in usable if _too_small(r)]
    lead = f"{_code(best.label)} ranks first"
    if interim:
        lead = f"{_code(best.label)} leads so far"
    elif not small:
        lead = f"**{lead}**"
    # Below the minimum the bootstrap interval is the runs' own values: the point alone.
    value = fmt(best.iqm.point) if _too_small(best) else fmt_interval(best.iqm)
    out.append(
        f"{lead} by the IQM of {_code(data.metric)} ({better} is better): "
        f"{value} over {best.n_used} scored run{'s' if best.n_used != 1 else ''} "
        f"({best.n_diverged}/{best.n_seeds} diverged)."
    )
    if small:
        names = ", ".join(f"{_code(r.label)} ({r.n_used})" for r in small)
        out.append(
            f"**Sample too small for a verdict** in {names}: fewer than "
            f"{MIN_SEEDS_FOR_VERDICT} scored runs, so their bootstrap intervals have (almost) "
            "no width and say nothing about seed noise. Run more seeds before comparing them."
        )
    if interim:
        return out + progress
    if base is None:
        if len(usable) > 1:
            second = usable[1]
            if _too_small(best) or _too_small(second):
                return out + progress
            sep = _separates(best.iqm, second.iqm)
            out.append(
                f"Its 95 % CI {'is separated from' if sep else 'overlaps'} that of the runner-up "
                f"{_code(second.label)} ({fmt_interval(second.iqm)})"
                + ("." if sep else ": these seeds cannot tell the two apart.")
            )
        return out + progress
    if best.label == base.label:
        out.append(f"The baseline ranks first: no cell has a {better} IQM.")
    elif math.isfinite(base.iqm.point) and not (_too_small(best) or _too_small(base)):
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
    judged = 0
    for r in rows:
        p = r.p_improve
        if r.is_baseline or p is None or math.isnan(p.point):
            continue
        if _too_small(r) or _too_small(base):
            continue  # said once above: no verdict from a sample this small
        judged += 1
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
    if judged and not separated:
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
        if best.label in separated:
            why = why_line(best, base, data)
            if why:
                out.append(why)
    return out + _inert_lines(rows) + progress


def _inert_lines(rows: Sequence[CellRow]) -> list[str]:
    inert = [r.label for r in rows if r.inert_clip]
    if not inert:
        return []
    return [
        f"Clipping is inert in {', '.join(_code(c) for c in inert)}: these results say "
        "nothing about the clip settings."
    ]


def _adaptive_verdicts(
    rows: Sequence[CellRow], data: StudyData, base: CellRow, better: str, interim: bool
) -> list[str]:
    """The conclusion of an adaptive study deciding against the baseline: the ranking and every
    comparison on the seeds each cell shares with the baseline, the verdicts the seed rule's."""
    states = adaptive_states(data) or {}
    usable = [r for r in rows if r.is_baseline or math.isfinite(r.paired_diff)]
    best = usable[0] if usable else base
    out: list[str] = []
    what = f"the mean paired difference in {_code(data.metric)} from the baseline"
    if best.is_baseline:
        out.append(
            f"The baseline {'leads so far' if interim else 'ranks first'}: no cell scores "
            f"{better} than it in {_code(data.metric)} on average over the seeds both ran "
            "(mean paired difference)."
        )
    else:
        out.append(
            f"{_code(best.label)} {'leads so far' if interim else 'ranks first'} by {what} on "
            f"the seeds both ran: {_fmt_signed(best.paired_diff)} over {best.n_paired} paired "
            "seeds."
        )
    decided: dict[str, list[str]] = {"better": [], "worse": [], "equivalent": []}
    for r in rows:
        st = states.get(r.label)
        if r.is_baseline or st is None:
            continue
        p = r.p_improve
        pairs = (
            f"; on those {r.n_paired} paired seeds it beat the baseline in "
            f"{fmt_pct_interval(p)} of seed pairs"
            if p is not None and math.isfinite(p.point) and r.n_paired
            else ""
        )
        if st.status in decided and st.decision is not None:
            decided[st.status].append(r.label)
            out.append(f"{_code(r.label)}: {st.decision.words()} (the seed rule's verdict){pairs}.")
        elif st.status == "undecided" and st.decision is not None:
            out.append(
                f"{_code(r.label)}: {st.decision.words()}: the seed rule reached its maximum "
                f"without a verdict{pairs}."
            )
        else:
            last = st.decision.words() if st.decision is not None else "no look yet"
            out.append(f"{_code(r.label)}: open ({last}): no verdict yet{pairs}.")
    moved = decided["better"] + decided["worse"]
    if best.label in decided["better"]:
        why = why_line(best, base, data)
        if why:
            out.append(why)
    if moved:
        out.append(
            "Decided different from the baseline by the seed rule: "
            + ", ".join(f"{_code(c)} ({v})" for v in ("better", "worse") for c in decided[v])
            + "."
        )
    elif not interim:
        eq = decided["equivalent"]
        out.append(
            "**No cell was decided better or worse than the baseline**"
            + (f"; equivalent within the margin: {', '.join(_code(c) for c in eq)}." if eq else ".")
        )
    return out


#: A stability statistic named in "why it wins" differs from the baseline's by at least this
#: factor (or is 0 where the baseline's is not).
WHY_MIN_RATIO = 2.0


def largest_ratios(
    winner: dict[str, float], base: dict[str, float], *, min_ratio: float = WHY_MIN_RATIO
) -> list[tuple[str, float, float, float]]:
    """The statistics on which ``winner`` and ``base`` differ most, as (name, winner's value,
    baseline's value, ratio), largest ratio first: ratio = max(|w|, |b|) / min(|w|, |b|), ∞ when
    exactly one is 0; pairs with a NaN or both 0 are skipped, and so is a ratio below
    ``min_ratio``."""
    out = []
    for name, w in winner.items():
        b = base.get(name, math.nan)
        if not (math.isfinite(w) and math.isfinite(b)) or (w == 0 and b == 0):
            continue
        lo, hi = sorted((abs(w), abs(b)))
        ratio = math.inf if lo == 0 else hi / lo
        if ratio >= min_ratio:
            out.append((name, w, b, ratio))
    return sorted(out, key=lambda t: -t[3])


def _stability_profile(r: CellRow, data: StudyData) -> dict[str, float]:
    runs = [x for x in data.runs_of(r.label) if x.status in ("completed", "diverged")]

    def mean(key: str) -> float:
        vals = [x.summary.get(key, math.nan) for x in runs]
        vals = [v for v in vals if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else math.nan

    return {
        "final KL": r.final_kl,
        "clip fraction (low + high)": r.clipfrac_low + r.clipfrac_high,
        "dual-clip fraction": r.dual_clipfrac,
        "entropy end/start": mean("stability/entropy_ratio"),
        "KL spikes per run": mean("stability/kl_spikes"),
        "grad-norm spikes per run": mean("stability/grad_norm_spikes"),
        "collapse rate": r.collapse_rate,
    }


def why_line(winner: CellRow, base: CellRow, data: StudyData, top: int = 3) -> str | None:
    """What the winner's own numbers show beside its score: the stability statistics that differ
    most from the baseline's (at least :data:`WHY_MIN_RATIO` ×), or None when none does."""
    diffs = largest_ratios(_stability_profile(winner, data), _stability_profile(base, data))
    if not diffs:
        return None
    parts = []
    for name, w, b, ratio in diffs[:top]:
        if w == 0 or b == 0:
            parts.append(f"{name} {fmt(w)} against {fmt(b)}")
        else:
            way = "higher" if abs(w) > abs(b) else "lower"
            parts.append(f"{name} {ratio:.1f}× {way} ({fmt(w)} against {fmt(b)})")
    return (
        f"How {_code(winner.label)} differs from the baseline beside its score (means over its "
        "runs; a description of these runs, not a cause): " + "; ".join(parts) + "."
    )


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
