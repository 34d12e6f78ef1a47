"""The one path of ``harness ablate`` and ``harness search``: open the study (its parent MLflow
run), enqueue what is missing, run the workers, then finish the study (ranking or best point,
report).  Returns the command's exit code; a sweep stopped by Ctrl-C/SIGTERM or a full disk
ends its parent run KILLED instead of leaving it RUNNING."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from harness.config.experiment import ExperimentSpec
from harness.core.db import with_retries
from harness.core.fsutil import fatal_event_error, fatal_store_error
from harness.sweep.launching.coordinator import coordinator_lock
from harness.sweep.launching.launch import Launcher, Resources, make_launcher, run_workers
from harness.sweep.launching.launch_checks import LaunchChoice
from harness.sweep.launching.worker import WorkerOptions
from harness.sweep.present.finish import OUTCOME_TAG, finish_study
from harness.sweep.scheduler.adaptive import settled_keys
from harness.sweep.scheduler.spec import StudySpec
from harness.sweep.scheduler.study import enqueue_missing, open_study
from harness.sweep.scheduler.trials import end_orphaned_runs
from harness.sweep.stores.optuna_adapter import storage_of, trial_id
from harness.tracking import Tracker

INTERRUPTED_HINT = "interrupted: run the same command again to resume"


class _Interrupted(Exception):
    """Ctrl-C/SIGTERM during a sweep, after its parent run was closed KILLED."""


@dataclass(frozen=True)
class SweepOptions:
    """What the command line decided about one sweep, carried unchanged from the command to the
    workers' options and the finish (the opened stores and ``say`` travel beside it)."""

    storage: str | None  # the --storage URL workers open themselves (None: the journal file)
    tracking_uri: str | None
    results_dir: Path
    study_name: str | None
    workers: int
    device_list: list[str] | None
    command: str  # the command line, recorded on the study and its parent run
    choice: LaunchChoice
    max_retries: int = 0
    fail_fast: bool = False
    report: bool = True
    cells_per_worker: int = 1  # grid trials a worker trains at once on one base model
    # A launcher the command already started (Ray, joined to check that a node can hold a
    # worker before anything was written); None: made here from ``choice``.
    launcher: Launcher | None = None


def sweep(
    exp: ExperimentSpec,
    opts: SweepOptions,
    *,
    optuna_storage: BaseStorage,
    tracker: Tracker,
    say: Callable[[str], None],
) -> int:
    """Run the experiment ``exp`` (a grid or a search) to its end; ``say`` prints a line for the
    user.  0 when it finished, 1 when a grid is unfinished or no trial completed, 130 when
    interrupted (resumable)."""
    # The lock is held to the end: one coordinator per study (a second sweep of it is refused).
    with coordinator_lock(opts.results_dir, opts.study_name or exp.name):
        workers = f"{opts.workers} worker(s)"
        if opts.cells_per_worker > 1:
            workers += f" x up to {opts.cells_per_worker} packed trials each"
        study, study_spec = open_study(
            exp,
            storage=optuna_storage,
            tracker=tracker,
            study_name=opts.study_name,
            tracking_uri=opts.tracking_uri,
            max_retries=opts.max_retries,
            command=opts.command,
        )
        try:
            with _parent_closed_on_abort(tracker, study_spec):
                enqueued, done = enqueue_missing(study, study_spec)
                if exp.search is None and exp.adaptive is not None:
                    a = exp.adaptive
                    say(
                        f"study {study.study_name!r}: {len(exp.cells)} cells x "
                        f"{a['min']}..{a['max']} seeds (adaptive, decide: {a['decide']}), "
                        f"{done} already done, {enqueued} enqueued (held until a look releases "
                        f"them); {workers}"
                    )
                elif exp.search is None:
                    say(
                        f"study {study.study_name!r}: {exp.n_trials} trials "
                        f"({len(exp.cells)} cells x {len(exp.seeds)} seeds), {done} already "
                        f"done, {enqueued} enqueued; {workers}"
                    )
                else:
                    say(
                        f"study {study.study_name!r}: up to {exp.search.n_trials} trials x "
                        f"{len(exp.seeds)} seeds, {workers}"
                    )
                return _run_and_finish(study, study_spec, tracker, opts, done=done, say=say)
        except _Interrupted:
            say(INTERRUPTED_HINT)
            return 130


