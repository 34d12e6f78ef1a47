"""The report's "Seeds that decide" section: per cell "decided at N seeds: better, higher by X
(difference +X [lo, hi])" or "undecided at max", and what the adaptive design saved against the
fixed design that gives every cell ``max`` seeds (the fixed design with the same confidence and the same worst-case
interval), in seeds and in wall time."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.report.allocation import AdaptivePlan, CellState, allocate, settled
from harness.report.format import _fmt_duration
from harness.report.render import _Doc
from harness.report.sequential import DECIDED
from harness.report.studydata import StudyData


def adaptive_states(data: StudyData) -> dict[str, CellState] | None:
    """The allocation of an adaptive study from its runs (None for fixed seeds)."""
    if data.adaptive is None:
        return None
    scores: dict[str, dict[int, float]] = {c: {} for c in data.cells}
    for r in data.runs:
        if r.cell not in scores:
            continue
        if r.status == "completed":
            scores[r.cell][r.seed] = float(r.summary.get(data.metric, math.nan))
        elif r.status == "diverged":
            scores[r.cell][r.seed] = math.nan
    return allocate(
        scores,
        list(data.cells),
        AdaptivePlan.from_dict(data.adaptive),
        baseline=data.baseline,
        maximize=data.direction == "maximize",
    )


@dataclass(frozen=True)
class Savings:
    seeds_used: int  # runs the adaptive design asked for (released seeds)
    seeds_fixed: int  # cells x max: the fixed design
    wall_used: float  # seconds, sum over the runs that ran
    wall_fixed: float  # seconds the fixed design would take: each cell's mean run time x max

    @property
    def seeds_saved(self) -> int:
        return self.seeds_fixed - self.seeds_used

    @property
    def wall_saved(self) -> float:
        return self.wall_fixed - self.wall_used


def savings(data: StudyData, states: dict[str, CellState]) -> Savings:
    """Seeds and wall time against every cell running ``max`` seeds.  A cell's missing runs are
    priced at the mean wall time of its own runs (the study's mean where it has none)."""
    assert data.adaptive is not None
    top = int(data.adaptive["max"])
    walls = [r.wall_time for r in data.runs if math.isfinite(r.wall_time)]
    overall = sum(walls) / len(walls) if walls else math.nan
    used = fixed = 0.0
    for cell in data.cells:
        mine = [r.wall_time for r in data.runs_of(cell) if math.isfinite(r.wall_time)]
        mean = sum(mine) / len(mine) if mine else overall
        used += sum(mine)
        fixed += mean * top
    return Savings(
        seeds_used=sum(s.released for s in states.values()),
        seeds_fixed=top * len(data.cells),
        wall_used=used,
        wall_fixed=fixed,
    )


def adaptive_lines(data: StudyData) -> list[str]:
    """One line per cell and one on the savings (also what the console prints)."""
    states = adaptive_states(data)
    if states is None:
        return []
    out = [f"{c}: {s.line()}" for c, s in states.items()]
    out.append(savings_line(data, states))
    return out


def decided_cells(data: StudyData) -> dict[str, CellState]:
    """The cells the seed rule has decided (better, worse, equivalent, or below the winner of a
    decided ranking): their verdict is the rule's, whatever their seed count."""
    states = adaptive_states(data) or {}
    return {c: s for c, s in states.items() if s.status in (*DECIDED, "ranked")}


def interim_reason(data: StudyData) -> str:
    """Why the study is not finished ("" when it is): runs still running or waiting (an adaptive
    study's held seeds wait too), or cells the seed rule has not settled."""
    parts = []
    pending = sum(r.status in ("running", "waiting") for r in data.runs)
    if pending:
        parts.append(f"{pending} run{'s' if pending != 1 else ''} still running or waiting")
    states = adaptive_states(data)
    if states:
        unsettled = [c for c, s in states.items() if not s.settled]
        if unsettled:
            parts.append(
                f"{len(unsettled)} of {len(states)} cells not yet settled by the seed rule"
            )
    return "; ".join(parts)


def savings_line(data: StudyData, states: dict[str, CellState]) -> str:
    s = savings(data, states)
    conf = float(data.adaptive["confidence"]) if data.adaptive else 0.95
    if not settled(states):
        # Held seeds are not released yet, so "released" is not what the study will use.
        return (
            f"adaptive design so far: {s.seeds_used} seeds released of at most {s.seeds_fixed} "
            f"({len(data.cells)} cells x {data.adaptive['max'] if data.adaptive else '?'} "
            "seeds); what it saves is known once every cell is settled"
        )
    wall = (
        f"; run time (summed over runs) {_fmt_duration(s.wall_used)} against about "
        f"{_fmt_duration(s.wall_fixed)} "
        f"(saved about {_fmt_duration(max(0.0, s.wall_saved))})"
        if math.isfinite(s.wall_fixed)
        else ""
    )
    return (
        f"adaptive design: {s.seeds_used} seeds against {s.seeds_fixed} for the fixed design "
        f"({len(data.cells)} cells x {data.adaptive['max'] if data.adaptive else '?'} seeds, "
        f"same {conf:g} confidence): saved {s.seeds_saved} seeds{wall}"
    )


def adaptive_section(doc: _Doc, data: StudyData) -> None:
    states = adaptive_states(data)
    if states is None or data.adaptive is None:
        return
    a = data.adaptive
    versus = "the baseline" if a["decide"] == "baseline" else "the runner-up (ranking)"
    doc.heading(2, "Seeds that decide")
    doc.para(
        f"Seeds were added in batches: every cell started with {a['min']} seeds and got "
        f"{a['batch']} more after each look while its paired comparison (seed s against seed s) "
        f"with {versus} was open, up to {a['max']}. A cell is decided when its interval for the "
        f"difference of {data.metric} excludes 0 (better/worse) or lies inside ±{a['margin']:g} "
        f"(equivalent). The intervals are Pocock group-sequential paired-t intervals: all looks "
        f"together miss the true difference with probability at most {1 - a['confidence']:.2g}, "
        "so a decision taken at any look is valid (docs/seeds.md). A diverged seed counts as "
        "the worst score of its look."
    )
    rows = []
    for cell, s in states.items():
        d = s.decision
        iv = f"{d.estimate:+.4g} [{d.lo:+.4g}, {d.hi:+.4g}]" if d else "—"
        rows.append(
            [cell, f"{s.done}/{s.released}", s.status, s.versus or "—", iv, s.line(words=True)]
        )
    doc.table(
        ["cell", "seeds", "verdict", "versus", "difference [interval]", "in words"],
        rows,
        code_col=0,
    )
    doc.para(savings_line(data, states) + ".")


__all__ = [
    "Savings",
    "adaptive_lines",
    "adaptive_section",
    "adaptive_states",
    "decided_cells",
    "interim_reason",
    "savings",
]
