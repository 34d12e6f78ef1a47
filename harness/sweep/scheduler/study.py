"""Opening and reading studies: the one ``open_study`` (grid or search), the grid's queue of
missing (cell, seed) trials, the counts ``harness status`` shows, and the best point a study
found (what ``harness export`` takes).

Study identity: the Optuna study is named after the experiment (or ``--study-name``) and carries
the grid hash.  Re-running the same command resumes it — only (cell, seed) pairs with no
completed or diverged trial are enqueued, and trials already waiting or running are left alone.
A changed grid (or search space) under the same name is refused.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from harness.config.experiment import ExperimentSpec
from harness.core.configtools import ConfigError, flatten
from harness.core.db import with_retries
from harness.core.provenance import provenance_tags
from harness.report import ranking
from harness.report.stats import mean_ci
from harness.sweep.scheduler.adaptive import cell_states, is_cancelled, settled_keys
from harness.sweep.scheduler.labels import name_objective
from harness.sweep.scheduler.results import load_study_data
from harness.sweep.scheduler.spec import (
    COMMAND_ATTR,
    HASH_ATTR,
    PARENT_ATTR,
    SPEC_ATTR,
    StudySpec,
    heartbeat_interval_from_env,
    load_study_spec,
    trial_key,
)
from harness.tracking import Tracker


def open_study(
    exp: ExperimentSpec,
    *,
    storage: BaseStorage,
    tracker: Tracker,
    study_name: str | None,
    tracking_uri: str | None,
    command: str,
    max_retries: int = 0,
) -> tuple[Any, StudySpec]:
    """Create or load the study of ``exp`` (refusing a changed grid or search space), open its
    MLflow parent run (a resume reuses it) and store the study's ``StudySpec`` on it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_experiment(
        exp,
        tracking_uri=tracking_uri,
        max_retries=max_retries,
        heartbeat_interval=heartbeat_interval_from_env(),
    )
    name = study_name or exp.name
    what = "search space" if spec.kind == "search" else "grid"
    try:
        study = with_retries(lambda: optuna.load_study(study_name=name, storage=storage))
        old = study.user_attrs.get(HASH_ATTR)
        if old != spec.grid_hash:
            raise ConfigError(
                f"study {name!r} already exists with a different {what} (hash {old} != "
                f"{spec.grid_hash}); to start a new study run again with --study-name {name}-2 "
                "(or another new name)"
            )
        parent = study.user_attrs.get(PARENT_ATTR)
        if (
            parent
            and tracker.find_run(exp.name, {"harness.study": name, "harness.role": "parent"})
            is None
        ):
            # The study lives in this storage but its runs were recorded in another tracking
            # store: resuming would log children under a parent that does not exist here.
            raise ConfigError(
                f"study {name!r} exists in this storage but its MLflow parent run {parent} is "
                f"not in the tracking store {tracker!r}; use the --tracking-uri/--results-dir "
                f"it was started with, or a new --study-name (e.g. {name}-2)"
            )
        if SPEC_ATTR in study.user_attrs:
            # A resume keeps the study's clock: live workers of it may still be beating.
            stored = load_study_spec(study)
            spec = replace(spec, heartbeat_interval=stored.heartbeat_interval)
    except KeyError:
        study = with_retries(
            lambda: optuna.create_study(
                study_name=name,
                storage=storage,
                directions=spec.directions,  # type: ignore[arg-type]
            )
        )
        study.set_user_attr(HASH_ATTR, spec.grid_hash)
    if spec.kind == "grid":
        name_objective(study, spec.metric)  # optuna-dashboard shows the metric, not "Objective 0"

    parent = study.user_attrs.get(PARENT_ATTR)
    if parent:
        tracker.start_run(experiment=exp.name, run_name=name, run_id=parent)
    else:
        parent = _start_parent_run(exp, spec, tracker, name)
        study.set_user_attr(PARENT_ATTR, parent)
    tracker.set_tags(parent, {"harness.command": command})
    study.set_user_attr(COMMAND_ATTR, command)
    spec = spec.with_parent(parent)
    study.set_user_attr(SPEC_ATTR, spec.to_json())
    return study, spec


def _start_parent_run(exp: ExperimentSpec, spec: StudySpec, tracker: Tracker, name: str) -> str:
    tags = {"harness.study": name, "harness.role": "parent", "harness.grid_hash": spec.grid_hash}
    label = "search" if spec.kind == "search" else "study"
    parent = tracker.start_run(
        experiment=exp.name, run_name=f"{name} ({label})", tags={**provenance_tags(), **tags}
    )
    if spec.kind == "grid":
        tracker.log_params(parent, {f"base.{k}": v for k, v in flatten(exp.base).items()})
        tracker.log_params(
            parent,
            {
                "grid.axes": json.dumps(exp.axes, default=str),
                "grid.cells": len(exp.cells),
                "grid.seeds": json.dumps(exp.seeds),
                "grid.steps": exp.steps,
                "grid.metric": exp.metric,
                "grid.baseline": exp.baseline or "",
            },
        )
    tracker.log_text(parent, Path(exp.path).read_text() if exp.path else "", "experiment.yaml")
    return str(parent)


