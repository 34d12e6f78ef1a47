"""Optuna storages for sweeps, with dead-worker detection on every backend we accept.

Which storage (Optuna's own decision tree):

* one machine, several processes: ``JournalStorage`` over a file (the default,
  ``results/optuna-journal.log``; about 3 ms per trial, against about 42 ms for SQLite RDB),
  through :class:`~harness.sweep.stores.journal.SafeJournalFileBackend`, which keeps the file
  replayable after a failed write (a full disk, a killed writer);
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
:class:`~harness.sweep.stores.optuna_adapter.HeartbeatJournalStorage` adds one: the timestamp is a trial
system attr written to the journal, and staleness is judged on the local clock (the journal is
for one host).

The heartbeat runs inside ``Study.optimize`` only. A worker that takes enqueued trials itself
(to never create a trial that was not enqueued) uses ``claim_waiting_trial``, ``heartbeat`` and
``fail_stale_trials`` of :mod:`harness.sweep.stores.optuna_adapter` — the same three steps ``optimize``
performs, and the only place the harness touches Optuna's private API.

Outages. ``engine_kwargs={"pool_pre_ping": True}`` replaces pooled connections that a restarted
PostgreSQL server dropped, so the first call after the restart succeeds; calls made while the
server is down are retried by the storage itself for up to ``HARNESS_STORAGE_OUTAGE_S`` seconds
(default 60), with the writes a retry could repeat made idempotent
(:class:`~harness.sweep.stores.optuna_adapter.ResilientRDBStorage`); past that they raise
``StorageUnavailable`` and the worker stops, its trial left for the heartbeat to recover. The
heartbeat itself swallows such errors (a missed beat is harmless, a dead heartbeat thread would
get a live trial failed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.db import (
    CONNECT_TIMEOUT_S,
    database_connect_error,
    short_reason,
    sqlalchemy_url,
    url_scheme,
)
from harness.core.fsutil import is_disk_full
from harness.core.redact import redact_url

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

JOURNAL_FILE = "optuna-journal.log"
DEFAULT_MAX_RETRY = 3
ALLOWED = "journal (default), sqlite:///PATH, postgresql://USER:PASSWORD@HOST:PORT/DB"

StaleTrialCallback = Callable[["optuna.Study", "FrozenTrial"], None]


def make_storage(
    url: str | None,
    results_dir: Path,
    *,
    heartbeat_interval: int = 10,
    grace_period: int | None = None,
    stale_trial_callback: StaleTrialCallback | None = None,
    max_retry: int | None = DEFAULT_MAX_RETRY,
    outage_s: float | None = None,
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
        stale_trial_callback: Called with each stale trial once it is marked FAIL (Optuna's
            ``heartbeat_stale_trial_callback``). Default:
            ``RetryHeartbeatStaleTrialCallback(max_retry=max_retry)``.
        max_retry: How many times the default callback re-enqueues the same stale trial;
            ``None`` retries forever.
        outage_s: How long each call of an RDB storage retries through a lost or refused
            connection before it raises ``StorageUnavailable``; ``None`` reads
            ``HARNESS_STORAGE_OUTAGE_S`` (default 60 s). The journal has no outages.

    Raises:
        ValueError: For an unknown scheme, an unwritable journal, or an unreachable database
            (after at most ``CONNECT_TIMEOUT_S`` seconds), with any password redacted.
    """
    import optuna

    if heartbeat_interval < 1:
        raise ValueError(f"storage: heartbeat_interval must be >= 1 s; got {heartbeat_interval}")
    callback = stale_trial_callback or default_stale_trial_callback(max_retry)
    heartbeat: dict[str, Any] = {
        "heartbeat_interval": heartbeat_interval,
        "grace_period": grace_period if grace_period is not None else 4 * heartbeat_interval,
        "heartbeat_stale_trial_callback": callback,
    }
    if url is None or url == "journal":
        return _journal_storage(results_dir / JOURNAL_FILE, heartbeat)

    scheme = url_scheme(url)
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
        from harness.sweep.stores.optuna_adapter import ResilientRDBStorage  # noqa: PLC0415 - factory: loads Optuna and one backend when opened

        try:
            return ResilientRDBStorage(
                sqlalchemy_url(url), engine_kwargs=engine_kwargs, outage_s=outage_s, **heartbeat
            )
        except Exception as error:  # schema creation or version check against a bad database
            reason = short_reason(error, url)
            raise ValueError(f"storage: cannot use {redact_url(url)} ({reason})") from None


def default_stale_trial_callback(max_retry: int | None = DEFAULT_MAX_RETRY) -> StaleTrialCallback:
    """``RetryHeartbeatStaleTrialCallback(max_retry)``, without its ExperimentalWarning."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def _journal_storage(path: Path, heartbeat: dict[str, Any]) -> BaseStorage:
    from harness.sweep.stores.journal import SafeJournalFileBackend  # noqa: PLC0415 - factory: loads Optuna and one backend when opened
    from harness.sweep.stores.journal_lock import journal_lock  # noqa: PLC0415 - factory: loads Optuna and one backend when opened

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        # An flock on an absolute path: a holder killed mid-write releases it at once, and a
        # wait on a live holder is bounded (harness.sweep.stores.journal_lock).
        backend = SafeJournalFileBackend(str(path.resolve()), lock_obj=journal_lock(path))
    except OSError as error:
        if is_disk_full(error):
            raise  # not a bad --results-dir: the caller reports a full disk as such
        raise ValueError(f"storage: cannot write {path} ({error.strerror or error})") from None
    from harness.sweep.stores.optuna_adapter import HeartbeatJournalStorage  # noqa: PLC0415 - factory: loads Optuna and one backend when opened

    return HeartbeatJournalStorage(backend, **heartbeat)


__all__ = ["ALLOWED", "JOURNAL_FILE", "default_stale_trial_callback", "make_storage"]
