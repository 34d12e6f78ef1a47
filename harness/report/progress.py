"""Did training improve on where it started?  Start-vs-final comparisons for the report.

Why: an ablation can rank cells correctly while every one of them ends worse than the policy it
started from; the ranking alone would hide that.  So the report's conclusion says, per cell, where
the runs started, where they ended, and whether the seeds support "better than the start".

The comparison is paired per run: for run i of a cell, d_i = final_i − start_i, and the cell's
change is mean(d) with a 95 % percentile-bootstrap CI over its runs
(:func:`harness.report.stats.mean_ci`).  "Above the start" means the CI of the change lies above 0
(equivalently, the mean final's CI lies above the mean start, paired by seed).  With fewer than
:data:`~harness.report.stats.MIN_SEEDS_FOR_VERDICT` runs the bootstrap interval spans only the
runs' own values, so there is no verdict ("too few runs to tell") and no interval is printed.  Two pairs of
run-level summaries are compared (docs/stability.md):

* batch reward: ``start/reward`` (mean of the first 10 logged batch rewards) → ``final/reward``
  (mean of the last 10).  The start window already contains up to 9 updates, so a fast learner's
  start is inflated and the test is conservative; a run of fewer than 20 steps has overlapping
  windows (identical ones at 10 steps or fewer) and its bullet says so (:func:`window_caveat`);
* eval reward: ``start/eval_reward`` (greedy, held-out prompts, before the first update) →
  ``final/eval_reward`` (the same prompts at the last step).

Only completed runs count: a diverged run has no final policy to compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.metrics.stability import FINAL_WINDOW, START_WINDOW
from harness.report import stats
from harness.report.stats import MIN_SEEDS_FOR_VERDICT, Interval
from harness.report.studydata import StudyData

# (label in the text, start key, final key)
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("batch reward", "start/reward", "final/reward"),
    ("eval reward", "start/eval_reward", "final/eval_reward"),
)


@dataclass(frozen=True)
class StartVsFinal:
    """One cell, one pair of summaries: mean start, mean final [CI], paired change [CI]."""

    cell: str
    what: str  # "batch reward" | "eval reward"
    n_runs: int  # completed runs with a finite start and final
    start: float
    final: Interval
    change: Interval

    @property
    def verdict(self) -> str:
        """'above' (change CI above 0), 'below' (CI below 0), 'overlaps' (CI contains 0), or
        'too few' (fewer than MIN_SEEDS_FOR_VERDICT runs: the interval is only their values)."""
        if self.n_runs < MIN_SEEDS_FOR_VERDICT:
            return "too few"
        if self.change.low > 0:
            return "above"
        if self.change.high < 0:
            return "below"
        return "overlaps"


def start_vs_final(
    data: StudyData, cell: str, *, n_boot: int = 2000, seed: int = 0
) -> list[StartVsFinal]:
    """The comparisons for ``cell`` whose summaries its completed runs logged (0, 1 or 2)."""
    runs = [r for r in data.runs_of(cell) if r.status == "completed"]
    out = []
    for what, start_key, final_key in PAIRS:
        pairs = [
            (float(r.summary.get(start_key, math.nan)), float(r.summary.get(final_key, math.nan)))
            for r in runs
        ]
        pairs = [(s, f) for s, f in pairs if math.isfinite(s) and math.isfinite(f)]
        if not pairs:
            continue
        s = np.array([p[0] for p in pairs])
        f = np.array([p[1] for p in pairs])
        out.append(
            StartVsFinal(
                cell=cell,
                what=what,
                n_runs=len(pairs),
                start=float(s.mean()),
                final=stats.mean_ci(f, n_boot=n_boot, seed=seed),
                change=stats.mean_ci(f - s, n_boot=n_boot, seed=seed),
            )
        )
    return out


def _num(x: float) -> str:
    return f"{x:.3g}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "−") + _num(abs(x))


_VERDICT_TEXT = {
    "above": "**above the start**",
    "below": "**below the start**",
    "overlaps": "not separated from the start",
    "too few": "too few runs to tell",
}


def _runs(n: int) -> str:
    return f"{n} completed run{'s' if n != 1 else ''}"


def window_caveat(steps: int) -> str:
    """Why the batch-reward change of a short run says little: its start window (the first
    ``START_WINDOW`` logged rewards) and final window (the last ``FINAL_WINDOW``) overlap when
    the run has fewer steps than the two together.  Empty when they do not overlap."""
    if steps >= START_WINDOW + FINAL_WINDOW:
        return ""
    if steps <= min(START_WINDOW, FINAL_WINDOW):
        return (
            f"with {steps} steps the start and final windows are the same {steps} steps, so "
            "this change is 0 by construction and says nothing about learning; compare the "
            "eval reward, or run at least "
            f"{START_WINDOW + FINAL_WINDOW} steps"
        )
    shared = START_WINDOW + FINAL_WINDOW - steps
    return (
        f"with {steps} steps the start window (first {START_WINDOW}) and final window (last "
        f"{FINAL_WINDOW}) share {shared} steps, so this change understates any learning; run at "
        f"least {START_WINDOW + FINAL_WINDOW} steps for windows that do not overlap"
    )


def describe(cell_text: str, comparisons: Sequence[StartVsFinal], steps: int | None = None) -> str:
    """One conclusion bullet: every comparison of one cell, with its CI and verdict (and, for
    the batch reward of a run too short for separate windows, the caveat)."""
    parts = []
    for c in comparisons:
        caveat = window_caveat(steps) if steps is not None and c.what == "batch reward" else ""
        if c.verdict == "too few":
            # The means only: an interval over 1 or 2 runs is their own values, not seed noise.
            parts.append(
                f"{c.what} {_num(c.start)} → {_num(c.final.point)}, change "
                f"{_signed(c.change.point)}: {_VERDICT_TEXT[c.verdict]}"
                + (f" (*caveat*: {caveat})" if caveat else "")
            )
            continue
        parts.append(
            f"{c.what} {_num(c.start)} → {_num(c.final.point)} "
            f"[{_num(c.final.low)}, {_num(c.final.high)}], change {_signed(c.change.point)} "
            f"[{_signed(c.change.low)}, {_signed(c.change.high)}]: {_VERDICT_TEXT[c.verdict]}"
            + (f" (*caveat*: {caveat})" if caveat else "")
        )
    n = max(c.n_runs for c in comparisons)
    few = (
        f"; a verdict needs at least {MIN_SEEDS_FOR_VERDICT}"
        if any(c.verdict == "too few" for c in comparisons)
        else ""
    )
    return f"Start vs final for {cell_text} (mean over {_runs(n)}{few}): " + "; ".join(parts) + "."


def conclusion_lines(
    data: StudyData,
    ranked_cells: Sequence[str],
    baseline: str | None,
    *,
    code: Callable[[str], str] = str,
    max_cells: int = 6,
    n_boot: int = 2000,
    seed: int = 0,
) -> list[str]:
    """Bullets for the report's conclusion, cells in ranking order.

    Every cell when there are at most ``max_cells``; otherwise the winner and the baseline, plus
    one line counting the cells whose batch reward ends above their start.
    """
    if not ranked_cells:
        return []
    if len(ranked_cells) <= max_cells:
        shown = list(ranked_cells)
    else:
        shown = [ranked_cells[0]] + [
            c for c in (baseline,) if c is not None and c != ranked_cells[0]
        ]
    out = []
    for cell in shown:
        comps = start_vs_final(data, cell, n_boot=n_boot, seed=seed)
        if comps:
            out.append(describe(code(cell), comps, steps=data.steps))
    if len(ranked_cells) > max_cells:
        verdicts = [
            c.verdict
            for cell in ranked_cells
            for c in start_vs_final(data, cell, n_boot=n_boot, seed=seed)
            if c.what == "batch reward"
        ]
        judged = [v for v in verdicts if v != "too few"]
        few = len(verdicts) - len(judged)
        tail = f"; {few} cell{'s have' if few != 1 else ' has'} too few runs to tell" if few else ""
        if judged:
            out.append(
                f"Batch reward ends above the start (change CI above 0) in "
                f"{judged.count('above')} of {len(judged)} cells, below it in "
                f"{judged.count('below')}{tail}."
            )
        elif verdicts:
            out.append(
                f"No cell has {MIN_SEEDS_FOR_VERDICT} completed runs: too few runs to tell "
                "whether the batch reward ends above the start."
            )
    return out
