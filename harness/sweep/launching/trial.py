"""One trial a sweep worker claimed: how it trains, reports and ends, for grids and searches.

``ClaimedTrial`` holds a claimed Optuna trial with the worker's tracker and event channel;
``run_grid_trial`` trains one (cell, seed) and returns the trial's outcome (the list is in
:mod:`harness.sweep.launching.worker`, which loops over trials).  A search point, which samples
a point and trains every seed at it, is :mod:`harness.sweep.launching.search_trial`.
"""

from __future__ import annotations

import math
import os
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from harness.core.db import with_retries
from harness.core.fsutil import fatal_store_error
from harness.core.provenance import machine_text
from harness.sweep.scheduler.labels import label_trial, summary_attrs
from harness.sweep.scheduler.spec import StudySpec
from harness.sweep.scheduler.study import trial_key
from harness.sweep.scheduler.trials import (
    child_run_tags,
    end_orphaned_runs,
    ended_attempts,
    failure_reason,
)
from harness.sweep.stores.optuna_adapter import frozen_trial, heartbeat
from harness.tracking import Tracker

if TYPE_CHECKING:
    from harness.run.tracked import RunIdentity
    from harness.sweep.launching.worker import Event, WorkerOptions


class ClaimedTrial:
    """One claimed trial and how to report on it (shared by grid and search trials)."""

    def __init__(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        spec: StudySpec,
        tracker: Tracker,
        opts: WorkerOptions,
        emit: Callable[[Event], None],
        should_stop: Callable[[], bool],
    ) -> None:
        self.study, self.trial, self.spec, self.tracker = study, trial, spec, tracker
        self.opts, self.emit, self._should_stop = opts, emit, should_stop
        self.run_id: str | None = None  # the last child run this trial trained
        self.fatal: OSError | None = None  # set by a heartbeat: a full disk, a removed store
        self.reported = False  # its "done" event was sent

    def should_stop(self) -> bool:
        return self.fatal is not None or self._should_stop()

    def sibling(self, trial: optuna.Trial) -> ClaimedTrial:
        """Another trial this worker claimed, reported on as this one is (a packmate)."""
        return ClaimedTrial(
            self.study, trial, self.spec, self.tracker, self.opts, self.emit, self._should_stop
        )

    def identity(self, label: str, seed: int) -> RunIdentity:
        """The MLflow child run of this trial's (label, seed): ``tracked_run``'s identity."""
        return {
            "experiment": self.spec.experiment,
            "run_name": f"{label} seed={seed}",
            "parent_run_id": self.spec.parent_run_id,
            "tags": child_run_tags(
                self.spec, self.study.study_name, label, seed, self.trial.number
            ),
        }

    def beat_failed(self, error: BaseException) -> bool:
        """A heartbeat write failed: a full disk or a removed store stops the trial (handled, no
        warning)."""
        fatal = fatal_store_error(error)
        if fatal is None:
            return False
        self.fatal = self.fatal or fatal
        return True

    def interrupt(self, reason: str, label: str, seed: int | None) -> None:
        """Record this trial as interrupted (resumable) and close its run, as far as the stores
        still accept writes; what they refuse is recovered on resume (stale trial, open run)."""
        if self.run_id is not None:
            with suppress(Exception):
                self.tracker.set_tags(
                    self.run_id, {"run.status": "interrupted", "run.reason": reason}
                )
            with suppress(Exception):
                self.tracker.end_run(self.run_id, "KILLED")
        with suppress(Exception):
            self.trial.set_user_attr("outcome", "interrupted")
            self.trial.set_user_attr("reason", reason)
        with suppress(Exception):
            self.tell(state="FAIL")
        if not self.reported:
            self.event("done", cell=label, seed=seed, outcome="interrupted", reason=reason)

    def event(self, kind: str, **fields: Any) -> None:
        self.reported = self.reported or kind == "done"
        self.emit(
            {"event": kind, "worker": self.opts.worker_id, "trial": self.trial.number, **fields}
        )

    def train(self, cfg: Any, label: str, seed: int) -> tuple[Any, str]:
        from harness.run.tracked import tracked_run  # noqa: PLC0415 - loads torch: only in a running worker

        self.event("start", cell=label, seed=seed, steps=cfg.steps, pid=os.getpid())

        def on_step(step: int, m: dict[str, float]) -> None:
            self.event("step", step=step + 1, reward=m.get("objective/reward", math.nan))

        # The run's warnings go to the driver as events, which prints each once per cell (not
        # once per seed from every worker, with a source path): none is dropped.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                result, rid = tracked_run(
                    cfg,
                    self.tracker,
                    **self.identity(label, seed),
                    on_step=on_step,
                    should_stop=self.should_stop,
                    results_dir=self.opts.results_dir,
                )
            finally:
                for w in caught:
                    self.event("warning", cell=label, seed=seed, message=str(w.message))
        self.run_id = rid
        return result, rid

    def tell(self, *values: float, state: str | None = None) -> bool:
        """Finish the trial; False if another worker already retried it (ours is superseded)."""
        try:
            if state is None:
                v = values[0] if len(values) == 1 else list(values)
                with_retries(lambda: self.study.tell(self.trial, v))
            else:
                with_retries(lambda: self.study.tell(self.trial, state=TrialState[state]))
        except UpdateFinishedTrialError:
            return False
        return True

    def set_attrs(self, attrs: dict[str, Any]) -> bool:
        """Write the trial's user attributes; False if the trial has already ended: another
        worker judged it stale (its heartbeats were delayed past the grace period) and failed
        it, so a retry copy is the one that counts. Optuna refuses any write to an ended trial
        (``UpdateFinishedTrialError``); raised here it would end this worker, not the trial."""
        try:
            for k, v in attrs.items():
                self.trial.set_user_attr(k, v)
        except UpdateFinishedTrialError:
            return False
        return True

    def superseded(self, rid: str | None, label: str, seed: int | None) -> str:
        """This attempt was judged stale and retried elsewhere: mark its run, report it."""
        if rid is not None:
            self.tracker.set_tags(
                rid, {"run.superseded": "trial was judged stale and retried elsewhere"}
            )
        self.event("done", cell=label, seed=seed, outcome="interrupted", reason="superseded")
        return "interrupted"

    def fail_with_error(self, err: BaseException, label: str, seed: int | None) -> str:
        reason = failure_reason(err)
        attrs = {
            "outcome": "error",
            "reason": reason,
            "traceback": traceback.format_exc()[-2000:],
        }
        if not self.set_attrs(attrs) or not self.tell(state="FAIL"):
            return self.superseded(self.run_id, label, seed)
        self.event("done", cell=label, seed=seed, outcome="error", reason=reason)
        return "error"


