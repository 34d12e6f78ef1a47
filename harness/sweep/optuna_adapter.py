"""Everything the harness needs from Optuna that its public API does not offer, in one place.

Optuna 4/5 keeps these behind underscores; each use below is pinned by
``tests/test_optuna_adapter.py``, so an Optuna upgrade that moves one fails there first, with
the name of what moved, instead of somewhere in a sweep:

* ``study._storage`` / ``study._study_id`` / ``FrozenTrial._trial_id`` — the storage calls a
  worker needs to claim an enqueued trial without ``Study.ask`` creating a new one
  (:func:`claim_waiting_trial`) and to beat a heartbeat outside ``Study.optimize``;
* ``optuna.storages._heartbeat.BaseHeartbeat`` — the heartbeat protocol, which Optuna 5.0
  implements only for ``RDBStorage``; :class:`HeartbeatJournalStorage` adds it to the journal.

Importing this module imports Optuna (and SQLAlchemy); ``harness.sweep.storage`` imports it only
when a storage is built.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from harness.db import is_transient_db_error, short_reason

_logger = logging.getLogger(__name__)

HEARTBEAT_ATTR = "harness:heartbeat"
StaleTrialCallback = Callable[[optuna.Study, FrozenTrial], None]


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage object a loaded study talks to (``study._storage``)."""
    return study._storage  # type: ignore[no-any-return]


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage-wide id of a trial (``_trial_id``; ``number`` is only unique per study)."""
    return int(trial._trial_id)


def heartbeat_interval_of(storage: Any) -> int | None:
    """Seconds between beats if ``storage`` implements Optuna's heartbeat protocol, else None."""
    if not isinstance(storage, BaseHeartbeat):
        return None
    return storage.get_heartbeat_interval()


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """``JournalStorage`` plus Optuna's heartbeat protocol (absent from Optuna 5.0).

    A beat is the trial system attr ``harness:heartbeat = {"trial_id": id, "time": t}`` (one
    short journal line per interval). A RUNNING trial is stale when neither its last beat nor
    its start is younger than the grace period; a trial that never beat is never stale, as in
    ``RDBStorage``. The beat names its trial id because ``RetryHeartbeatStaleTrialCallback``
    copies system attrs into the retry, and the copy's old beat must not make the fresh retry
    look stale.
    """

    def __init__(
        self,
        log_storage: Any,
        *,
        heartbeat_interval: int,
        grace_period: int | None = None,
        heartbeat_stale_trial_callback: StaleTrialCallback | None = None,
    ) -> None:
        super().__init__(log_storage)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        beat = {"trial_id": trial_id, "time": time.time()}
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, beat)
        except UpdateFinishedTrialError:
            pass  # another worker judged it stale; our tell will be refused, nothing to do

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        grace = self.grace_period or 4 * self.heartbeat_interval
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT_ATTR)
            if not isinstance(beat, dict) or beat.get("trial_id") != trial_id(trial):
                continue
            last = float(beat["time"])
            if trial.datetime_start is not None:  # naive local time, as replayed
                last = max(last, trial.datetime_start.timestamp())
            if now - last > grace:
                stale.append(trial_id(trial))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> StaleTrialCallback | None:
        return self.heartbeat_stale_trial_callback


class ResilientRDBStorage(RDBStorage):
    """``RDBStorage`` with a heartbeat that survives outages and exclusive SQLite pops.

    Heartbeat: Optuna's heartbeat thread dies on the first exception, after which the live trial
    looks stale to every other worker and is failed and retried. Missing a beat while the server
    restarts is harmless, so the error is logged instead.

    SQLite: ``RDBStorage`` pops a WAITING trial with ``SELECT ... FOR UPDATE``, which SQLite
    ignores, and pysqlite runs that SELECT outside any transaction; two processes can then both
    read WAITING and both "win" the same trial (seen in the 4-worker contract test: "Cannot
    tell a COMPLETE trial"). Starting every transaction with ``BEGIN IMMEDIATE`` takes SQLite's
    write lock up front, which serialises the read-check-write and makes the pop exclusive, as
    on PostgreSQL.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._begin_immediately_on_sqlite()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # rebuilds the engine, without our listener
        self._begin_immediately_on_sqlite()

    def _begin_immediately_on_sqlite(self) -> None:
        if self.engine.dialect.name != "sqlite":
            return
        from sqlalchemy import event

        def begin_immediate(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(self.engine, "begin", begin_immediate)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except Exception as error:
            if not is_transient_db_error(error):
                raise
            message = short_reason(error, self.url)
            _logger.warning("heartbeat of trial %d missed: %s", trial_id, message)


# --------------------------------------------------------------------------------------------
# Worker primitives: take only enqueued trials, keep them alive, recover dead workers' trials.


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail trials of dead workers and re-enqueue them (``optuna.storages.fail_stale_trials``).

    Call it before claiming each trial, as ``Study.optimize`` does. Exactly one worker wins the
    FAIL of a given stale trial, so each stale trial is re-enqueued once.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def claim_waiting_trial(study: optuna.Study) -> optuna.Trial | None:
    """Atomically move one WAITING (enqueued) trial to RUNNING for this worker, or return None.

    Unlike ``Study.ask``, this never creates a new trial when the queue is empty, so a grid
    worker that loses the race for the last cell does not add a stray sampler trial. It is the
    loop of Optuna's ``Study._pop_waiting_trial_id``: the storage lets exactly one process win
    the WAITING -> RUNNING transition. Finish the trial with ``study.tell(trial, ...)``.
    """
    storage = storage_of(study)
    for frozen in storage.get_all_trials(
        study._study_id, deepcopy=False, states=(TrialState.WAITING,)
    ):
        try:
            if storage.set_trial_state_values(trial_id(frozen), state=TrialState.RUNNING):
                if heartbeat_interval_of(storage) is not None:
                    # A trial that never beat is never judged stale: beat at once, so a worker
                    # killed before its heartbeat thread starts still has its trial recovered.
                    storage.record_heartbeat(trial_id(frozen))  # type: ignore[attr-defined]
                return optuna.Trial(study, trial_id(frozen))
        except UpdateFinishedTrialError:
            continue
    return None


def frozen_trial(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    """The stored state of a live trial (``Trial.user_attrs`` may be a cached copy)."""
    return storage_of(study).get_trial(trial_id(trial))


@contextmanager
def heartbeat(
    study: optuna.Study,
    trial: optuna.Trial,
    on_error: Callable[[BaseException], bool] | None = None,
) -> Iterator[None]:
    """Beat for ``trial`` every ``heartbeat_interval`` seconds while the block runs.

    The same as the thread ``Study.optimize`` runs, for workers that claim trials themselves.
    A storage without heartbeat makes this a no-op. Beat errors are never raised: each goes to
    ``on_error`` (from the heartbeat thread), and is logged unless that returns True.
    """
    storage = storage_of(study)
    interval = heartbeat_interval_of(storage)
    if interval is None:
        yield
        return
    stop = threading.Event()
    tid = trial_id(trial)

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(tid)  # type: ignore[attr-defined]
            except Exception as error:  # a missed beat is harmless; a dead thread is not
                if on_error is None or not on_error(error):
                    _logger.warning("heartbeat of trial %d missed: %s", trial.number, error)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
