"""``harness ablate``: create (or resume) the study, enqueue every missing (cell, seed), run local
workers with live progress, and finish with the ranking table and the report.

Study identity: the Optuna study is named after the experiment (or ``--study-name``) and carries
the grid hash.  Re-running the same command resumes it — only (cell, seed) pairs with no
completed or diverged trial are enqueued, and trials already waiting or running are left alone.
A changed grid under the same name is refused.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.configtools import ConfigError
from harness.experiment import ExperimentSpec
from harness.redact import redact_url
from harness.sweep.worker import (
    COMMAND_ATTR,
    HASH_ATTR,
    PARENT_ATTR,
    SPEC_ATTR,
    WorkerOptions,
    worker_loop,
)

DONE_OUTCOMES = ("completed", "diverged")


def spec_payload(
    spec: ExperimentSpec, *, tracking_uri: str | None, max_retries: int
) -> dict[str, Any]:
    """What workers (here or on other machines) need to run any trial of the study."""
    return {
        "experiment": spec.name,
        "name": spec.name,
        "description": spec.description,
        "grid_hash": spec.grid_hash(),
        "base": resolved_base(spec),
        "axes": spec.axes,
        "cells": {c.label: c.overrides for c in spec.cells},
        "choices": {c.label: c.choice for c in spec.cells},  # axis -> value, for trial params
        "seeds": spec.seeds,
        "steps": spec.steps,
        "metric": spec.metric,
        "direction": spec.direction,
        "baseline": spec.baseline,
        "tracking_uri": redact_url(tracking_uri) if tracking_uri else None,
        "max_retries": max_retries,
        "heartbeat_interval": int(os.environ.get("HARNESS_HEARTBEAT_S", "5")),
    }


def resolved_base(spec: ExperimentSpec) -> dict[str, Any]:
    """The base run config with every default filled in (what a report shows as held fixed)."""
    from harness.config import build_run_config
    from harness.configtools import to_dict

    return to_dict(build_run_config(spec.base))


def open_study(
    spec: ExperimentSpec,
    *,
    storage: Any,
    tracker: Any,
    study_name: str | None,
    tracking_uri: str | None,
    max_retries: int,
    command: str,
) -> tuple[Any, dict[str, Any]]:
    """Create or load the study (refusing a changed grid) and its MLflow parent run."""
    import optuna

    from harness.sweep.storage import with_retries

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name or spec.name
    grid_hash = spec.grid_hash()
    try:
        study = with_retries(lambda: optuna.load_study(study_name=name, storage=storage))
        old = study.user_attrs.get(HASH_ATTR)
        if old != grid_hash:
            raise ConfigError(
                f"study {name!r} already exists with a different grid (hash {old} != {grid_hash}); "
                f"to start a new study run again with --study-name {name}-2 (or another new name)"
            )
    except KeyError:
        study = with_retries(
            lambda: optuna.create_study(
                study_name=name,
                storage=storage,
                direction=spec.direction,  # type: ignore[arg-type]
            )
        )
        study.set_user_attr(HASH_ATTR, grid_hash)
    payload = spec_payload(spec, tracking_uri=tracking_uri, max_retries=max_retries)
    from harness.sweep.dashboard import name_objective

    name_objective(study, spec.metric)

    # One MLflow parent run per study; a resume reuses it.
    parent = study.user_attrs.get(PARENT_ATTR)
    tags = {"harness.study": name, "harness.role": "parent", "harness.grid_hash": grid_hash}
    if parent:
        tracker.start_run(experiment=spec.name, run_name=name, run_id=parent)
    else:
        from harness.configtools import flatten
        from harness.provenance import provenance_tags

        parent = tracker.start_run(
            experiment=spec.name, run_name=f"{name} (study)", tags={**provenance_tags(), **tags}
        )
        tracker.log_params(parent, {f"base.{k}": v for k, v in flatten(spec.base).items()})
        tracker.log_params(
            parent,
            {
                "grid.axes": json.dumps(spec.axes, default=str),
                "grid.cells": len(spec.cells),
                "grid.seeds": json.dumps(spec.seeds),
                "grid.steps": spec.steps,
                "grid.metric": spec.metric,
                "grid.baseline": spec.baseline or "",
            },
        )
        tracker.log_text(
            parent, Path(spec.path).read_text() if spec.path else "", "experiment.yaml"
        )
        study.set_user_attr(PARENT_ATTR, parent)
    tracker.set_tags(parent, {"harness.command": command})
    study.set_user_attr(COMMAND_ATTR, command)
    payload["parent_run_id"] = parent
    study.set_user_attr(SPEC_ATTR, json.dumps(payload, default=str))
    return study, payload


def trial_key(t: Any) -> tuple[str, int] | None:
    ua = t.user_attrs
    if "cell" not in ua or "seed" not in ua:
        return None
    return ua["cell"], int(ua["seed"])


def enqueue_missing(study: Any, spec: ExperimentSpec) -> tuple[int, int]:
    """Enqueue every (cell, seed) without a finished, waiting or running trial.

    Returns (enqueued now, already finished).  Finished = COMPLETE, or FAIL with outcome
    'diverged' (a result; re-running would diverge again).  Trials that failed with an error or
    were interrupted are enqueued again."""
    from optuna.trial import TrialState

    from harness.sweep.storage import with_retries

    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    finished: set[tuple[str, int]] = set()
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
            key = (cell.label, seed)
            if key in finished or key in pending:
                continue
            attrs = {"cell": cell.label, "seed": seed, "attempt": 0}
            with_retries(lambda a=attrs: study.enqueue_trial({}, user_attrs=a))  # type: ignore[misc]
            n += 1
    return n, len(finished & {(c.label, s) for c in spec.cells for s in spec.seeds})


class StopSignals:
    """SIGINT/SIGTERM handling of a coordinator: the first signal asks the workers to stop (they
    finish the current step and record their trials as interrupted); a second one terminates
    them.  Use as a context manager; the previous handlers come back on exit."""

    def __init__(self, stop: Any, procs: list[Any]) -> None:
        self.stop, self.procs, self.count = stop, procs, 0

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.stop.set()
        if self.count > 1:
            for p in self.procs:
                if p.is_alive():
                    p.terminate()

    def __enter__(self) -> StopSignals:
        self._old = (
            signal.signal(signal.SIGINT, self._handle),
            signal.signal(signal.SIGTERM, self._handle),
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._old[0])
        signal.signal(signal.SIGTERM, self._old[1])

    @property
    def interrupted(self) -> bool:
        return self.count > 0


def _worker_entry(opts: WorkerOptions, events: Any, stop: Any) -> None:
    """Process entry point: Ctrl-C is the coordinator's to handle; it asks us to stop via ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from harness.perf import tune_malloc

    tune_malloc()

    def emit(e: dict[str, Any]) -> None:
        try:
            events.put_nowait(e)
        except Exception:  # a full or closed queue must never stop training
            pass

    try:
        worker_loop(opts, emit=emit, should_stop=stop.is_set)
    except Exception as err:
        emit({"event": "crash", "worker": opts.worker_id, "reason": f"{type(err).__name__}: {err}"})
        raise


