"""The SQLite file behind an MLflow store (``sqlite:///PATH``): its first creation serialised
between processes, its "database is locked" errors told apart, and a database file removed or
replaced under a running process recognised (so a full disk or a removed store is one line, not
a traceback per write)."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.core.fsutil import file_identity, is_disk_full
from harness.core.locks import NO_FLOCK, wait_flock

# The longest a process waits for another one creating the same SQLite store (seconds).
SQLITE_INIT_LOCK_S = 300.0


def is_sqlite_locked_error(error: BaseException) -> bool:
    """True for SQLite's transient "database is locked" / "database table is locked" errors.

    MLflow wraps the driver error in an ``MlflowException`` whose message keeps the text, so
    the check is on the message of the error and of its causes.
    """
    seen: BaseException | None = error
    while seen is not None:
        message = str(seen).lower()
        if "database is locked" in message or "database table is locked" in message:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# The SQLite databases this process opened, by path: the file each was when it was opened.
OPEN_DATABASES: dict[Path, tuple[int, int] | None] = {}


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path).absolute()


def replaced(db: Path, identity: tuple[int, int] | None) -> bool:
    """Whether the file ``db`` was when opened is no longer there under its name."""
    return identity is not None and file_identity(db) != identity


class _DropDiskFull(logging.Filter):
    """Drop MLflow's ERROR-with-traceback for a full disk or a removed database: the error
    propagates to the harness, which says so in one line (and stops a sweep); a traceback per
    write was hundreds of lines."""

    def filter(self, record: logging.LogRecord) -> bool:

        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        if is_disk_full(error):
            return False
        # What SQLite says of a write to an unlinked file (SQLITE_READONLY_DBMOVED), once one
        # of this process's databases is indeed gone.
        readonly = "readonly database" in str(error).lower()
        return not (readonly and any(replaced(db, i) for db, i in OPEN_DATABASES.items()))


def quiet_disk_full_tracebacks() -> None:
    """Install the filter that drops MLflow's traceback for a full disk or a removed database
    (once per process)."""
    log = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _DropDiskFull) for f in log.filters):
        log.addFilter(_DropDiskFull())


@contextmanager
def sqlite_init_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``DB.lock`` while a SQLite store is first opened."""
    if not tracking_uri.startswith("sqlite:///") or os.name != "posix":
        yield
        return

    db_path = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
    if str(db_path) in ("", ":memory:"):
        yield
        return
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db_path}.lock", "a") as lock_file:
        # A first open takes seconds; a holder that died released the lock with its process.
        try:
            wait_flock(
                lock_file.fileno(),
                timeout_s=SQLITE_INIT_LOCK_S,
                what=f"MLflow store lock {db_path}.lock",
                logger=logging.getLogger(__name__),
                describe=lambda: "another process creating the store",
            )
        except OSError as err:
            if err.errno not in NO_FLOCK:
                raise
            locked = False  # no flock on this filesystem: first opens race, as in MLflow itself
        else:
            locked = True
        if not locked:
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