def enqueue_missing(study: optuna.Study, spec: StudySpec) -> tuple[int, int]:
    """Enqueue every (cell, seed) without a finished, waiting or running trial.

    Returns (enqueued now, already finished).  Finished = COMPLETE, or FAIL with outcome
    'diverged' (a result; re-running would diverge again).  Trials that failed with an error or
    were interrupted are enqueued again.  A search study enqueues nothing (its workers ask the
    sampler) and counts its COMPLETE or PRUNED trials as finished."""
    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    if spec.kind == "search":
        return 0, sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)

    # An adaptive grid's seeds cancelled by a decision are settled: never enqueued again.
    finished: set[tuple[str, int]] = settled_keys(trials)
    pending: set[tuple[str, int]] = set()
    for t in trials:
        key = trial_key(t)
        if key is None:
            continue
        if t.state == TrialState.COMPLETE or (
            t.state == TrialState.FAIL and t.user_attrs.get("outcome") == "diverged"
        ):
            finished.add(key)
        elif t.state in (TrialState.WAITING, TrialState.RUNNING):
            pending.add(key)
    n = 0
    for cell in spec.cells:
        for seed in spec.seeds:
            key = (cell, seed)
            if key in finished or key in pending:
                continue
            attrs = {"cell": cell, "seed": seed, "attempt": 0}
            with_retries(lambda a=attrs: study.enqueue_trial({}, user_attrs=a))  # type: ignore[misc]
            n += 1
    if spec.adaptive is not None:
        finished -= settled_keys(trials)
    return n, len(finished & {(c, s) for c in spec.cells for s in spec.seeds})


@dataclass(frozen=True)
class StudyCounts:
    """What ``harness status`` shows for one study.  A grid counts its (cell, seed) pairs (the
    newest trial of each decides); a search counts its trials.  ``done`` is COMPLETE only: a
    pruned search trial was stopped early and has no result, so it is counted apart.
    ``reasons`` are the failed trials' recorded reasons (``harness.core.failures`` groups them)."""

    done: int
    diverged: int
    running: int
    waiting: int
    failed: int
    total: int
    pruned: int = 0
    reasons: tuple[str, ...] = ()
    # An adaptive grid: (cell, its line: seeds done, decided/open, current interval)
    cells: tuple[tuple[str, str], ...] = ()
    cancelled: int = 0  # held seeds a decision made unnecessary (not in total)
    held: int = 0  # held seeds no look has released yet (in total: they may still run)


def study_counts(study: optuna.Study, spec: StudySpec | None) -> StudyCounts:
    trials = study.get_trials(deepcopy=False)
    cells: tuple[tuple[str, str], ...] = ()
    cancelled = held = 0
    if spec is not None and spec.kind == "grid" and spec.adaptive is not None:
        alloc = cell_states(trials, spec)
        cells = tuple((c, s.line()) for c, s in alloc.items())
        cancelled = len({trial_key(t) for t in trials if is_cancelled(t)})
        trials = [t for t in trials if not is_cancelled(t)]
        # Held seeds beyond what is released are not counted as waiting: they may never run.
        released = {c: s.released for c, s in alloc.items()}
        trials = [
            t
            for t in trials
            if (k := trial_key(t)) is None or k[0] not in released or k[1] < released[k[0]]
        ]
    if spec is not None and spec.kind == "search":
        counted = list(trials)
        total = spec.expected_trials
    else:
        latest: dict[Any, Any] = {}
        for t in trials:
            latest[trial_key(t) or ("#", t.number)] = t
        counted = list(latest.values())
        total = spec.expected_trials if spec is not None else len(latest)
        if cells and spec is not None:
            # What may still run or has run: cells x max less the cancelled seeds, the same
            # total the live bar of `harness ablate` shrinks to; it ends at the seeds that ran.
            total = spec.expected_trials - cancelled
            held = max(0, total - sum(released.values()))
    states: Counter[str] = Counter()
    reasons: list[str] = []
    for t in counted:
        s = t.state.name
        if s == "FAIL" and t.user_attrs.get("outcome") == "diverged":
            s = "DIVERGED"
        elif s == "FAIL":
            reasons.append(str(t.user_attrs.get("reason", "")))
        states[s] += 1
    return StudyCounts(
        done=states["COMPLETE"],
        diverged=states["DIVERGED"],
        running=states["RUNNING"],
        waiting=states["WAITING"],
        failed=states["FAIL"],
        total=total,
        pruned=states["PRUNED"],
        reasons=tuple(reasons),
        cells=cells,
        cancelled=cancelled,
        held=held,
    )


