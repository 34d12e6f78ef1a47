"""What a finished (or running) ablation study holds, in one plain structure.

The report, the end-of-sweep summary table and the findings all read a ``StudyData``; the sweep
code fills it from the Optuna study (cells, seeds, outcomes) and the tracker (metric histories).
Keeping this boundary plain (no Optuna or MLflow objects) lets the report be tested on stored
fixtures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a plain module: the stats (SciPy) are not imported to read a study
    from harness.report.stats import Interval

RunStatus = Literal["completed", "diverged", "failed", "running", "waiting"]


@dataclass
class RunData:
    """One (cell, seed) training run."""

    cell: str  # the cell's label, e.g. "eps_clip=0.2 c_clip=3"
    seed: int
    status: RunStatus
    reason: str = ""  # e.g. "diverged at step 17: non-finite policy parameters after the update"
    summary: dict[str, float] = field(
        default_factory=dict
    )  # final/*, best/*, stability/* (run level)
    history: dict[str, list[float]] = field(
        default_factory=dict
    )  # per-step keys, NaN where missing
    inert_clip: bool = False  # the configuration makes the policy ratio identically 1
    task: str = ""  # task spec of the run (stratification key when a study spans several tasks)
    run_id: str | None = None  # tracker (MLflow) run id
    wall_time: float = float("nan")
    machine: str = ""  # "CPU model, ISA, cores, torch threads, device" the run ran on


@dataclass
class StudyData:
    """An ablation study: the grid, its cells, and every run."""

    study: str  # Optuna study name
    experiment: str  # the experiment file's `name` (also the MLflow experiment)
    description: str
    base_config: dict[str, Any]  # the resolved base RunConfig as a plain dict
    axes: dict[str, list[Any]]  # axis (dotted path or 'variant') -> its values
    cells: dict[str, dict[str, Any]]  # cell label -> {dotted path: value} overrides, in grid order
    baseline: str | None  # label of the baseline cell
    metric: str  # run-summary key the ranking uses, e.g. "final/reward"
    direction: Literal["maximize", "minimize"]
    seeds: list[int]
    steps: int
    runs: list[RunData]
    wall_time: float = float("nan")  # sum of run wall times (s)
    parent_run_id: str | None = None
    command: str = ""  # the command line that produced the study
    # seeds: {min, max, batch, decide, confidence, margin} of an adaptive study (else None)
    adaptive: dict[str, Any] | None = None
    # cell label -> axis -> the value it takes (the variant's name for 'variant'); empty for
    # studies stored before it was recorded (the report then reads the overrides)
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)

    def runs_of(self, cell: str) -> list[RunData]:
        return [r for r in self.runs if r.cell == cell]


@dataclass(frozen=True)
class CellSummary:
    """What the report shows for one cell: intervals always next to seeds, collapses, divergences.

    ``n_seeds`` counts every run given; ``n_used`` the finite scores the statistics were computed
    on (non-finite scores are dropped).  ``p_improve`` is None without a baseline.
    ``collapse_rate`` is the fraction of runs flagged collapsed among runs whose flag is defined
    (NaN when no flags were given); ``n_diverged`` counts diverged runs (see
    :func:`harness.report.stats.summarize_cell`, which computes it).
    """

    n_seeds: int
    n_used: int
    iqm: Interval
    mean: Interval
    median: float
    p_improve: Interval | None
    collapse_rate: float
    n_diverged: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat float dict (MLflow-loggable): ``iqm``, ``iqm_low``, ``iqm_high``, ... ."""
        out: dict[str, float] = {
            "n_seeds": float(self.n_seeds),
            "n_used": float(self.n_used),
            "median": self.median,
            "collapse_rate": self.collapse_rate,
            "n_diverged": float(self.n_diverged),
        }
        for name, iv in (("iqm", self.iqm), ("mean", self.mean), ("p_improve", self.p_improve)):
            point, low, high = (math.nan,) * 3 if iv is None else (iv.point, iv.low, iv.high)
            out |= {name: point, f"{name}_low": low, f"{name}_high": high}
        return {prefix + k: v for k, v in out.items()}


@dataclass(frozen=True)
class CellRow(CellSummary):
    """One cell of the ranking: its :class:`CellSummary` (over the cell's runs) next to its
    failures and diagnostics.

    ``scores`` holds, per run of the cell (``data.runs_of(label)`` order), the value the
    statistics used: the run's ``data.metric``, the imputed worst value for a diverged run (under
    ``diverged="worst"``), NaN for a run that was left out (failed, unfinished, excluded diverged,
    or no finite metric).  ``n_used`` counts the finite ones.  ``p_improve`` is None for the
    baseline itself and when the study has no baseline.
    """

    label: str
    overrides: dict[str, Any]
    is_baseline: bool
    n_completed: int
    n_failed: int
    n_unfinished: int
    n_collapsed: int
    final_kl: float
    clipfrac_low: float
    clipfrac_high: float
    dual_clipfrac: float
    inert_clip: bool
    scores: tuple[float, ...]
    diverged_reasons: tuple[str, ...] = ()
    failed_reasons: tuple[str, ...] = ()
    n_missing_metric: int = 0  # completed runs whose summary lacks a finite data.metric
    # The paired comparison with the baseline on the seeds both scored (cell − baseline, sign
    # such that > 0 is better): what an adaptive study ranks by, since its cells ran different
    # seed counts.  NaN / 0 for the baseline and without one.
    paired_diff: float = float("nan")
    n_paired: int = 0