def run_local_workers(
    n_workers: int,
    base_opts: WorkerOptions,
    *,
    devices: list[str] | None,
    total: int,
    done_before: int,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    fail_fast: bool = False,
) -> dict[str, int]:
    """Start ``n_workers`` processes and show live progress until they exit.

    SIGINT/SIGTERM: workers are asked to stop (their running trials end as 'interrupted' and are
    resumed by the next run); a second signal terminates them.
    """
    from harness.sweep.progress import SweepProgress

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    stop = ctx.Event()
    procs = []
    # One torch thread per run unless the config says otherwise: the thread count changes float
    # reduction order, so it must not depend on how many workers share the machine (the same
    # grid with 1 or 2 workers gives the same histories). Use one worker per core.
    threads = base_opts.threads or 1
    for i in range(n_workers):
        opts = WorkerOptions(**{**base_opts.__dict__, "worker_id": i, "threads": threads})
        if devices:
            opts.device = devices[i % len(devices)]
        p = ctx.Process(target=_worker_entry, args=(opts, events, stop), name=f"harness-worker-{i}")
        p.start()
        procs.append(p)

    counts = {"completed": 0, "diverged": 0, "error": 0, "interrupted": 0}
    progress = SweepProgress(n_workers, total=total, done=done_before)
    signals = StopSignals(stop, procs)
    try:
        with signals, progress:
            while any(p.is_alive() for p in procs) or not events.empty():
                try:
                    e = events.get(timeout=0.25)
                except queue.Empty:
                    continue
                progress.handle(e)
                if on_event is not None:
                    on_event(e)
                if e["event"] == "done":
                    counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
                    if fail_fast and e["outcome"] == "error":
                        stop.set()
                if e["event"] == "crash":
                    counts["error"] += 1
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    counts["interrupted_by_user"] = int(signals.interrupted)
    return counts
