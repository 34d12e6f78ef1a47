"""One training run recorded in a tracker: params, tags, the resolved config, step metrics and
the final summaries.  Shared by ``harness run`` and the sweep workers."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack

import yaml

from harness.config import RunConfig
from harness.core.configtools import flatten, to_dict
from harness.core.fsutil import disk_full_message, is_disk_full
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


class Terminated(KeyboardInterrupt):
    """A termination signal (SIGTERM, SIGHUP) reached ``harness run``: handled as Ctrl-C is, so
    the run is closed KILLED with this as its reason instead of the process vanishing with its
    tracked run left RUNNING."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def interrupt_reason(err: KeyboardInterrupt) -> str:
    """The reason recorded for an interrupted run."""
    return str(err) if isinstance(err, Terminated) else "interrupted by SIGINT (Ctrl-C)"


@dataclass
class StopRequest:
    """What a termination signal asked of the run in a :func:`signals_interrupt` block.

    Why a record and not only the exception the handler raises: Python runs a signal's handler
    in whatever Python code the main thread is executing, and an exception raised inside a gc
    callback (``gc.callbacks``: SQLAlchemy registers one), a ``__del__`` or a weakref finalizer
    is printed and dropped, never raised.  The run would train on with the signal lost.  The
    record survives that: the training loop asks :meth:`check` before every step."""

    signum: int | None = None  # the first signal, once one arrived
    closing: bool = False  # the run is being recorded: a signal no longer interrupts it

    def check(self) -> bool:
        """The loop's ``should_stop`` (asked before every step): raises :class:`Terminated`
        once a signal arrived, wherever its own exception went; False until then."""
        if self.signum is not None:
            raise Terminated(self.signum)
        return False


_active: StopRequest | None = None  # the StopRequest of the signals_interrupt block in force


def _closing() -> None:
    """The run is being recorded: from here a signal is recorded, not raised (a second
    ``Terminated`` raised inside the recording would leave the run RUNNING)."""
    if _active is not None:
        _active.closing = True


@contextlib.contextmanager
def signals_interrupt(
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[StopRequest]:
    """While in this block, each of ``signals`` is recorded in the yielded :class:`StopRequest`
    and raises :class:`Terminated` in the main thread (wherever it waits: in a reward call, a
    store write, a kernel launch).  Where Python drops that exception (the signal arrived inside
    a gc callback), the record stops the run at the next step (pass ``check`` as the loop's
    ``should_stop``), one line says so, and a second signal raises again.  Once the run is being
    recorded (``close_failed_run``, ``finish_tracked_run``) a signal no longer raises, so that
    the recording is not cut short (SIGKILL still ends the process).  The previous handlers come
    back on the way out.  Off the main thread only the record is yielded: only the main thread
    can take a signal, and there the caller's handlers stay."""
    global _active
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: object) -> None:
        if stop.signum is None:
            stop.signum = signum
        if not stop.closing:
            raise Terminated(stop.signum)

    def unraisable(info: Any) -> None:
        if not isinstance(info.exc_value, Terminated):
            previous_hook(info)
            return
        name = signal.Signals(info.exc_value.signum).name
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"{name} arrived while Python ran a callback that cannot raise (a gc callback, "
                f"a finalizer): the run stops before its next step ({name} again stops it now)\n"
            )
            sys.stderr.flush()

    previous = {s: signal.signal(s, handler) for s in signals}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    outer, _active = _active, stop
    try:
        yield stop
    finally:
        _active = outer
        sys.unraisablehook = previous_hook
        for s, old in previous.items():
            signal.signal(s, old)


def close_failed_run(tracker: Tracker, rid: str, err: BaseException) -> None:
    """End a run whose training (or recording) raised ``err``, keeping ``err`` the one raised.

    A full disk, Ctrl-C or a termination signal interrupts the run (KILLED, resumable); any
    other error, ``sys.exit`` included, fails it (FAILED, with the reason).  Closing is best effort: on a full disk the tracking store may
    refuse it too, and that second error must not hide the first.
    """
    if is_disk_full(err):
        status: RunStatus = "KILLED"
        tags = {"run.status": "interrupted", "run.reason": disk_full_message(err)}
    elif isinstance(err, KeyboardInterrupt):
        status = "KILLED"
        tags = {"run.status": "interrupted", "run.reason": interrupt_reason(err)}
    else:
        status = "FAILED"
        tags = {"run.status": "failed", "run.reason": f"{type(err).__name__}: {err}"[:500]}
    _closing()
    try:
        tracker.set_tags(rid, tags)
    except Exception:
        pass  # the status below matters more than the reason
    try:
        tracker.end_run(rid, status)
    except Exception:
        pass  # left RUNNING: the next attempt of its trial closes it (sweep.scheduler.trials.end_orphaned_runs)


def finish_tracked_run(tracker: Tracker, rid: str, result: RunResult) -> None:
    """Final summaries, tags and status: FINISHED, FAILED (diverged, or a packed run that
    failed alone: the reason tagged) or KILLED."""
    _closing()
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
        "failed": "FAILED",  # a packed run's error: it ended alone, the pack went on
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
