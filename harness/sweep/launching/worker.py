"""The sweep worker: take a trial of the study, train it, record it, repeat — for grids and
searches alike, under any launcher (local processes, Ray tasks, ``harness worker`` by hand).

Grid.  Every (cell, seed) is one enqueued Optuna trial.  The worker never asks the sampler for a
new trial; it claims WAITING trials atomically (``claim_waiting_trial``).
Search.  The worker asks the study's TPE sampler for a point (``study.ask``, which takes a
WAITING retry first) and trains every seed of the experiment at it, reporting the running mean
after each seed so that the pruner can stop a point whose first seeds already lag.

Either way the worker beats a heartbeat while it trains and tells the trial COMPLETE (the
metric) or FAIL/PRUNED with an ``outcome`` user attribute:

    completed    the run finished (COMPLETE)
    diverged     the run's numbers stopped being finite — a result, never re-run (FAIL)
    pruned       a search point stopped early by the pruner, or one the config rejects (PRUNED)
    error        an exception in the run (FAIL; a grid may retry it, see ``max_retries``)
    interrupted  the worker was asked to stop; re-running the sweep resumes it (FAIL)

A trial whose worker died (SIGKILL, a lost Ray node) is found stale by the heartbeat and
re-enqueued by the storage's stale-trial callback; the worker that picks up the copy first ends
the dead worker's MLflow child run as KILLED, so no run is ever left RUNNING.  Only runs still
RUNNING whose trial has ended are closed that way: an attempt that failed with an error keeps
its FAILED run and its reason.

A full disk (any write: the journal, MLflow's database or artifacts, a cache) or a store removed
while it runs (the results directory deleted, by hand or by a trial's own reward code) stops the
worker: its trial is recorded as interrupted where the stores still take it (or, where they do
not, is recovered by the heartbeat like a dead worker's), its MLflow run is ended KILLED where
possible, and the worker emits one ``fatal`` event with the reason instead of failing trial
after trial.

How one claimed trial trains, reports and ends is :mod:`harness.sweep.launching.trial`.

Packing (``cells_per_worker`` K > 1).  A grid's worker claims its trial as above, then up to
K - 1 more WAITING trials whose configs share the first's base fields (seed included), and
trains them on one base model, each keeping its own Optuna trial, heartbeat, MLflow run and
outcome (:mod:`harness.sweep.launching.packed`).  An adaptive grid's packmates are released
seeds only.  A search's worker asks for up to K points (within ``n_trials``) and trains seed i
of every point still live as one pack, pruning between seeds as an unpacked point does
(:mod:`harness.sweep.launching.packed_search`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from harness.core.db import with_retries
from harness.core.fsutil import StoreRemovedError, fatal_store_error
from harness.sweep.launching.packed import run_grid_pack
from harness.sweep.launching.packed_search import run_search_pack
from harness.sweep.launching.search_trial import run_search_trial
from harness.sweep.launching.trial import ClaimedTrial, run_grid_trial
from harness.sweep.scheduler.packs import PackKeys
from harness.sweep.scheduler.spec import load_study_spec
from harness.sweep.scheduler.trials import (
    next_trial,
    search_pruner,
    search_sampler,
)
from harness.sweep.stores.storage import make_storage
from harness.tracking import Tracker, make_tracker

Event = dict[str, Any]
OUTCOMES = ("completed", "diverged", "pruned", "error", "interrupted")


@dataclass
class WorkerOptions:
    """How one worker joins a study; everything about the study itself is in its StudySpec."""

    study: str
    storage: str | None
    results_dir: Path
    tracking_uri: str | None = None
    device: str | None = None
    threads: int = 1  # torch threads of each run unless its config sets them
    worker_id: int = 0
    exit_when_idle: bool = True
    cells_per_worker: int = 1  # grid trials trained at once on one base model (LoRA packing)


def worker_loop(
    opts: WorkerOptions,
    *,
    emit: Callable[[Event], None] = lambda e: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, int]:
    """Take and run trials until none is left (none waiting, none running elsewhere, or a
    search's ``n_trials`` reached), a stop is asked, or the disk is full or a store was
    removed; returns outcome counts (``disk_full`` is 1 when either stopped the worker, after
    its ``fatal`` event, whose ``removed`` says which).
    """
    counts = dict.fromkeys(OUTCOMES, 0)
    try:
        fatal = _work(opts, counts, emit, should_stop)
    except Exception as err:
        fatal = fatal_store_error(err)
        if fatal is None:
            raise
    if fatal is not None:
        counts["disk_full"] = 1
        removed = isinstance(fatal, StoreRemovedError)
        emit({"event": "fatal", "worker": opts.worker_id, "reason": str(fatal), "removed": removed})
    emit({"event": "exit", "worker": opts.worker_id, "pid": os.getpid()})
    return counts


def _work(
    opts: WorkerOptions,
    counts: dict[str, int],
    emit: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> OSError | None:
    """The loop of ``worker_loop``; returns the full disk or removed store that stopped it (as
    :func:`~harness.core.fsutil.fatal_store_error` gives it), or None."""
    import torch  # noqa: PLC0415 - loads torch: only in a running worker

    from harness.run.tracked import tracked_run  # noqa: F401, PLC0415 - loads torch before a trial is claimed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(max(1, opts.threads))
    storage = make_storage(opts.storage, opts.results_dir)
    study = with_retries(lambda: optuna.load_study(study_name=opts.study, storage=storage))
    spec = load_study_spec(study)
    # Every worker of a study beats and judges staleness on the study's clock.
    storage = make_storage(
        opts.storage, opts.results_dir, heartbeat_interval=spec.heartbeat_interval
    )
    kwargs: dict[str, Any] = {}
    if spec.search is not None:
        kwargs = {
            "sampler": search_sampler(spec, opts.worker_id),
            "pruner": search_pruner(spec.search.pruner),
        }
    study = with_retries(
        lambda: optuna.load_study(study_name=opts.study, storage=storage, **kwargs)
    )
    tracker = make_tracker(opts.tracking_uri or spec.tracking_uri, opts.results_dir)
    run = run_search_trial if spec.kind == "search" else run_grid_trial
    packing = opts.cells_per_worker > 1
    keys = None
    if packing and spec.kind == "grid":
        keys = PackKeys(spec, device=opts.device, threads=opts.threads)
    fatal: OSError | None = None

    def on_cancelled(n: int) -> None:  # held seeds this worker's allocation cancelled
        emit({"event": "cancelled", "worker": opts.worker_id, "n": n})

    try:
        while fatal is None and not should_stop():
            trial, running = next_trial(study, spec, on_cancelled)
            if trial is None:
                if opts.exit_when_idle and not running:
                    break
                # Others are still running: wait, a dead one's trial may come back as WAITING.
                # An adaptive grid looks again soon: a running seed's end may release more.
                adaptive_grid = spec.kind == "grid" and spec.adaptive is not None
                ticks = 1 if adaptive_grid else spec.heartbeat_interval * 2
                for _ in range(ticks):
                    if should_stop():
                        break
                    time.sleep(0.5)
                continue
            t = ClaimedTrial(study, trial, spec, tracker, opts, emit, should_stop)
            pack: list[ClaimedTrial] = []  # a pack's trials, as they are claimed
            try:
                if keys is not None:
                    outcomes = run_grid_pack(t, opts.cells_per_worker, keys, pack)
                elif packing and spec.kind == "search":
                    outcomes = run_search_pack(t, opts.cells_per_worker, pack)
                else:
                    outcomes = [run(t)]
            except Exception as err:
                fatal = fatal_store_error(err)
                if fatal is None:
                    raise
            else:
                # a heartbeat (or a packmate) found the disk full or the store gone
                fatal = next((x.fatal for x in pack or [t] if x.fatal is not None), None)
                if fatal is None:
                    for outcome in outcomes:
                        counts[outcome] += 1
                    if "error" in outcomes and spec.kind == "search":
                        break  # a search point has no retry budget: stop, do not spin on a bug
            if fatal is not None:
                for x in pack or [t]:
                    # a packmate already told (a search point already ended) keeps its outcome
                    if (x is t and not pack) or not x.reported:
                        x.interrupt(str(fatal), *_label(x))
    except BaseException:
        _flush_quietly(tracker)  # the error on its way out says more than a failed flush
        raise
    if fatal is not None:
        _flush_quietly(tracker)
    else:
        tracker.flush()
    return fatal


def _flush_quietly(tracker: Tracker) -> None:
    try:
        tracker.flush()
    except Exception:
        pass


def _label(t: ClaimedTrial) -> tuple[str, int | None]:
    """(cell or "trial N", seed) of a trial, for its ``done`` event."""
    try:
        attrs = t.trial.user_attrs
        if "cell" in attrs:
            return str(attrs["cell"]), int(attrs["seed"])
    except Exception:
        pass  # only a label: the storage refusing a read must not hide the full disk
    return f"trial {t.trial.number}", None
