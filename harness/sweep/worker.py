"""The sweep worker: claim a waiting (cell, seed) trial, train it, record it, repeat.

Every (cell, seed) of a grid is one enqueued Optuna trial.  A worker never asks the sampler for
a new trial; it claims WAITING trials atomically (``claim_waiting_trial``), beats a heartbeat
while it trains, and tells the trial COMPLETE (value = the experiment's metric) or FAIL with an
``outcome`` user attribute:

    completed    the run finished (COMPLETE)
    diverged     the run's numbers stopped being finite — a result, never re-run (FAIL)
    error        an exception in the run (FAIL; the coordinator may retry it)
    interrupted  the worker was asked to stop; re-running the sweep resumes it (FAIL)

A trial whose worker died (SIGKILL, power loss) is found stale by the heartbeat and re-enqueued
by the storage's stale-trial callback; the worker that picks up the copy first ends the dead
worker's MLflow child run as KILLED, so no run is ever left RUNNING.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC_ATTR = "harness.spec"
PARENT_ATTR = "harness.parent_run_id"
HASH_ATTR = "harness.grid_hash"
COMMAND_ATTR = "harness.command"  # the command line that ran the sweep (shown in its report)

Event = dict[str, Any]


@dataclass
class WorkerOptions:
    study: str
    storage: str | None
    results_dir: Path
    tracking_uri: str | None = None
    device: str | None = None
    threads: int = 1
    worker_id: int = 0
    exit_when_idle: bool = True
    # Seconds between heartbeats; a trial silent for twice this is stale (HARNESS_HEARTBEAT_S).
    heartbeat_interval: int = int(os.environ.get("HARNESS_HEARTBEAT_S", "5"))
    max_retries: int = 0


def child_run_tags(
    spec: dict[str, Any], study_name: str, cell: str, seed: int, trial_number: int
) -> dict[str, str]:
    return {
        "harness.study": study_name,
        "harness.role": "child",
        "ablation.cell": cell,
        "seed": str(seed),
        "harness.grid_hash": spec["grid_hash"],
        "optuna.trial_number": str(trial_number),
        "harness.worker": f"{socket.gethostname()}:{os.getpid()}",
    }


def _end_orphaned_runs(
    tracker: Any, experiment: str, study: str, cell: str, seed: int, number: int
) -> None:
    """A retried trial's earlier child run (its worker died) is ended KILLED, never left RUNNING."""
    for _ in range(10):
        rid = tracker.find_run(
            experiment, {"harness.study": study, "ablation.cell": cell, "seed": str(seed)}
        )
        if rid is None:
            return
        tracker.set_tags(
            rid, {"run.status": "killed", "run.reason": f"worker died; trial retried as #{number}"}
        )
        tracker.end_run(rid, "KILLED")


