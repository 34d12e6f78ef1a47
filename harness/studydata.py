"""What a finished (or running) ablation study holds, in one plain structure.

The report, the end-of-sweep summary table and the findings all read a ``StudyData``; the sweep
code fills it from the Optuna study (cells, seeds, outcomes) and the tracker (metric histories).
Keeping this boundary plain (no Optuna or MLflow objects) lets the report be tested on stored
fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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

    def runs_of(self, cell: str) -> list[RunData]:
        return [r for r in self.runs if r.cell == cell]