@dataclass(frozen=True)
class BestPoint:
    """The best configuration a study found: a grid's top cell in the report's ranking (IQM of
    the metric over its seeds), or a search's best trial (with several objectives: the best by
    the first objective among the Pareto front).
    Only a point with at least one completed run qualifies (diverged-only cells do not)."""

    label: str  # the cell's label, or "trial N"
    overrides: dict[str, Any]  # dotted run-config path -> value, on top of the spec's base
    value: float  # IQM of the ranking metric (grid) or the first objective (search)
    seeds: int  # runs the value averages
    metric: str = ""  # what value measures
    seed_values: tuple[float, ...] = ()  # per-seed values behind it (finite ones)
    interval: Any = None  # the report's IQM interval (grid); None for a search point

    def spread(self) -> str:
        """The uncertainty next to the value, in words: the grid's IQM CI, or the search point's
        seeds (mean with a bootstrap CI, min and max)."""
        return seed_spread(self.seed_values, self.interval, what=self.metric or "value")


def seed_spread(values: Any, interval: Any = None, *, what: str = "value") -> str:
    """``'final/reward IQM 0.61 [0.55, 0.66] over 4 seeds (min 0.52, max 0.70)'``-style text for
    a point's per-seed values; ``interval`` (an IQM CI) is used when given, else the mean with
    its 95 % percentile-bootstrap CI.  One seed has no spread and says so."""
    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if xs.size == 0:
        return f"{what}: no per-seed values recorded"
    if xs.size == 1:
        return f"{what} {xs[0]:.4g} from 1 seed: no spread (run more seeds for a CI)"
    if interval is None:
        interval, name = mean_ci(xs, n_boot=2000, seed=0), "mean"
    else:
        name = "IQM"
    return (
        f"{what} {name} {interval.point:.4g}, 95 % bootstrap CI [{interval.low:.4g}, "
        f"{interval.high:.4g}] over {xs.size} seeds (min {xs.min():.4g}, max {xs.max():.4g})"
    )


def search_seed_values(trial: FrozenTrial) -> tuple[float, ...]:
    """A search trial's per-seed values of its first objective (empty for trials recorded
    before these were kept)."""
    raw = trial.user_attrs.get("seed_values") or [[]]
    return tuple(float(v) for v in raw[0] if v is not None)


def search_front(study: optuna.Study, spec: StudySpec) -> list[Any]:
    """A search's best trials: the Pareto front with several objectives, else the one best
    trial; empty while no trial has completed."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return []
    return list(study.best_trials) if len(spec.objectives) > 1 else [study.best_trial]


def top_of_front(front: list[Any], spec: StudySpec) -> Any:
    """The search's best point among its best trials: the best by the first objective (the
    one trial of a single-objective search)."""
    sign = 1.0 if spec.direction == "maximize" else -1.0
    return max(front, key=lambda t: sign * t.values[0])


def best_point(study: optuna.Study, spec: StudySpec) -> BestPoint | None:
    """The best point of a study, for ``harness export --best``, the end of a search and its
    report; None when no run has completed yet.  ``spec.run_config(best.overrides, seed)``
    rebuilds the winning configuration."""
    if spec.kind == "search":
        front = search_front(study, spec)
        if not front:
            return None
        top = top_of_front(front, spec)
        return BestPoint(
            label=f"trial {top.number}",
            overrides=dict(top.params),
            value=float(top.values[0]),
            seeds=int(top.user_attrs.get("seeds_run", len(spec.seeds))),
            metric=spec.objectives[0][0],
            seed_values=search_seed_values(top),
        )
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    # A grid's best cell is the report's: top of the ranking by the IQM of the metric, among
    # cells with a completed run (a diverged-only cell scored as the worst value is no winner).

    rows = [
        r
        for r in ranking(load_study_data(study, None), n_boot=2000)
        if r.n_completed and math.isfinite(r.iqm.point)
    ]
    if not rows:
        return None
    top = rows[0]
    return BestPoint(
        label=top.label,
        overrides=dict(spec.cells[top.label]),
        value=top.iqm.point,
        seeds=top.n_used,
        metric=spec.metric,
        seed_values=tuple(v for v in top.scores if math.isfinite(v)),
        interval=top.iqm,
    )