def _run_and_finish(
    study: optuna.Study,
    spec: StudySpec,
    tracker: Tracker,
    sweep_opts: SweepOptions,
    *,
    done: int,
    say: Callable[[str], None],
) -> int:
    """Run the workers of an opened study (grid or search), then finish it."""
    choice = sweep_opts.choice
    opts = WorkerOptions(
        study=study.study_name,
        storage=sweep_opts.storage,
        results_dir=sweep_opts.results_dir,
        tracking_uri=sweep_opts.tracking_uri,
        threads=1,  # one torch thread per run: results must not depend on the worker count
        cells_per_worker=sweep_opts.cells_per_worker,
    )
    fatal: list[OSError] = []
    killed: dict[int, str] = {}  # trial number -> why its worker was killed

    def on_event(e: dict[str, Any]) -> None:
        if e["event"] == "fatal":
            fatal.append(fatal_event_error(e))
        elif e["event"] == "killed" and e.get("trial") is not None:
            killed[int(e["trial"])] = f"worker killed: {e['reason']}"

    counts = run_workers(
        sweep_opts.launcher
        if sweep_opts.launcher is not None
        else make_launcher(choice.name, ray_address=choice.ray_address),
        sweep_opts.workers,
        opts,
        resources=Resources(
            devices=tuple(sweep_opts.device_list or ()), gpus=choice.gpus, cpus=choice.cpus
        ),
        total=progress_total(study, spec),
        done_before=done,
        fail_fast=sweep_opts.fail_fast,
        on_event=on_event,
        say=say,
    )
    if killed:  # recorded interrupted now, not left to the heartbeat: the next run resumes them
        close_killed_trials(study, spec, tracker, killed)
    if fatal:  # a worker found the disk full or a store gone: no report from a store that
        raise fatal[0]  # cannot take it

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM while finishing: close the parent run, as on Ctrl-C

    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        finished = finish_study(
            study,
            tracker,
            spec,
            command=sweep_opts.command,
            results_dir=sweep_opts.results_dir,
            write_report=sweep_opts.report,
        )
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if counts.get("interrupted_by_user"):
        say(INTERRUPTED_HINT)
        return 130
    if not finished.complete and spec.kind == "grid":
        return 1
    if not finished.completed:  # a search in which every trial failed (reasons printed above)
        return 1
    return 0


def close_killed_trials(
    study: optuna.Study, spec: StudySpec, tracker: Tracker, killed: dict[int, str]
) -> None:
    """Trials whose workers the coordinator killed (stuck past the stop's grace period): each
    still RUNNING is told FAIL with outcome 'interrupted' and the reason, and its MLflow run is
    ended KILLED with it, as the worker would have done had it stopped in time."""
    by_number = {t.number: t for t in with_retries(lambda: study.get_trials(deepcopy=False))}
    # A trial's attrs are set by id, outside an optuna Trial object.
    storage = storage_of(study)

    def interrupt(trial_id: int, number: int, reason: str) -> Any:
        storage.set_trial_user_attr(trial_id, "outcome", "interrupted")
        storage.set_trial_user_attr(trial_id, "reason", reason)
        study.tell(number, state=TrialState.FAIL)
        return storage.get_trial(trial_id)

    ended = []
    for number, reason in sorted(killed.items()):
        t = by_number.get(number)
        if t is None or t.state != TrialState.RUNNING:
            continue
        try:
            ended.append(with_retries(partial(interrupt, trial_id(t), number, reason)))
        except UpdateFinishedTrialError:
            continue  # judged stale and retried meanwhile: the retry closes its run
    end_orphaned_runs(tracker, spec, study.study_name, ended)


def progress_total(study: optuna.Study, spec: StudySpec) -> int:
    """The live bar's total: the trials the study may still run or has run.  An adaptive grid
    starts at cells x max less the seeds earlier runs' decisions cancelled, and the bar takes
    off each seed a decision cancels from then on (the workers' ``cancelled`` events), so it
    ends at done/done; a fixed grid and a search keep their total."""
    if spec.kind != "grid" or spec.adaptive is None:
        return int(spec.expected_trials)

    trials = with_retries(lambda: study.get_trials(deepcopy=False))
    return int(spec.expected_trials) - len(settled_keys(trials))


@contextlib.contextmanager
def _parent_closed_on_abort(tracker: Tracker, spec: StudySpec) -> Iterator[None]:
    """Ctrl-C/SIGTERM, a full disk or a removed store after the parent MLflow run was opened:
    end that run KILLED (where the store still takes it).  An interrupt becomes
    :class:`_Interrupted` (the command ends with exit 130 and the resume hint, no traceback); a
    full disk or a removed store propagates."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as err:
        if isinstance(err, KeyboardInterrupt):
            reason = "interrupted"
        elif (fatal := fatal_store_error(err)) is not None:
            reason = str(fatal)
        else:
            raise
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this
        try:
            close_parent(tracker, spec, reason)
        finally:
            signal.signal(signal.SIGINT, old)
        if isinstance(err, KeyboardInterrupt):
            raise _Interrupted from None
        raise


def close_parent(tracker: Tracker, spec: StudySpec, reason: str) -> None:
    """End the sweep's parent run KILLED with ``reason``, as far as the tracking store allows."""
    parent = spec.parent_run_id
    if not parent:
        return
    for call in (
        lambda: tracker.set_tags(parent, {OUTCOME_TAG: reason}),
        lambda: tracker.end_run(parent, "KILLED"),
    ):
        try:
            call()
        except Exception:
            pass  # a full disk may refuse it too; the next run of the command ends it
