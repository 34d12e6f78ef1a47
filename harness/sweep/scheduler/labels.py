"""What a grid study shows in optuna-dashboard: each trial's cell as params, named objective,
run summaries as separate attributes.

A grid trial is enqueued with no params (``enqueue_missing`` identifies a trial by its ``cell``
and ``seed`` user attributes, and the exactly-once claim logic depends on nothing else), so
optuna-dashboard had nothing to plot: hyperparameter importance failed with HTTP 500
(``ZeroDivisionError``) and slice/contour/rank plots were blank. The worker that claims a trial
therefore records, before training, each grid axis's value for the trial's cell and the seed as
*fixed* params, with a categorical distribution over every value of that axis — the same
distribution for every trial of the study, as Optuna's importance evaluators require. Params are
written only when absent, so a retried copy of a stale trial (which carries its params over)
is left as it is. User attributes and trial states are untouched.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from harness.core.configtools import level_str
from harness.core.db import with_retries
from harness.sweep.scheduler.spec import StudySpec
from harness.sweep.stores.optuna_adapter import frozen_trial, storage_of, trial_id


def param_value(value: Any) -> str | int | float:
    """An axis value as an Optuna categorical choice: numbers stay numbers, the rest text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return level_str(value)
    return value


def cell_choice(spec: StudySpec, cell: str) -> dict[str, Any]:
    """Axis -> value for ``cell``: from the spec's ``choices``, else rebuilt from overrides
    (studies made before ``choices`` was stored)."""
    if cell in spec.choices:
        return dict(spec.choices[cell])
    overrides = spec.cells.get(cell, {})
    tokens = set(cell.split())
    out: dict[str, Any] = {}
    for axis, values in spec.axes.items():
        if axis == "variant":
            out[axis] = next((v for v in values if f"variant={v}" in tokens), cell)
        elif axis in overrides:
            out[axis] = overrides[axis]
    return out


def trial_params(spec: StudySpec, cell: str, seed: int) -> dict[str, tuple[Any, Any]]:
    """Param name -> (value, distribution) for one (cell, seed) trial of a grid study."""
    params: dict[str, tuple[Any, Any]] = {}
    choice = cell_choice(spec, cell)
    for axis, values in spec.axes.items():
        if axis not in choice:
            continue
        choices = list(dict.fromkeys(param_value(v) for v in values))
        params[axis] = (param_value(choice[axis]), CategoricalDistribution(choices))
    seeds = [int(s) for s in spec.seeds]
    params["seed"] = (int(seed), CategoricalDistribution(sorted(set(seeds) | {int(seed)})))
    return params


def label_trial(
    study: optuna.Study, trial: optuna.Trial, spec: StudySpec, cell: str, seed: int
) -> None:
    """Record the trial's cell axes and seed as params (those it does not have yet)."""
    storage = storage_of(study)
    tid = trial_id(trial)
    have = with_retries(lambda: frozen_trial(study, trial)).params
    for name, (value, dist) in trial_params(spec, cell, seed).items():
        if name in have or value not in dist.choices:
            continue
        internal = dist.to_internal_repr(value)
        with_retries(
            lambda n=name, i=internal, d=dist: storage.set_trial_param(tid, n, i, d)  # type: ignore[misc]
        )


def summary_attrs(summary: dict[str, float]) -> dict[str, float]:
    """Run summaries as one user attribute each (finite values only), not one JSON blob."""
    return {k: float(v) for k, v in summary.items() if math.isfinite(v)}


def summary_from_attrs(user_attrs: dict[str, Any]) -> dict[str, float]:
    """The run summaries a trial carries: its per-key attributes, or the older JSON blob."""
    if "summary" in user_attrs:
        return {k: float(v) for k, v in json.loads(user_attrs["summary"]).items()}
    return {
        k: float(v)
        for k, v in user_attrs.items()
        if "/" in k and isinstance(v, int | float)  # metric names; cell, seed... have no '/'
    }


def name_objective(study: optuna.Study, metric: str) -> None:
    """Call the study's objective by the experiment's metric (not "Objective 0")."""
    with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use since
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if study.metric_names != [metric]:
            with_retries(lambda: study.set_metric_names([metric]))
