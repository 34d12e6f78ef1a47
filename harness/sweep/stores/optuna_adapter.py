"""Everything the harness needs from Optuna that its public API does not offer, in one place.

Optuna 4/5 keeps these behind underscores; each use below is pinned by
``tests/sweep/stores/test_optuna_adapter.py``, so an Optuna upgrade that moves one fails there
first, with the name of what moved, instead of somewhere in a sweep:

* ``study._storage`` / ``study._study_id`` / ``FrozenTrial._trial_id`` — the storage calls a
  worker needs to claim an enqueued trial without ``Study.ask`` creating a new one
  (:func:`claim_waiting_trial`) and to beat a heartbeat outside ``Study.optimize``;
* ``optuna.storages._heartbeat.BaseHeartbeat`` — the heartbeat protocol, which Optuna 5.0
  implements only for ``RDBStorage``; :class:`HeartbeatJournalStorage` adds it to the journal.

Importing this module imports Optuna (and SQLAlchemy); ``harness.sweep.stores.storage`` imports it only
when a storage is built.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import FrozenTrial, TrialState

from harness.core.db import is_transient_db_error, outage_budget_s, short_reason, with_retries

_logger = logging.getLogger(__name__)

HEARTBEAT_ATTR = "harness:heartbeat"
TRANSITION_ATTR = "harness:transition"  # token of the last state write (ResilientRDBStorage)
CREATED_ATTR = "harness:created"  # token of the write that created the trial
_R = TypeVar("_R")
StaleTrialCallback = Callable[[optuna.Study, FrozenTrial], None]


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage object a loaded study talks to (``study._storage``)."""
    return study._storage  # type: ignore[no-any-return]


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage-wide id of a trial (``_trial_id``; ``number`` is only unique per study)."""
    return int(trial._trial_id)


def heartbeat_interval_of(storage: BaseStorage) -> int | None:
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
        log_storage: BaseJournalBackend,
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
    """``RDBStorage`` that rides out database outages without losing or repeating a write.

    Outages. Every storage call is retried through a lost or refused connection for up to
    ``outage_s`` seconds (:func:`harness.core.db.outage_budget_s`), then raises
    :class:`~harness.core.db.StorageUnavailable`, which no caller retries again. Retrying is safe
    only for writes that a second try leaves as one did, and three of Optuna's are not: a
    commit can land on the server while its reply is lost, and the retry then acts twice. So
    each of those writes carries a token of its own, and a retry first reads back whether the
    last try landed:

    * ``set_trial_state_values`` (a claim WAITING -> RUNNING, a tell, a stale trial's FAIL)
      writes ``harness:transition = token`` in the same transaction. Without it a retried claim
      finds the trial RUNNING, takes the next one, and leaves the first RUNNING with no worker
      and no heartbeat (never stale, so the sweep waits for ever); a retried tell is refused
      ("Cannot tell a COMPLETE trial") and kills the worker; a retried stale FAIL is refused,
      so the trial's retry copy is never enqueued and its cell is lost.
    * ``create_new_trial`` (``enqueue_trial``, ``ask``, the stale-trial retry copy) writes
      ``harness:created = token``; a retry returns the trial that landed instead of adding one.
    * ``create_new_study`` after a landed try reads the study id instead of failing.

    A claim also writes the trial's first heartbeat in its transaction: a worker that dies
    right after claiming leaves a trial that goes stale, instead of one that never beat.

    Heartbeat: Optuna's heartbeat thread dies on the first exception, after which the live trial
    looks stale to every other worker and is failed and retried. Missing a beat while the server
    restarts is harmless, so the error is logged instead, and a beat is never retried.

    SQLite: ``RDBStorage`` pops a WAITING trial with ``SELECT ... FOR UPDATE``, which SQLite
    ignores, and pysqlite runs that SELECT outside any transaction; two processes can then both
    read WAITING and both "win" the same trial (seen in the 4-worker contract test: "Cannot
    tell a COMPLETE trial"). Starting every transaction with ``BEGIN IMMEDIATE`` takes SQLite's
    write lock up front, which serialises the read-check-write and makes the pop exclusive, as
    on PostgreSQL.
    """

    def __init__(self, url: str, *, outage_s: float | None = None, **kwargs: Any) -> None:
        self.outage_s = outage_budget_s() if outage_s is None else outage_s
        super().__init__(url, **kwargs)
        self._begin_immediately_on_sqlite()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # rebuilds the engine, without our listener
        self._begin_immediately_on_sqlite()

    def _begin_immediately_on_sqlite(self) -> None:
        if self.engine.dialect.name != "sqlite":
            return
        from sqlalchemy import event  # noqa: PLC0415 - SQLAlchemy: only for a PostgreSQL study

        def begin_immediate(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(self.engine, "begin", begin_immediate)

    def _retry(self, fn: Callable[[], _R]) -> _R:
        return with_retries(fn, base_delay=0.25, max_delay=5.0, budget_s=self.outage_s)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except Exception as error:
            if not is_transient_db_error(error):
                raise
            message = short_reason(error, self.url)
            _logger.warning("heartbeat of trial %d missed: %s", trial_id, message)

    # -- the three writes a retry could repeat ------------------------------------------------

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        token = uuid.uuid4().hex
        tried = False

        def attempt() -> bool:
            nonlocal tried
            if tried:  # the last try may have committed without its reply reaching us
                landed = RDBStorage.get_trial(self, trial_id)
                if landed.system_attrs.get(TRANSITION_ATTR) == token:
                    return True
            tried = True
            return self._set_state_once(trial_id, state, values, token)

        return self._retry(attempt)

    def _set_state_once(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None, token: str
    ) -> bool:
        """Optuna's ``set_trial_state_values`` plus the token (and a claim's first heartbeat)
        in the same transaction."""
        import sqlalchemy.exc as sa_exc  # noqa: PLC0415 - SQLAlchemy: only for a PostgreSQL study
        from optuna.storages._rdb import models  # noqa: PLC0415 - SQLAlchemy: only for a PostgreSQL study
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: PLC0415 - SQLAlchemy: only for a PostgreSQL study

        try:
            with _create_scoped_session(self.scoped_session) as session:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
                self.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[arg-type]
                if state == TrialState.RUNNING and trial.state != TrialState.WAITING:
                    return False
                # Before the state changes: Optuna refuses attrs on a finished trial.
                self._set_trial_attr_without_commit(
                    session, models.TrialSystemAttributeModel, trial_id, TRANSITION_ATTR, token
                )
                if values is not None:
                    for objective, v in enumerate(values):
                        self._set_trial_value_without_commit(session, trial, objective, v)
                trial.state = state
                if state == TrialState.RUNNING:
                    trial.datetime_start = datetime.now()
                    if models.TrialHeartbeatModel.where_trial_id(trial_id, session) is None:
                        session.add(models.TrialHeartbeatModel(trial_id=trial_id))
                if state.is_finished():
                    trial.datetime_complete = datetime.now()
        except sa_exc.IntegrityError:
            return False
        return True

    def _create_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None = None
    ) -> FrozenTrial:
        # The private method, because Optuna's study cache (``_CachedStorage``) calls it.
        token = uuid.uuid4().hex
        if template_trial is None:  # what RDBStorage makes of no template: a fresh RUNNING trial
            template = FrozenTrial(
                number=-1,
                state=TrialState.RUNNING,
                value=None,
                datetime_start=datetime.now(),
                datetime_complete=None,
                params={},
                distributions={},
                user_attrs={},
                system_attrs={},
                intermediate_values={},
                trial_id=-1,
            )
        else:
            template = copy.deepcopy(template_trial)
        template.system_attrs = {**template.system_attrs, CREATED_ATTR: token}
        tried = False

        def attempt() -> FrozenTrial:
            nonlocal tried
            if tried:
                for trial in RDBStorage.get_all_trials(self, study_id, deepcopy=False):
                    if trial.system_attrs.get(CREATED_ATTR) == token:
                        return trial
            tried = True
            return RDBStorage._create_new_trial(self, study_id, template)

        return self._retry(attempt)

    def create_new_study(
        self, directions: Sequence[optuna.study.StudyDirection], study_name: str | None = None
    ) -> int:
        tried = False

        def attempt() -> int:
            nonlocal tried
            try:
                return RDBStorage.create_new_study(self, directions, study_name)
            except optuna.exceptions.DuplicatedStudyError:
                if tried and study_name is not None:  # our own earlier try landed
                    return RDBStorage.get_study_id_from_name(self, study_name)
                raise
            finally:
                tried = True

        return self._retry(attempt)


def _retrying(name: str) -> Callable[..., Any]:
    """A method of ``ResilientRDBStorage`` that retries ``RDBStorage.<name>`` through outages:
    for reads, and for writes that a second try leaves as one did (upserts, and inserts whose
    duplicate Optuna ignores)."""
    base = getattr(RDBStorage, name)

    @functools.wraps(base)
    def method(self: ResilientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._retry(lambda: base(self, *args, **kwargs))

    return method


_IDEMPOTENT = (
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "get_all_studies",
    "set_trial_param",
    "_set_trial_param",
    "get_trial_param",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial",
    "get_all_trials",
    "get_n_trials",
    "get_best_trial",
    "_get_best_trial_id",
    "_get_trials",
    "_get_stale_trial_ids",
)
# Optuna's study cache (``_CachedStorage``) calls some of the private ones directly.
for _name in _IDEMPOTENT:
    setattr(ResilientRDBStorage, _name, _retrying(_name))


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


def claim_waiting_trial(
    study: optuna.Study,
    accept: Callable[[FrozenTrial], bool] | None = None,
    order: Callable[[FrozenTrial], Any] | None = None,
) -> optuna.Trial | None:
    """Atomically move one WAITING (enqueued) trial to RUNNING for this worker, or return None.
    ``accept`` skips the WAITING trials it refuses (an adaptive grid's held seeds); ``order``
    is the key the candidates are tried in (default: enqueue order).

    Unlike ``Study.ask``, this never creates a new trial when the queue is empty, so a grid
    worker that loses the race for the last cell does not add a stray sampler trial. It is the
    loop of Optuna's ``Study._pop_waiting_trial_id``: the storage lets exactly one process win
    the WAITING -> RUNNING transition. Finish the trial with ``study.tell(trial, ...)``.
    """
    storage = storage_of(study)
    waiting = storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,))
    if order is not None:
        waiting = sorted(waiting, key=order)
    for frozen in waiting:
        if accept is not None and not accept(frozen):
            continue
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
