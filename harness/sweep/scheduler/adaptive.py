"""Seeds that decide, on the study: release held seeds, cancel the ones a decision made useless.

An adaptive grid (``seeds: {min, max, ...}``) has every (cell, seed) of seeds ``0..max-1``
enqueued once by ``enqueue_missing`` (by key, exactly once, as for any grid).  Those trials wait
*held*: a worker claims a WAITING trial only when the allocation
(:func:`harness.report.allocation.allocate`, a pure function of the finished trials) has
released its seed, and a trial beyond a decided cell's last look is *cancelled*: told PRUNED
with ``outcome: decided``, which every reader (resume, status, report) counts as settled.

Any process may run :func:`apply_allocation` — the driver, every worker before each claim — and
at any moment: the allocation is the same for all (it depends only on finished trials), a
cancel is a WAITING -> PRUNED transition that exactly one process wins, and a released seed is
never cancelled.  A process killed between computing a decision and cancelling leaves held
trials that nobody claims; the next ``apply_allocation`` anywhere computes the same decision and
cancels them.  Nothing is enqueued after the study opens, so no seed is ever enqueued twice, and
no seed a cell still needs is ever cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from harness.core.db import with_retries
from harness.report.allocation import CellState, allocate
from harness.sweep.scheduler.spec import StudySpec, trial_key
from harness.sweep.stores.optuna_adapter import storage_of, trial_id

CANCELLED = "decided"  # the ``outcome`` of a held seed its cell's decision made unnecessary


def is_cancelled(t: FrozenTrial) -> bool:
    return bool(t.state == TrialState.PRUNED and t.user_attrs.get("outcome") == CANCELLED)


def finished_scores(trials: list[Any], spec: StudySpec) -> dict[str, dict[int, float]]:
    """cell -> seed -> the metric of its finished trial (NaN: diverged)."""
    out: dict[str, dict[int, float]] = {c: {} for c in spec.cells}
    for t in trials:
        key = trial_key(t)
        if key is None or key[0] not in out:
            continue
        if t.state == TrialState.COMPLETE and t.values:
            out[key[0]][key[1]] = float(t.values[0])
        elif t.state == TrialState.FAIL and t.user_attrs.get("outcome") == "diverged":
            out[key[0]].setdefault(key[1], math.nan)
    return out


def cell_states(trials: list[Any], spec: StudySpec) -> dict[str, CellState]:
    """Where every cell of an adaptive study stands, from its trials (pure)."""
    adaptive = spec.adaptive_plan()
    assert adaptive is not None
    return allocate(
        finished_scores(trials, spec),
        list(spec.cells),
        adaptive,
        baseline=spec.baseline,
        maximize=spec.direction == "maximize",
    )


def final_released(states: Mapping[str, CellState]) -> dict[str, int]:
    """Cells whose released count can no longer grow: cell -> that count.  A decided (or
    undecided) cell is final; a reference is final once no cell compared with it is open."""
    open_any = any(s.status == "open" for s in states.values())
    return {
        c: s.released
        for c, s in states.items()
        if s.status != "open" and not (s.status == "reference" and open_any)
    }


def releasable(t: FrozenTrial, states: Mapping[str, CellState]) -> bool:
    """A held trial its cell's allocation has released."""
    key = trial_key(t)
    return key is not None and key[0] in states and key[1] < states[key[0]].released


def claim_order(t: Any) -> tuple[int, int]:
    """Released seeds are claimed lowest seed first across cells (then in enqueue order): every
    cell reaches its first look before any cell runs its later batches, so looks come early
    everywhere instead of one cell at a time (the enqueue order is cell by cell)."""
    key = trial_key(t)
    return (key[1] if key is not None else 1 << 30, t.number)


def claim_order_avoiding(busy_seeds: Collection[int]) -> Callable[[Any], tuple[bool, int, int]]:
    """:func:`claim_order`, but a seed another worker is running now goes after every other
    released seed.  Why: the warm start is built per seed (and cached), so two workers that take
    the same seed of two cells at once serialize on its lock while a core idles — with lowest
    seed first across cells, that was every pair of claims.  Seed 0 of cell b then runs while
    seed 1 of cell a trains, and each warm start is built once, in parallel with the others."""

    def order(t: Any) -> tuple[bool, int, int]:
        seed, number = claim_order(t)
        return (seed in busy_seeds, seed, number)

    return order


def apply_allocation(
    study: optuna.Study,
    spec: StudySpec,
    *,
    before_cancel: Callable[[dict[str, CellState]], None] | None = None,
    on_cancelled: Callable[[int], None] | None = None,
) -> dict[str, CellState]:
    """Compute the allocation from the study's trials and cancel the held trials it no longer
    needs; returns the cells' states.  ``before_cancel`` runs between the decision and the
    cancellations (a test's way to kill the process exactly there); ``on_cancelled`` is told
    how many cancellations this call won (exactly one process wins each, so the counts of all
    processes add up to the study's cancelled seeds; a sweep's progress total shrinks by them)."""
    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    states = cell_states(trials, spec)
    if before_cancel is not None:
        before_cancel(states)
    final = final_released(states)
    storage = storage_of(study)
    won = 0
    for t in trials:
        key = trial_key(t)
        if t.state != TrialState.WAITING or key is None or key[0] not in final:
            continue
        if key[1] < final[key[0]]:
            continue
        s = states[key[0]]
        reason = f"not needed: {s.cell} {s.status} at {s.released} seeds"
        tid = trial_id(t)
        try:  # the attrs first: Optuna refuses them on a finished trial
            storage.set_trial_user_attr(tid, "outcome", CANCELLED)
            storage.set_trial_user_attr(tid, "reason", reason)
            storage.set_trial_state_values(tid, state=TrialState.PRUNED)
        except UpdateFinishedTrialError:
            continue  # another process cancelled it first
        won += 1
    if won and on_cancelled is not None:
        on_cancelled(won)
    return states


def incumbent(study: optuna.Study, spec: StudySpec) -> tuple[int, list[float]] | None:
    """A racing search's incumbent: the best COMPLETE trial by its first objective, with its
    per-seed values (NaN for a diverged seed); None before any trial completed."""
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values and t.user_attrs.get("seed_values")
    ]
    if not done:
        return None
    sign = 1.0 if spec.direction == "maximize" else -1.0
    best = max(done, key=lambda t: sign * t.values[0])
    raw = best.user_attrs["seed_values"][0]
    return best.number, [math.nan if v is None else float(v) for v in raw]


def settled_keys(trials: list[Any]) -> set[tuple[str, int]]:
    """(cell, seed) keys cancelled by a decision: finished for ``enqueue_missing``."""
    return {k for t in trials if is_cancelled(t) and (k := trial_key(t)) is not None}


__all__ = [
    "CANCELLED",
    "apply_allocation",
    "cell_states",
    "final_released",
    "incumbent",
    "finished_scores",
    "is_cancelled",
    "releasable",
    "settled_keys",
]
