"""The stores a command opens — the Optuna storage and the tracker — checked before anything is
written: URL schemes and SQLite paths without a connection, then remote servers probed, then
(only then) the results dir and the local stores created.  Every problem is one ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import tracking
from harness.core.configtools import ConfigError
from harness.core.db import database_connect_error, url_scheme
from harness.core.fsutil import ensure_results_dir
from harness.core.redact import redact_url
from harness.sweep.stores.storage import JOURNAL_FILE, make_storage
from harness.tracking.probe import check_sqlite_path, check_tracking_scheme, probe_tracking_uri

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage


def check_store_urls(
    storage: str | None, tracking_uri: str | None, *, writable: bool = True
) -> None:
    """Scheme checks that need no connection (so bad URLs fail before anything is written);
    ``writable``: a SQLite database must also be writable where it is (a sweep, a run)."""
    if storage not in (None, "journal"):
        scheme = url_scheme(storage)
        if scheme not in ("sqlite", "postgresql"):
            raise ConfigError(
                f"--storage: scheme {scheme or redact_url(storage)!r} is not supported "
                "(use journal, sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB)"
            )
    check_tracking_scheme(tracking_uri)
    for flag, url in (("--storage", storage), ("--tracking-uri", tracking_uri)):
        if url is not None and url.startswith("sqlite:///"):
            check_sqlite_path(flag, url[len("sqlite:///") :], writable=writable)


def probe_remote(storage: str | None, tracking_uri: str | None) -> None:
    """Connect to a PostgreSQL storage / a remote tracking store before anything is created
    locally, so that an unreachable server leaves no results dir, journal or mlflow.db behind."""
    if storage not in (None, "journal") and url_scheme(storage) == "postgresql":
        reason = database_connect_error(storage)
        if reason is not None:
            raise ConfigError(f"storage: cannot connect to {redact_url(storage)} ({reason})")
    probe_tracking_uri(tracking_uri)


def open_stores(
    storage: str | None, tracking_uri: str | None, results_dir: Path
) -> tuple[Any, Any]:
    """Open the Optuna storage and the tracker of a sweep.  Remote stores are probed before the
    results dir or any local store is created."""
    check_store_urls(storage, tracking_uri)
    probe_remote(storage, tracking_uri)
    ensure_results_dir(results_dir)
    try:
        optuna_storage = make_storage(storage, results_dir)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    return optuna_storage, tracking.open_tracker(tracking_uri, results_dir)


def existing_storage(storage: str | None, results_dir: Path, study: str | None) -> Any:
    """The Optuna storage for a read-only command (status, report, worker): a journal or SQLite
    file that does not exist is never created; ``None`` when there is no storage (and no study
    was asked for)."""
    check_store_urls(storage, None, writable=False)
    local: Path | None = None
    if storage in (None, "journal"):
        local = results_dir / JOURNAL_FILE
    elif storage.startswith("sqlite:///"):
        local = Path(storage[len("sqlite:///") :])
    if local is not None and not local.is_file():
        if study is not None:
            raise ConfigError(
                f"study: no study named {study!r} (no Optuna storage at {local}; "
                "check --results-dir / --storage)"
            )
        return None
    probe_remote(storage, None)
    try:
        return make_storage(storage, results_dir)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def load_existing_study(name: str, storage: BaseStorage, missing: str) -> optuna.Study:
    """The study ``name`` in ``storage`` (a command that reads or joins a study: it never creates
    one), with Optuna's INFO lines quieted; ``missing`` is the ConfigError when there is none."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ConfigError(missing) from None