def run_trial(
    study: Any,
    trial: Any,
    spec_dict: dict[str, Any],
    tracker: Any,
    opts: WorkerOptions,
    *,
    emit: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> str:
    """Train one claimed trial and tell Optuna how it ended; returns the outcome."""
    from harness.config import apply_overrides, build_run_config
    from harness.sweep.storage import heartbeat, with_retries
    from harness.tracked import tracked_run

    attrs = with_retries(lambda: study._storage.get_trial(trial._trial_id)).user_attrs
    cell, seed = attrs["cell"], int(attrs["seed"])
    from harness.sweep.dashboard import label_trial, summary_attrs

    label_trial(study, trial._trial_id, spec_dict, cell, seed)  # params for optuna-dashboard
    overrides = spec_dict["cells"][cell]
    data = apply_overrides(
        spec_dict["base"], {**overrides, "seed": seed, "steps": spec_dict["steps"]}
    )
    if opts.device:
        data["device"] = opts.device
    if not data.get("threads"):
        # Fixed per-worker thread count: results do not depend on how many workers share the CPU.
        data["threads"] = opts.threads
    cfg = build_run_config(data)
    experiment = spec_dict["experiment"]
    emit(
        {
            "event": "start",
            "worker": opts.worker_id,
            "cell": cell,
            "seed": seed,
            "steps": cfg.steps,
            "trial": trial.number,
        }
    )
    with heartbeat(study, trial):
        _end_orphaned_runs(tracker, experiment, study.study_name, cell, seed, trial.number)
        t0 = time.time()

        def on_step(step: int, m: dict[str, float]) -> None:
            emit(
                {
                    "event": "step",
                    "worker": opts.worker_id,
                    "step": step + 1,
                    "reward": m.get("objective/reward", math.nan),
                }
            )

        try:
            result, rid = tracked_run(
                cfg,
                tracker,
                experiment=experiment,
                run_name=f"{cell} seed={seed}",
                parent_run_id=spec_dict.get("parent_run_id"),
                tags=child_run_tags(spec_dict, study.study_name, cell, seed, trial.number),
                on_step=on_step,
                should_stop=should_stop,
                results_dir=opts.results_dir,
            )
        except Exception as err:  # a bug or a broken store: record it, let the sweep go on
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]
            trial.set_user_attr("outcome", "error")
            trial.set_user_attr("reason", reason)
            trial.set_user_attr("traceback", traceback.format_exc()[-2000:])
            with_retries(lambda: study.tell(trial, state=_state("FAIL")))
            attempt = int(attrs.get("attempt", 0))
            if attempt < int(spec_dict.get("max_retries", 0)):
                retry = {"cell": cell, "seed": seed, "attempt": attempt + 1}
                with_retries(lambda: study.enqueue_trial({}, user_attrs=retry))
            emit(
                {
                    "event": "done",
                    "worker": opts.worker_id,
                    "cell": cell,
                    "seed": seed,
                    "outcome": "error",
                    "reason": reason,
                }
            )
            return "error"
    outcome = {"completed": "completed", "diverged": "diverged", "interrupted": "interrupted"}[
        result.status
    ]
    summary = {k: v for k, v in result.summary.items() if isinstance(v, float) and math.isfinite(v)}
    value = result.summary.get(spec_dict["metric"], math.nan)
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        trial.set_user_attr("outcome", outcome)
        trial.set_user_attr("reason", result.reason)
        trial.set_user_attr("run_id", rid)
        for key, val in summary_attrs(summary).items():  # one attribute each, not a JSON blob
            trial.set_user_attr(key, val)
        trial.set_user_attr("inert_clip", result.inert_clip)
        trial.set_user_attr("wall_time", time.time() - t0)
        if outcome == "completed" and math.isfinite(value):
            with_retries(lambda: study.tell(trial, value))
        else:
            with_retries(lambda: study.tell(trial, state=_state("FAIL")))
    except UpdateFinishedTrialError:
        # Another worker judged this trial stale (e.g. its heartbeats were delayed) and a retry
        # copy exists: that copy is the one that counts. Mark this run so nobody mistakes it.
        tracker.set_tags(rid, {"run.superseded": "trial was judged stale and retried elsewhere"})
        emit(
            {
                "event": "done",
                "worker": opts.worker_id,
                "cell": cell,
                "seed": seed,
                "outcome": "interrupted",
                "reason": "superseded",
            }
        )
        return "interrupted"
    emit(
        {
            "event": "done",
            "worker": opts.worker_id,
            "cell": cell,
            "seed": seed,
            "outcome": outcome,
            "value": value,
            "reason": result.reason,
        }
    )
    return outcome


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def worker_loop(
    opts: WorkerOptions,
    *,
    emit: Callable[[Event], None] = lambda e: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, int]:
    """Claim and run trials until none are waiting (or running elsewhere) or a stop is asked."""
    import optuna
    import torch

    from harness.sweep.storage import (
        claim_waiting_trial,
        fail_stale_trials,
        make_storage,
        with_retries,
    )
    from harness.tracking import make_tracker

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(max(1, opts.threads))
    storage = make_storage(
        opts.storage, opts.results_dir, heartbeat_interval=opts.heartbeat_interval
    )
    study = with_retries(lambda: optuna.load_study(study_name=opts.study, storage=storage))
    spec_dict = json.loads(study.user_attrs[SPEC_ATTR])
    # Every worker of a study must beat and judge staleness on the same clock: the study's.
    interval = int(spec_dict.get("heartbeat_interval", opts.heartbeat_interval))
    if interval != opts.heartbeat_interval:
        opts.heartbeat_interval = interval
        storage = make_storage(opts.storage, opts.results_dir, heartbeat_interval=interval)
        study = with_retries(lambda: optuna.load_study(study_name=opts.study, storage=storage))
    tracker = make_tracker(opts.tracking_uri or spec_dict.get("tracking_uri"), opts.results_dir)
    counts = {"completed": 0, "diverged": 0, "error": 0, "interrupted": 0}
    try:
        while not should_stop():
            with_retries(lambda: fail_stale_trials(study))
            trial = with_retries(lambda: claim_waiting_trial(study))
            if trial is None:
                from optuna.trial import TrialState

                running = with_retries(
                    lambda: study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                )
                if opts.exit_when_idle and not running:
                    break
                # Others are still running: wait, a dead one's trial may come back as WAITING.
                for _ in range(opts.heartbeat_interval * 2):
                    if should_stop():
                        break
                    time.sleep(0.5)
                continue
            outcome = run_trial(
                study, trial, spec_dict, tracker, opts, emit=emit, should_stop=should_stop
            )
            counts[outcome] += 1
    finally:
        tracker.flush()
    emit({"event": "exit", "worker": opts.worker_id, "pid": os.getpid()})
    return counts