def run_grid_trial(t: ClaimedTrial) -> str:
    """Train one claimed (cell, seed) trial and tell Optuna how it ended; returns the outcome."""
    attrs = with_retries(lambda: frozen_trial(t.study, t.trial)).user_attrs
    cell, seed = attrs["cell"], int(attrs["seed"])

    label_trial(t.study, t.trial, t.spec, cell, seed)  # params for optuna-dashboard
    with heartbeat(t.study, t.trial, on_error=t.beat_failed):
        earlier = ended_attempts(t.study, t.trial, lambda o: trial_key(o) == (cell, seed))
        end_orphaned_runs(t.tracker, t.spec, t.study.study_name, earlier)
        t0 = time.time()
        try:
            cfg = t.spec.cell_config(cell, seed, device=t.opts.device, threads=t.opts.threads)
            result, rid = t.train(cfg, cell, seed)
        except Exception as err:  # a bug or a broken store: record it, let the sweep go on
            if fatal_store_error(err) is not None:
                raise  # not this trial's fault: the worker stops (worker_loop)
            return retry_errored(t, t.fail_with_error(err, cell, seed), attrs)
    return record_grid_result(t, cell, seed, result, rid, time.time() - t0)


def retry_errored(t: ClaimedTrial, outcome: str, attrs: dict[str, Any]) -> str:
    """After a grid trial ended with ``outcome``: an error within ``--max-retries`` enqueues
    its next attempt (``attrs``: the trial's user attributes); returns ``outcome``."""
    attempt = int(attrs.get("attempt", 0))
    # A superseded attempt has its retry copy already (the stale-trial callback's).
    if outcome == "error" and attempt < t.spec.max_retries:
        retry = {"cell": attrs["cell"], "seed": int(attrs["seed"]), "attempt": attempt + 1}
        with_retries(lambda: t.study.enqueue_trial({}, user_attrs=retry))
    return outcome


def record_grid_result(
    t: ClaimedTrial, cell: str, seed: int, result: Any, rid: str, wall_s: float
) -> str:
    """Tell Optuna how a trained (cell, seed) ended (its run ``rid`` already closed): the
    outcome and summaries as attributes, the metric or FAIL; returns the outcome."""
    summary = {k: v for k, v in result.summary.items() if isinstance(v, float) and math.isfinite(v)}
    value = result.summary.get(t.spec.metric, math.nan)
    outcome = result.status  # completed | diverged | interrupted
    reason = result.reason
    if outcome == "completed" and not math.isfinite(value):
        # Told FAIL below: the run trained to the end but has no value to rank by; say so,
        # or the report can only write "no reason recorded".
        reason = f"{t.spec.metric} is {value} in this run's summary (nothing to rank by)"
    written = t.set_attrs(
        {
            "outcome": outcome,
            "reason": reason,
            "run_id": rid,
            **summary_attrs(summary),  # one attribute each, not a JSON blob (optuna-dashboard)
            "inert_clip": result.inert_clip,
            "wall_time": wall_s,
            "machine": machine_text(result.tags),
        }
    )
    if written:
        done = outcome == "completed" and math.isfinite(value)
        ok = t.tell(value) if done else t.tell(state="FAIL")
    if not written or not ok:
        # Another worker judged this trial stale (e.g. its heartbeats were delayed) and a retry
        # copy exists: that copy is the one that counts. Mark this run so nobody mistakes it.
        return t.superseded(rid, cell, seed)
    t.event("done", cell=cell, seed=seed, outcome=outcome, value=value, reason=reason)
    return outcome


def end_retried_runs(t: ClaimedTrial) -> None:
    """A search point that is a dead worker's point run again: end that attempt's runs KILLED
    (those still RUNNING)."""
    retried = RetryHeartbeatStaleTrialCallback.retried_trial_number(
        with_retries(lambda: frozen_trial(t.study, t.trial))
    )
    if retried is not None:
        earlier = ended_attempts(t.study, t.trial, lambda o: o.number == retried)
        end_orphaned_runs(t.tracker, t.spec, t.study.study_name, earlier)
