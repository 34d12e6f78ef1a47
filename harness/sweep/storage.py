"""Optuna storages for sweeps, with dead-worker detection on every backend we accept.

Which storage (Optuna's own decision tree):

* one machine, several processes: ``JournalStorage`` over a file (the default,
  ``results/optuna-journal.log``; about 3 ms per trial, against about 42 ms for SQLite RDB);
* several machines: ``RDBStorage`` over PostgreSQL;
* ``sqlite:///`` RDB is accepted, but Optuna itself "would never recommend SQLite3 for parallel
  optimization": stock ``RDBStorage`` on SQLite hands the same enqueued trial to two processes
  (measured: 3-5 double claims per 40 trials with 4 workers). :class:`ResilientRDBStorage`
  fixes that with ``BEGIN IMMEDIATE`` transactions (0 in the same test). Its heartbeat
  timestamps have 1 s resolution.

``postgresql://`` URLs are passed on as ``postgresql+psycopg2://``: SQLAlchemy 2.1 made psycopg 3
the default driver, and the harness installs psycopg2 (see :func:`sqlalchemy_url`).

Dead workers. Optuna 5.0 implements the heartbeat (``BaseHeartbeat``) only for ``RDBStorage``:
a thread in the worker refreshes a timestamp every ``heartbeat_interval`` seconds, and before
each new trial ``optuna.storages.fail_stale_trials`` marks RUNNING trials whose timestamp is
older than ``grace_period`` (here 4 intervals by default) FAIL and hands them to the
``heartbeat_stale_trial_callback`` — here ``RetryHeartbeatStaleTrialCallback``, which enqueues
a WAITING copy (same params and user attrs, ``failed_trial`` and ``retry_history`` in its system
attrs) for any worker to take. ``JournalStorage`` has no heartbeat in Optuna 5.0, so
:class:`HeartbeatJournalStorage` adds one: the timestamp is a trial system attr written to the
journal, and staleness is judged on the local clock (the journal is for one host).

The heartbeat runs inside ``Study.optimize`` only. A worker that takes enqueued trials itself
(to never create a trial that was not enqueued) uses :func:`claim_waiting_trial`,
:func:`heartbeat` and :func:`fail_stale_trials` — the same three steps ``optimize`` performs.

Outages. ``engine_kwargs={"pool_pre_ping": True}`` replaces pooled connections that a restarted
PostgreSQL server dropped, so the first call after the restart succeeds; calls made while the
server is down raise and are retried by :func:`with_retries`. The heartbeat itself swallows
such errors (a missed beat is harmless, a dead heartbeat thread would get a live trial failed).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from harness.redact import redact_text, redact_url, url_password

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")

JOURNAL_FILE = "optuna-journal.log"
HEARTBEAT_ATTR = "harness:heartbeat"
DEFAULT_MAX_RETRY = 3
CONNECT_TIMEOUT_S = 5
ALLOWED = "journal (default), sqlite:///PATH, postgresql://USER:PASSWORD@HOST:PORT/DB"

StaleTrialCallback = Callable[["optuna.Study", "FrozenTrial"], None]


def make_storage(
    url: str | None,
    results_dir: Path,
    *,
    heartbeat_interval: int = 10,
    grace_period: int | None = None,
    failed_trial_callback: StaleTrialCallback | None = None,
    max_retry: int | None = DEFAULT_MAX_RETRY,
) -> BaseStorage:
    """Build the Optuna storage for a ``--storage`` value, with heartbeat and stale-trial retry.

    Args:
        url: ``None`` or ``"journal"`` for ``JournalStorage`` over
            ``results_dir/optuna-journal.log``; ``sqlite:///PATH`` or ``postgresql://...``
            (``postgresql+DRIVER://`` too) for ``RDBStorage``.
        results_dir: Directory of the journal file (created if missing).
        heartbeat_interval: Seconds between heartbeats of a running trial.
        grace_period: Seconds without a heartbeat after which a RUNNING trial is stale;
            ``None`` means ``4 * heartbeat_interval``: Optuna's default of 2 intervals
            failed live trials on a loaded 2-core machine, where a beat can be late by seconds.
        failed_trial_callback: Called with each stale trial once it is marked FAIL (Optuna's
            ``heartbeat_stale_trial_callback``; ``failed_trial_callback`` is its deprecated
            Optuna name, kept here for the harness API). Default:
            ``RetryHeartbeatStaleTrialCallback(max_retry=max_retry)``.
        max_retry: How many times the default callback re-enqueues the same stale trial;
            ``None`` retries forever.

    Raises:
        ValueError: For an unknown scheme, an unwritable journal, or an unreachable database
            (after at most ``CONNECT_TIMEOUT_S`` seconds), with any password redacted.
    """
    import optuna

    if heartbeat_interval < 1:
        raise ValueError(f"storage: heartbeat_interval must be >= 1 s; got {heartbeat_interval}")
    callback = failed_trial_callback or default_stale_trial_callback(max_retry)
    heartbeat: dict[str, Any] = {
        "heartbeat_interval": heartbeat_interval,
        "grace_period": grace_period if grace_period is not None else 4 * heartbeat_interval,
        "heartbeat_stale_trial_callback": callback,
    }
    if url is None or url == "journal":
        return _journal_storage(results_dir / JOURNAL_FILE, heartbeat)

    scheme = urlsplit(url).scheme.split("+", 1)[0] if "://" in url else ""
    if scheme == "sqlite" and url.startswith("sqlite:///"):
        # The timeout is SQLite's busy wait: writers queue instead of failing with "locked".
        # isolation_level=None hands transaction control to SQLAlchemy, so that
        # ResilientRDBStorage can begin every transaction with BEGIN IMMEDIATE (see there).
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 30, "isolation_level": None}}
    elif scheme == "postgresql":
        engine_kwargs = {
            "pool_pre_ping": True,
            "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S},
        }
        reason = database_connect_error(url, timeout=CONNECT_TIMEOUT_S)
        if reason is not None:
            raise ValueError(f"storage: cannot connect to {redact_url(url)} ({reason})")
    else:
        raise ValueError(
            f"storage: scheme '{scheme or redact_url(url)}' is not supported ({ALLOWED})"
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return _resilient_rdb_class()(
                sqlalchemy_url(url), engine_kwargs=engine_kwargs, **heartbeat
            )
        except Exception as error:  # schema creation or version check against a bad database
            reason = _short_reason(error, url)
            raise ValueError(f"storage: cannot use {redact_url(url)} ({reason})") from None


def default_stale_trial_callback(max_retry: int | None = DEFAULT_MAX_RETRY) -> StaleTrialCallback:
    """``RetryHeartbeatStaleTrialCallback(max_retry)``, without its ExperimentalWarning."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def _journal_storage(path: Path, heartbeat: dict[str, Any]) -> BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        # The symlink lock (Optuna's default, made explicit) is atomic on local filesystems and
        # NFS; a lock left by a killed process is broken after its 30 s grace period.
        backend = JournalFileBackend(str(path), lock_obj=JournalFileSymlinkLock(str(path)))
    except OSError as error:
        raise ValueError(f"storage: cannot write {path} ({error.strerror or error})") from None
    return _heartbeat_journal_class()(backend, **heartbeat)


# --------------------------------------------------------------------------------------------
# Heartbeat-enabled storages. Built lazily so that importing this module does not import Optuna.

_HEARTBEAT_JOURNAL: type | None = None


def _heartbeat_journal_class() -> type:
    """Define :class:`HeartbeatJournalStorage` on first use (it subclasses Optuna classes)."""
    global _HEARTBEAT_JOURNAL
    if _HEARTBEAT_JOURNAL is not None:
        return _HEARTBEAT_JOURNAL

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import JournalStorage
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.trial import TrialState

    class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
        """``JournalStorage`` plus Optuna's heartbeat protocol (absent from Optuna 5.0).

        A beat is the trial system attr ``harness:heartbeat = {"trial_id": id, "time": t}``
        (one short journal line per interval). A RUNNING trial is stale when neither its last
        beat nor its start is younger than the grace period; a trial that never beat is never
        stale, as in ``RDBStorage``. The beat names its trial id because
        ``RetryHeartbeatStaleTrialCallback`` copies system attrs into the retry, and the copy's
        old beat must not make the fresh retry look stale.
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
            grace = self.grace_period or 2 * self.heartbeat_interval
            now = time.time()
            stale = []
            for trial in self.get_all_trials(
                study_id, deepcopy=False, states=(TrialState.RUNNING,)
            ):
                beat = trial.system_attrs.get(HEARTBEAT_ATTR)
                if not isinstance(beat, dict) or beat.get("trial_id") != trial._trial_id:
                    continue
                last = float(beat["time"])
                if trial.datetime_start is not None:  # naive local time, as replayed
                    last = max(last, trial.datetime_start.timestamp())
                if now - last > grace:
                    stale.append(trial._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self.heartbeat_interval

        def get_heartbeat_stale_trial_callback(self) -> StaleTrialCallback | None:
            return self.heartbeat_stale_trial_callback

    # Picklable under its public name (resolved through the module ``__getattr__``).
    HeartbeatJournalStorage.__qualname__ = "HeartbeatJournalStorage"
    _HEARTBEAT_JOURNAL = HeartbeatJournalStorage
    return HeartbeatJournalStorage


def __getattr__(name: str) -> Any:
    # Lazy public names: `from harness.sweep.storage import HeartbeatJournalStorage`.
    if name == "HeartbeatJournalStorage":
        return _heartbeat_journal_class()
    if name == "ResilientRDBStorage":
        return _resilient_rdb_class()
    raise AttributeError(name)


_RESILIENT_RDB: type | None = None


def _resilient_rdb_class() -> type:
    global _RESILIENT_RDB
    if _RESILIENT_RDB is None:
        from optuna.storages import RDBStorage

        class ResilientRDBStorage(RDBStorage):
            """``RDBStorage`` with a heartbeat that survives outages and exclusive SQLite pops.

            Heartbeat: Optuna's heartbeat thread dies on the first exception, after which the
            live trial looks stale to every other worker and is failed and retried. Missing a
            beat while the server restarts is harmless, so the error is logged instead.

            SQLite: ``RDBStorage`` pops a WAITING trial with ``SELECT ... FOR UPDATE``, which
            SQLite ignores, and pysqlite runs that SELECT outside any transaction; two
            processes can then both read WAITING and both "win" the same trial (seen in the
            4-worker contract test: "Cannot tell a COMPLETE trial"). Starting every transaction
            with ``BEGIN IMMEDIATE`` takes SQLite's write lock up front, which serialises the
            read-check-write and makes the pop exclusive, as on PostgreSQL.
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
                    message = _short_reason(error, self.url)
                    _logger.warning("heartbeat of trial %d missed: %s", trial_id, message)

        ResilientRDBStorage.__qualname__ = "ResilientRDBStorage"
        _RESILIENT_RDB = ResilientRDBStorage
    return _RESILIENT_RDB


# --------------------------------------------------------------------------------------------
# Worker primitives: take only enqueued trials, keep them alive, recover dead workers' trials.


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail trials of dead workers and re-enqueue them (``optuna.storages.fail_stale_trials``).

    Call it before claiming each trial, as ``Study.optimize`` does. Exactly one worker wins the
    FAIL of a given stale trial, so each stale trial is re-enqueued once.
    """
    import optuna

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
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage: Any = study._storage
    for frozen in storage.get_all_trials(
        study._study_id, deepcopy=False, states=(TrialState.WAITING,)
    ):
        try:
            if storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
                    # A trial that never beat is never judged stale: beat at once, so a worker
                    # killed before its heartbeat thread starts still has its trial recovered.
                    storage.record_heartbeat(frozen._trial_id)
                return optuna.Trial(study, frozen._trial_id)
        except UpdateFinishedTrialError:
            continue
    return None


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for ``trial`` every ``heartbeat_interval`` seconds while the block runs.

    The same as the thread ``Study.optimize`` runs, for workers that claim trials themselves.
    A storage without heartbeat makes this a no-op. Beat errors are logged, never raised.
    """
    storage: Any = study._storage
    interval = storage.get_heartbeat_interval() if hasattr(storage, "record_heartbeat") else None
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial._trial_id)
            except Exception as error:  # a missed beat is harmless; a dead thread is not
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


