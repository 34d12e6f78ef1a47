"""A pack: grid trials one worker trains together on one base model (``--cells-per-worker K``).

The worker claims a trial as always; :func:`run_grid_pack` claims up to K - 1 packmates
(:func:`harness.sweep.scheduler.packs.claim_packmates`: WAITING trials whose configs share its
base fields, the seed included) and trains them with :func:`harness.run.packing.run_packed`.
Each trial stays itself:

* its own Optuna trial, with its own heartbeat (a worker killed mid-pack leaves every trial of
  the pack to go stale, and each is retried once, as an unpacked trial is);
* its own MLflow child run, started, logged and closed by :mod:`harness.run.tracked` exactly as
  an unpacked trial's (the same identity, tags, params, config and summaries);
* its own ``start``, ``step`` and ``done`` events and the same attributes and outcome as an
  unpacked trial (:func:`harness.sweep.launching.trial.record_grid_result`); its ``wall_time``
  is its own turns and its share of what the pack set up once.

How trials end: one that diverges ends alone (``diverged``); one that raises ends alone, its run
FAILED, its trial an ``error`` (retried within ``--max-retries``); a stop (SIGTERM, Ctrl-C at the
coordinator, fail-fast) interrupts every trial of the pack, each told FAIL ``interrupted`` and
resumed by the next run.  A full disk or a removed store met by any trial stops the whole pack,
and the worker records every trial of it as interrupted (``worker_loop``).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.core.db import with_retries
from harness.core.fsutil import fatal_store_error
from harness.sweep.launching.trial import (
    ClaimedTrial,
    record_grid_result,
    retry_errored,
    run_grid_trial,
)
from harness.sweep.scheduler.labels import label_trial
from harness.sweep.scheduler.packs import PackKeys, claim_packmates
from harness.sweep.scheduler.study import trial_key
from harness.sweep.scheduler.trials import end_orphaned_runs, ended_attempts
from harness.sweep.stores.optuna_adapter import frozen_trial, heartbeat

if TYPE_CHECKING:
    from harness.run.scaffold import Hooks, RunResult


PACK_TAG = "harness.pack"  # the Optuna trial numbers of the pack a run trained in, "3,4"


@dataclass
class Member:
    """One trial of the pack: its claim, (cell or a search point's label, seed), attributes and,
    once started, its run."""

    t: ClaimedTrial
    attrs: dict[str, Any]
    cell: str
    seed: int
    cfg: Any = None
    rid: str | None = None
    outcome: str | None = None


def run_grid_pack(
    first: ClaimedTrial, k: int, keys: PackKeys, pack: list[ClaimedTrial]
) -> list[str]:
    """Claim up to ``k - 1`` packmates of the claimed grid trial ``first``, train them all on
    one base model and tell Optuna how each ended; returns their outcomes (``first``'s first).
    Without a packmate ``first`` trains as an unpacked trial (``run_grid_trial``).
    ``pack`` gets every claimed trial as it is claimed (``first`` included), so that the worker
    can record them all as interrupted if the pack stops on a full disk."""
    pack.append(first)
    members: list[Member] = []
    with ExitStack() as beats:
        beats.enter_context(heartbeat(first.study, first.trial, on_error=first.beat_failed))
        attrs = with_retries(lambda: frozen_trial(first.study, first.trial)).user_attrs
        key = (str(attrs["cell"]), int(attrs["seed"]))
        for trial in claim_packmates(first.study, first.spec, key, k, keys):
            mate = first.sibling(trial)
            pack.append(mate)
            beats.enter_context(heartbeat(mate.study, mate.trial, on_error=mate.beat_failed))
        if len(pack) > 1:
            members = [_prepare(t) for t in pack]
            train_pack(members, pack, config=_cell_config, record=_record, fail=_fail)
    if not members:  # no packmate (or a trial that cannot pack): the unpacked path
        return [run_grid_trial(first)]
    if any(t.fatal is not None for t in pack):
        return []  # the worker records every trial of the pack as interrupted
    return [m.outcome or "interrupted" for m in members]


def _prepare(t: ClaimedTrial) -> Member:
    """A claimed trial's (cell, seed), its dashboard params, and the runs its earlier attempts
    left RUNNING closed (as ``run_grid_trial`` does)."""
    attrs = dict(with_retries(lambda: frozen_trial(t.study, t.trial)).user_attrs)
    cell, seed = str(attrs["cell"]), int(attrs["seed"])
    label_trial(t.study, t.trial, t.spec, cell, seed)
    earlier = ended_attempts(t.study, t.trial, lambda o: trial_key(o) == (cell, seed))
    end_orphaned_runs(t.tracker, t.spec, t.study.study_name, earlier)
    return Member(t, attrs, cell, seed)


def _cell_config(m: Member) -> Any:
    t = m.t
    return t.spec.cell_config(m.cell, m.seed, device=t.opts.device, threads=t.opts.threads)


def _fail(m: Member, err: BaseException) -> str:
    """A grid trial that raised: an error, retried within ``--max-retries``."""
    return retry_errored(m.t, m.t.fail_with_error(err, m.cell, m.seed), m.attrs)


def train_pack(
    members: list[Member],
    pack: list[ClaimedTrial],
    *,
    config: Callable[[Member], Any],
    record: Callable[[Member, RunResult], str | None],
    fail: Callable[[Member, BaseException], str],
) -> None:
    """Start each member's tracked run (its config from ``config``), train the started ones
    as one pack, and record each (``record``, with its closed run's result; its outcome, or
    None for a search point that goes on to its next seed); a member that raises, or a pack
    that fails as a whole, ends with ``fail``.  Sets each member's ``outcome``."""
    from harness.run.packing import run_packed  # noqa: PLC0415 - loads the training stack: only in a running worker
    from harness.run.tracked import close_failed_run, finish_tracked_run, start_tracked_run  # noqa: PLC0415 - loads torch: only in a running worker

    live: list[Member] = []
    # Which Optuna trials trained together, on each run (the runs are otherwise an unpacked
    # trial's): the report and MLflow can tell a pack's runs apart from lone ones.
    together = ",".join(str(m.t.trial.number) for m in members)
    for m in members:
        t = m.t
        try:
            m.cfg = config(m)
            t.event("start", cell=m.cell, seed=m.seed, steps=m.cfg.steps, pid=os.getpid(),
                    packed=len(members))  # fmt: skip
            identity = t.identity(m.cell, m.seed)
            identity["tags"] = {**(identity.get("tags") or {}), PACK_TAG: together}
            m.rid = t.run_id = start_tracked_run(m.cfg, t.tracker, **identity)
        except Exception as err:  # this trial cannot start (as run_grid_trial records it)
            if fatal_store_error(err) is not None:
                raise  # not this trial's fault: the worker stops and interrupts the pack
            m.outcome = fail(m, err)
        else:
            live.append(m)
    if not live:
        return
    hooks = [_hooks(m, pack) for m in live]
    label = " + ".join(m.cell for m in live)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            results = run_packed([m.cfg for m in live], hooks)
        except BaseException as err:  # the pack itself failed (its base did not load, ...)
            for m in live:
                assert m.rid is not None
                close_failed_run(m.t.tracker, m.rid, err)
            if isinstance(err, Exception) and fatal_store_error(err) is None:
                for m in live:
                    m.outcome = fail(m, err)
                return
            raise
        finally:
            # Which trial raised a warning is not known (they take turns in one process): each
            # is said once, for the pack.
            for w in caught:
                live[0].t.event("warning", cell=label, seed=live[0].seed, message=str(w.message))
    if any(t.fatal is not None for t in pack):
        return  # a full disk or a removed store: the worker interrupts every trial
    for m, result in zip(live, results, strict=True):
        assert m.rid is not None
        try:
            finish_tracked_run(m.t.tracker, m.rid, result)
        except BaseException as err:  # the summaries could not be written (a full disk)
            close_failed_run(m.t.tracker, m.rid, err)
            raise
        m.outcome = record(m, result)


def _hooks(m: Member, pack: list[ClaimedTrial]) -> Hooks:
    """The trial's hooks for ``run_packed``: its steps logged to its own run and sent as its
    events; a stop asked of the worker, or a full disk met by any trial, stops the pack."""
    t, rid = m.t, m.rid
    assert rid is not None

    def on_metrics(step: int, metrics: dict[str, Any]) -> None:
        try:
            t.tracker.log_metrics(rid, metrics, step)
        except Exception as err:
            fatal = fatal_store_error(err)
            if fatal is not None:
                t.fatal = t.fatal or fatal
            raise  # this trial fails; a fatal error also stops the others (should_stop)
        t.event("step", step=step + 1, reward=metrics.get("objective/reward", math.nan))

    def should_stop() -> bool:
        return any(x.should_stop() for x in pack)

    return {"on_metrics": on_metrics, "should_stop": should_stop, "results_dir": t.opts.results_dir}


def _record(m: Member, result: RunResult) -> str:
    """Tell Optuna how the member's run ended: as an unpacked trial's, or, for a run that failed
    alone (its error caught by the pack), as an ``error`` with the run's reason."""
    t, rid = m.t, m.rid
    assert rid is not None
    # Its own turns and its share of what the pack set up once: a study's total wall counts
    # the pack's once, not once per trial.
    wall_s = result.wall_time
    if result.status != "failed":
        return record_grid_result(t, m.cell, m.seed, result, rid, wall_s)
    attrs = {"outcome": "error", "reason": result.reason, "run_id": rid, "wall_time": wall_s}
    if not t.set_attrs(attrs) or not t.tell(state="FAIL"):
        return t.superseded(rid, m.cell, m.seed)
    t.event("done", cell=m.cell, seed=m.seed, outcome="error", reason=result.reason)
    return retry_errored(t, "error", m.attrs)
