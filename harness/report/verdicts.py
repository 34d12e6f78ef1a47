"""The conclusion's verdicts on each cell against the baseline: on P(improve) and the IQM
intervals for a fixed-seed study, the seed rule's for an adaptive one, and what the winner's own
numbers show beside its score (:func:`why_line`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.report import stats
from harness.report.adaptive import adaptive_states
from harness.report.format import _code, fmt, fmt_pct_interval
from harness.report.stats import MIN_SEEDS_FOR_VERDICT, Interval
from harness.report.studydata import CellRow, StudyData


def _separates(a: Interval, b: Interval) -> bool:
    return not stats.cis_overlap(a, b)


def _too_small(r: CellRow) -> bool:
    return r.n_used < MIN_SEEDS_FOR_VERDICT


def _fmt_signed(x: float) -> str:
    return f"{x:+.3g}"


def p_improve_verdicts(
    rows: Sequence[CellRow], data: StudyData, best: CellRow, base: CellRow
) -> list[str]:
    """Each cell's P(improve) over the baseline with what its interval says, then which cells
    separate from the baseline (IQM CIs apart or a P(improve) CI excluding 50 %), or that none
    does; cells with too few scored runs (or a baseline with too few) are not judged."""
    out: list[str] = []
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
        out.append(
            f"{_code(r.label)} beat the baseline in {fmt_pct_interval(p)} of seed pairs: {tail}."
        )
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
    return out


def adaptive_verdicts(
    rows: Sequence[CellRow], data: StudyData, base: CellRow, better: str, interim: bool
) -> list[str]:
    """The conclusion of an adaptive study deciding against the baseline: the ranking and every
    comparison on the seeds each cell shares with the baseline, the verdicts the seed rule's."""
    usable = [r for r in rows if r.is_baseline or math.isfinite(r.paired_diff)]
    best = usable[0] if usable else base
    out = [_adaptive_lead(best, data, better, interim)]
    decided: dict[str, list[str]] = {"better": [], "worse": [], "equivalent": []}
    out += _seed_rule_lines(rows, data, decided)
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


def _adaptive_lead(best: CellRow, data: StudyData, better: str, interim: bool) -> str:
    """The adaptive conclusion's first line: which cell leads by the mean paired difference."""
    if best.is_baseline:
        return (
            f"The baseline {'leads so far' if interim else 'ranks first'}: no cell scores "
            f"{better} than it in {_code(data.metric)} on average over the seeds both ran "
            "(mean paired difference)."
        )
    what = f"the mean paired difference in {_code(data.metric)} from the baseline"
    return (
        f"{_code(best.label)} {'leads so far' if interim else 'ranks first'} by {what} on "
        f"the seeds both ran: {_fmt_signed(best.paired_diff)} over {best.n_paired} paired "
        "seeds."
    )


def _seed_rule_lines(
    rows: Sequence[CellRow], data: StudyData, decided: dict[str, list[str]]
) -> list[str]:
    """One line per compared cell with the seed rule's state (decided, undecided at its
    maximum, or open) and its paired P(improve); the decided cells are added to ``decided``."""
    states = adaptive_states(data) or {}
    out: list[str] = []
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