# --------------------------------------------------------------------------------------------
# Outages and connection checks.


def is_transient_db_error(error: BaseException) -> bool:
    """True if ``error`` (or an error it wraps) is a lost or refused database connection.

    Optuna wraps SQLAlchemy errors raised at commit in ``StorageInternalError``, so the causes
    are inspected too. Integrity and programming errors are not transient.
    """
    import sqlalchemy.exc as sa_exc

    transient: tuple[type[BaseException], ...] = (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        sa_exc.DisconnectionError,
        ConnectionError,
    )
    try:
        import psycopg2

        transient += (psycopg2.OperationalError, psycopg2.InterfaceError)
    except ImportError:  # pragma: no cover - psycopg2 is a dependency
        pass
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, transient):
            return True
        if isinstance(seen, sa_exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(
    fn: Callable[[], _T],
    *,
    attempts: int = 8,
    base_delay: float = 0.5,
    max_delay: float = 15.0,
    retry_on: Callable[[BaseException], bool] = is_transient_db_error,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """Call ``fn()``; on a transient database error wait and try again, up to ``attempts`` times.

    Waits grow as ``base_delay * 2**k`` (capped at ``max_delay``) with ±50 % jitter so that
    workers reconnecting after a restart do not arrive in lockstep; the defaults ride out
    about a minute of downtime. Other errors, and the last transient one, propagate.

    Not every storage call is idempotent: a write whose commit succeeded while the connection
    dropped raises but took effect. Retrying ``study.tell`` then raises
    ``UpdateFinishedTrialError``, which the caller should read as "already told"; retrying
    ``enqueue_trial`` should use ``skip_if_exists=True``.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1; got {attempts}")
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as error:
            if attempt == attempts - 1 or not retry_on(error):
                raise
            delay = min(base_delay * 2**attempt, max_delay) * (0.5 + random.random())
            _logger.warning(
                "storage unavailable (%s); retry %d/%d in %.1f s",
                _short_reason(error),
                attempt + 1,
                attempts - 1,
                delay,
            )
            sleep(delay)
    raise AssertionError("unreachable")


def sqlalchemy_url(url: str) -> str:
    """Pin ``postgresql://`` to the installed driver: ``postgresql+psycopg2://`` without psycopg 3.

    SQLAlchemy 2.1 made psycopg 3 the default driver of a bare ``postgresql://`` URL, while the
    harness depends on ``psycopg2-binary``; without this, every PostgreSQL URL fails with
    "No module named 'psycopg'". URLs that name a driver are returned unchanged.
    """
    if not url.startswith("postgresql://"):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def database_connect_error(url: str, *, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Try one connection to the SQL database at ``url``; return a short reason, or None if OK.

    Used before handing a URL to Optuna or MLflow, both of which otherwise retry (MLflow) or
    block (libpq's default has no connect timeout) for minutes on an unreachable server.
    """
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args["connect_timeout"] = max(1, int(timeout))
    try:
        engine = sqlalchemy.create_engine(
            sqlalchemy_url(url), poolclass=NullPool, connect_args=connect_args
        )
    except Exception as error:  # bad URL syntax or a missing driver
        return _short_reason(error, url)
    try:
        with engine.connect():
            return None
    except Exception as error:
        return _short_reason(error, url)
    finally:
        engine.dispose()


def _short_reason(error: BaseException, url: str | None = None) -> str:
    """One line, password-free explanation of a driver error (``Connection refused``).

    Looks through wrappers (Optuna's ``StorageInternalError`` says only "An exception is raised
    during the commit") down to the driver's own error.
    """
    cause: BaseException = error
    seen: BaseException | None = error
    while seen is not None:
        orig = getattr(seen, "orig", None)
        if isinstance(orig, BaseException):
            cause = orig
            break
        cause = seen
        seen = seen.__cause__
    text = str(cause).strip() or type(cause).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # libpq: 'connection to server at "h" (ip), port p failed: <reason>' — keep the reason.
    reasons = [m.group(1) for line in lines if (m := re.search(r"failed: (.+)$", line))]
    line = reasons[-1] if reasons else lines[0]
    if line.startswith("FATAL:"):
        line = line.removeprefix("FATAL:").strip()
    secret = url_password(url) if url else None
    return redact_text(line, [secret] if secret else [])[:200]


__all__ = [
    "ALLOWED",
    "HEARTBEAT_ATTR",
    "JOURNAL_FILE",
    "claim_waiting_trial",
    "database_connect_error",
    "default_stale_trial_callback",
    "fail_stale_trials",
    "heartbeat",
    "is_transient_db_error",
    "make_storage",
    "sqlalchemy_url",
    "with_retries",
]
