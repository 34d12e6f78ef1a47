"""One training run recorded in a tracker: params, tags, the resolved config, step metrics and
the final summaries.  Shared by ``harness run`` and the sweep workers."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack

import yaml

from harness.config import RunConfig
from harness.core.configtools import flatten, to_dict
from harness.core.provenance import provenance_tags
from harness.metrics.stability import STEPS_DONE, WALL_TIME, check_run_names
from harness.run.scaffold import RunResult
from harness.run.trainers import train
from harness.tracking import RunStatus, Tracker


class RunIdentity(TypedDict, total=False):
    """Which tracker run a training run is recorded in: ``Tracker.start_run``'s arguments."""

    experiment: Required[str]
    run_name: Required[str]
    parent_run_id: str | None
    tags: dict[str, str] | None  # on top of the provenance tags and the seed
    run_id: str | None  # resume this run instead of starting one


def start_tracked_run(cfg: RunConfig, tracker: Tracker, **identity: Unpack[RunIdentity]) -> str:
    """Create (or resume) the run and log its params, tags and resolved config."""
    identity["tags"] = {**provenance_tags(), "seed": str(cfg.seed), **(identity.get("tags") or {})}
    rid = tracker.start_run(**identity)
    resolved = to_dict(cfg)
    try:
        tracker.log_params(rid, flatten(resolved))
        tracker.log_text(rid, yaml.safe_dump(resolved, sort_keys=False), "config.yaml")
    except BaseException as err:  # e.g. a full disk: the run exists, so it must not stay RUNNING
        close_failed_run(tracker, rid, err)
        raise
    return rid


def close_failed_run(tracker: Tracker, rid: str, err: BaseException) -> None:
    """End a run whose training (or recording) raised ``err``, keeping ``err`` the one raised.

    A full disk or Ctrl-C interrupts the run (KILLED, resumable); any other error fails it
    (FAILED, with the reason).  Closing is best effort: on a full disk the tracking store may
    refuse it too, and that second error must not hide the first.
    """
    from harness.core.fsutil import disk_full_message, is_disk_full

    if is_disk_full(err):
        status: RunStatus = "KILLED"
        tags = {"run.status": "interrupted", "run.reason": disk_full_message(err)}
    else:
        status = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
        tags = {"run.status": "failed", "run.reason": f"{type(err).__name__}: {err}"[:500]}
    try:
        tracker.set_tags(rid, tags)
    except Exception:
        pass  # the status below matters more than the reason
    try:
        tracker.end_run(rid, status)
    except Exception:
        pass  # left RUNNING: the next attempt of its trial closes it (sweep.trials.end_orphaned_runs)


def finish_tracked_run(tracker: Tracker, rid: str, result: RunResult) -> None:
    """Final summaries, tags and status: FINISHED, FAILED (diverged, reason tagged) or KILLED."""
    final = {k: v for k, v in result.summary.items() if isinstance(v, float) and math.isfinite(v)}
    final[STEPS_DONE] = float(result.steps_done)
    final[WALL_TIME] = result.wall_time
    check_run_names(final)
    # Run-level values, logged once at step 0 as MLflow's own summaries are: the runs table
    # lists them as columns and the chart view compares them as bars (at the last step they
    # charted as lone dots on a line chart).
    tracker.log_metrics(rid, final, step=0)
    tags = {**result.tags, "run.status": result.status}
    if result.reason:
        tags["run.reason"] = result.reason
    tracker.set_tags(rid, tags)
    statuses: dict[str, RunStatus] = {
        "completed": "FINISHED",
        "diverged": "FAILED",
        "interrupted": "KILLED",
    }
    tracker.end_run(rid, statuses[result.status])


def tracked_run(
    cfg: RunConfig,
    tracker: Tracker,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    results_dir: Path | str = "results",
    **identity: Unpack[RunIdentity],
) -> tuple[RunResult, str]:
    """Run ``cfg`` with every step logged to ``tracker``; an exception marks the run FAILED."""
    rid = start_tracked_run(cfg, tracker, **identity)

    def on_metrics(step: int, metrics: dict[str, Any]) -> None:
        tracker.log_metrics(rid, metrics, step)
        if on_step is not None:
            on_step(step, metrics)

    try:
        result = train(cfg, on_metrics=on_metrics, should_stop=should_stop, results_dir=results_dir)
    except BaseException as err:
        close_failed_run(tracker, rid, err)
        raise
    try:
        finish_tracked_run(tracker, rid, result)
    except BaseException as err:  # the summaries could not be written (a full disk)
        close_failed_run(tracker, rid, err)
        raise
    return result, rid
