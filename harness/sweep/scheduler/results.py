"""Read a study back into a ``StudyData``: outcomes from Optuna, step histories from the tracker."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from harness.report.studydata import RunData, StudyData
from harness.report.tables import CORRECTION_COLUMNS, MISMATCH_SPLIT_COLUMNS
from harness.sweep.scheduler.adaptive import is_cancelled
from harness.sweep.scheduler.labels import summary_from_attrs
from harness.sweep.scheduler.spec import load_study_spec
from harness.tracking import Tracker

# Step metrics the report plots or tabulates (one tracker query per run and key).
HISTORY_KEYS = (
    "objective/reward",
    "eval/accuracy",
    "policy/clipfrac",
    "policy/clipfrac_low",
    "policy/clipfrac_high",
    "policy/dual_clipfrac",
    "policy/approx_kl",
    "policy/entropy",
    "stability/grad_norm",
    # The report's per-step tables: the correction's statistics and the mismatch's parts.
    *dict.fromkeys(k for k, _ in CORRECTION_COLUMNS + MISMATCH_SPLIT_COLUMNS),
)


def _history(tracker: Tracker, run_id: str, steps: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for key in HISTORY_KEYS:
        points = tracker.get_metric_history(run_id, key)
        if not points:
            continue
        series = [math.nan] * steps
        for step, value in points:
            if 0 <= step < steps:
                series[step] = value
        out[key] = series
    return out


def load_study_data(
    study: optuna.Study, tracker: Tracker | None, *, command: str = ""
) -> StudyData:
    spec = load_study_spec(study)
    steps = spec.steps
    cells = list(spec.cells)
    base_task = spec.base.get("task", "reverse")
    # The newest trial per (cell, seed) decides its status: finished ones win over retries.
    best: dict[tuple[str, int], Any] = {}
    rank = {"completed": 4, "diverged": 3, "running": 2, "waiting": 1, "failed": 0}

    def status_of(t: FrozenTrial) -> str:
        if t.state == TrialState.COMPLETE:
            return "completed"
        if t.state == TrialState.FAIL:
            return "diverged" if t.user_attrs.get("outcome") == "diverged" else "failed"
        return "running" if t.state == TrialState.RUNNING else "waiting"

    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        if "cell" not in ua or is_cancelled(t):  # a seed a decision made unnecessary: no run
            continue
        key = (ua["cell"], int(ua["seed"]))
        if key not in best or rank[status_of(t)] >= rank[status_of(best[key])]:
            best[key] = t
    runs: list[RunData] = []
    total_wall = 0.0
    for (cell, seed), t in sorted(
        best.items(),
        key=lambda kv: (
            cells.index(kv[0][0]) if kv[0][0] in spec.cells else 1e9,
            kv[0][1],
        ),
    ):
        ua = t.user_attrs
        summary = summary_from_attrs(ua)
        run_id = ua.get("run_id")
        history = _history(tracker, run_id, steps) if (tracker is not None and run_id) else {}
        wall = float(ua.get("wall_time", math.nan))
        if math.isfinite(wall):
            total_wall += wall
        overrides = spec.cells.get(cell, {})
        runs.append(
            RunData(
                cell=cell,
                seed=seed,
                status=status_of(t),  # type: ignore[arg-type]
                reason=str(ua.get("reason", "")),
                summary={k: float(v) for k, v in summary.items()},
                history=history,
                inert_clip=bool(ua.get("inert_clip", False)),
                task=str(overrides.get("task", base_task)),
                run_id=run_id,
                wall_time=wall,
                machine=str(ua.get("machine", "")),
            )
        )
    return StudyData(
        study=study.study_name,
        experiment=spec.experiment,
        description=spec.description,
        base_config=dict(spec.base),
        axes={k: list(v) for k, v in spec.axes.items()},
        cells={k: dict(v) for k, v in spec.cells.items()},
        baseline=spec.baseline,
        metric=spec.metric,
        direction=spec.direction,  # type: ignore[arg-type]
        seeds=list(spec.seeds),
        steps=steps,
        runs=runs,
        wall_time=total_wall,
        parent_run_id=spec.parent_run_id,
        command=command,
        adaptive=dict(spec.adaptive) if spec.adaptive is not None else None,
        choices={k: dict(v) for k, v in spec.choices.items()},
    )
