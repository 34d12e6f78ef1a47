"""A worker's bookkeeping around the trial it trains: which trial comes next (a claimed grid
point, or the search sampler's point within the budget), the tags of a trial's MLflow child run,
and closing the child runs earlier attempts of the same point left RUNNING.  The loop that
trains trials is :mod:`harness.sweep.launching.worker`."""

from __future__ import annotations

import math
import os
import socket
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from harness.core.db import with_retries
from harness.sweep.scheduler.adaptive import apply_allocation, claim_order_avoiding, releasable
from harness.sweep.scheduler.spec import StudySpec, trial_key
from harness.sweep.stores.optuna_adapter import claim_waiting_trial, fail_stale_trials
from harness.tracking import Tracker


def child_run_tags(
    spec: StudySpec, study_name: str, cell: str, seed: int, trial_number: int
) -> dict[str, str]:
    tags = {
        "harness.study": study_name,
        "harness.role": "child",
        "seed": str(seed),
        "harness.grid_hash": spec.grid_hash,
        "optuna.trial_number": str(trial_number),
        "harness.worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    if spec.kind == "search":
        tags["search.trial"] = str(trial_number)
    else:
        tags["ablation.cell"] = cell
    return tags


DIED = "worker died; trial retried"


def end_orphaned_runs(tracker: Tracker, spec: StudySpec, study: str, earlier: list[Any]) -> None:
    """Child runs left RUNNING by ``earlier`` (ended) attempts of a trial are ended KILLED.

    A run is RUNNING after its trial ended only when nobody could close it: its worker died
    (the heartbeat failed the trial; it has no ``outcome``), or closing failed (a full disk; the
    trial's own reason says why).  Runs that were closed — an attempt FAILED with its error —
    are never touched, and neither are runs of trials still running.
    """
    for trial in earlier:
        key = {"harness.study": study, "optuna.trial_number": str(trial.number)}
        reason = DIED if "outcome" not in trial.user_attrs else trial.user_attrs.get("reason")
        for _ in range(10):
            rid = tracker.find_run(spec.experiment, key, status="RUNNING")
            if rid is None:
                break
            tags = {"run.status": "killed", "run.reason": reason or "trial ended; run was open"}
            tracker.set_tags(rid, tags)
            tracker.end_run(rid, "KILLED")


def ended_attempts(study: optuna.Study, current: Any, same: Callable[[Any], bool]) -> list[Any]:
    """Earlier trials of the same grid point (or the retried search point) that have ended."""
    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    alive = (TrialState.RUNNING, TrialState.WAITING)
    return [t for t in trials if t.number != current.number and t.state not in alive and same(t)]


def failure_reason(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]


def nanmean(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else float("nan")


def search_sampler(spec: StudySpec, worker_id: int) -> Any:
    assert spec.search is not None
    # constant_liar: parallel workers do not all sample the same promising point.
    seed = spec.search.sampler_seed + worker_id
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


# How the search's pruners start: the median pruner prunes nothing until this many points have
# finished; the Wilcoxon pruner tests a point first after this many seeds, at this threshold.
MEDIAN_STARTUP_POINTS = 4
WILCOXON_STARTUP_SEEDS = 2
WILCOXON_P = 0.1


def search_pruner(name: str) -> Any:
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_POINTS, n_warmup_steps=0)
    if name == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(
            p_threshold=WILCOXON_P, n_startup_steps=WILCOXON_STARTUP_SEEDS
        )
    return optuna.pruners.NopPruner()


# Search trials that count against n_trials besides COMPLETE and PRUNED ones (an interrupted
# or errored trial does not: the next run samples a replacement).
SPENT_OUTCOMES = ("diverged",)


def next_trial(
    study: optuna.Study, spec: StudySpec, on_cancelled: Callable[[int], None] | None = None
) -> tuple[Any | None, int]:
    """The next trial this worker should run (None if there is none now), and how many trials
    are running elsewhere.  ``on_cancelled``: told how many held seeds of an adaptive grid this
    call cancelled."""
    with_retries(lambda: fail_stale_trials(study))
    if spec.kind == "grid" and spec.adaptive is not None:
        # Counted before the allocation: a trial that ends in between is in the allocation, so
        # a worker that finds nothing released and nothing running may exit (no look pending).
        running = with_retries(
            lambda: study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        )
        cells = apply_allocation(study, spec, on_cancelled=on_cancelled)
        busy_seeds = {key[1] for t in running if (key := trial_key(t)) is not None}
        order = claim_order_avoiding(busy_seeds)
        trial = with_retries(
            lambda: claim_waiting_trial(study, accept=lambda t: releasable(t, cells), order=order)
        )
        return trial, 0 if trial is not None else len(running)
    if spec.kind == "grid":
        trial = with_retries(lambda: claim_waiting_trial(study))
    else:
        trial = ask_search_trial(study, spec)
    if trial is not None:
        return trial, 0
    running = with_retries(lambda: study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    return None, len(running)


def ask_search_trial(study: optuna.Study, spec: StudySpec) -> optuna.Trial | None:
    """A search's next point: a WAITING retry first, else a new point from the sampler while
    the finished and running points are fewer than ``n_trials``; None when the budget is met.
    The point asked is RUNNING at once, so asking again counts it (a packing worker asks up
    to K in a row and never exceeds the budget)."""
    assert spec.search is not None
    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    states = [t.state for t in trials]
    # A diverged trial used up its place in the budget too: otherwise a search whose
    # every point diverges would sample new points forever.  (An errored one does not: the
    # worker stops at it, and a resume after the fix runs its place again.)
    finished = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and t.user_attrs.get("outcome") in SPENT_OUTCOMES)
        for t in trials
    )
    busy = sum(s in (TrialState.RUNNING, TrialState.WAITING) for s in states)
    if finished + busy >= spec.search.n_trials and TrialState.WAITING not in states:
        return None
    with warnings.catch_warnings():  # "heartbeat is supposed to be used with optimize"
        warnings.simplefilter("ignore", UserWarning)  # we beat ourselves (heartbeat())
        return study.ask()  # takes a WAITING retry first, else samples a new point
