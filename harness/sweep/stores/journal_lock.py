"""The journal's inter-process lock: released by the kernel when its holder dies, waited on
with a bound.

Optuna's default journal lock (``JournalFileSymlinkLock``) is a symlink ``PATH.lock`` whose
target is ``PATH`` *as given*.  Given a relative path (``results/optuna-journal.log``) the
link's target resolves relative to the link's own directory (``results/results/...``), so its
stale-lock check — ``os.stat`` through the link, for an mtime — fails and retries for ever: a
process killed while holding the lock (kill -9, the OOM killer, a power cut) leaves every later
command on that results dir waiting with no end.  Even with an absolute path a dead holder's
lock is only broken after a grace period measured on the *journal's* mtime, and two waiters may
break it at once.

:class:`JournalLock` takes an ``flock`` on ``PATH.flock`` (an absolute path) instead:

* a holder that dies for any reason releases it at once — the kernel drops the locks of a
  closed file description — so nothing is ever left stale on a local filesystem (and on NFS the
  server drops a dead client's lock when its lease ends);
* the holder writes ``PID HOST`` into the file and clears it on release, so a waiter can say
  who it waits for, and the next holder can say that it took the lock over from a holder that
  died (the record was not cleared);
* a wait is bounded (``HARNESS_LOCK_TIMEOUT_S``, default 120 s — a holder keeps the lock for
  milliseconds, or seconds while repairing a large journal); every 10 s of waiting it logs what
  it waits for, and at the bound it raises :class:`LockTimeout` with one line naming the lock,
  its holder and the way out;
* threads of one process exclude each other too (each acquire opens its own file description).

Where ``flock`` is not supported (some FUSE mounts) it falls back to Optuna's symlink lock,
given the absolute path so that its grace period works.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
from pathlib import Path

from optuna.storages.journal import JournalFileSymlinkLock
from optuna.storages.journal._file import BaseJournalFileLock

from harness.core.locks import (
    NO_FLOCK,
    LockTimeout,
    describe_holder,
    holder_record,
    read_record,
    wait_flock,
)

_logger = logging.getLogger("harness.sweep.stores.journal")

LOCK_SUFFIX = ".flock"
LEGACY_SUFFIX = ".lock"  # Optuna's symlink lock, used by earlier versions
TIMEOUT_ENV = "HARNESS_LOCK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0
# A legacy symlink lock older than this was left by a dead process (Optuna's own grace is 30 s).
LEGACY_STALE_S = 60.0


def lock_timeout_s() -> float:
    """The bound on one wait for the journal lock: ``HARNESS_LOCK_TIMEOUT_S`` or 120 s."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


class JournalLock(BaseJournalFileLock):
    """An ``flock`` on ``JOURNAL.flock`` (see the module docstring)."""

    def __init__(self, journal_path: str | os.PathLike[str], timeout_s: float | None = None):
        self.journal_path = os.path.abspath(os.fspath(journal_path))
        self.path = self.journal_path + LOCK_SUFFIX
        self.timeout_s = lock_timeout_s() if timeout_s is None else timeout_s
        self._held = threading.local()
        self._fallback: JournalFileSymlinkLock | None = None
        self.took_over_from: str | None = None  # the last dead holder taken over from
        self._remove_legacy_lock()

    def __getstate__(self) -> dict[str, object]:
        # Storages travel to Ray workers pickled; a held lock never does.
        state = dict(self.__dict__)
        del state["_held"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._held = threading.local()

    def _remove_legacy_lock(self) -> None:
        """Remove an old-style symlink lock left by a killed process of an earlier version."""
        legacy = self.journal_path + LEGACY_SUFFIX
        try:
            st = os.lstat(legacy)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode) and time.time() - st.st_mtime > LEGACY_STALE_S:
            try:
                os.unlink(legacy)
            except OSError:
                return
            _logger.warning(
                "journal lock: removed a stale lock left by a killed process: %s", legacy
            )

    # -- BaseJournalFileLock ------------------------------------------------------------------

    def acquire(self) -> bool:
        if self._fallback is not None:
            return self._fallback.acquire()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not self._wait(fd):
                return self._fallback.acquire() if self._fallback is not None else False
        except BaseException:
            os.close(fd)
            raise
        self._held.fd = fd
        self._claim(fd)
        return True

    def release(self) -> None:
        if self._fallback is not None:
            self._fallback.release()
            return
        fd = getattr(self._held, "fd", None)
        if fd is None:
            return
        self._held.fd = None
        try:
            os.ftruncate(fd, 0)  # a cleared record: released, not died holding it
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- internals ----------------------------------------------------------------------------

    def _wait(self, fd: int) -> bool:
        """Block until ``fd`` holds the lock or the bound passes; False to use the fallback."""
        try:
            wait_flock(
                fd,
                timeout_s=self.timeout_s,
                what=f"journal lock {self.path}",
                logger=_logger,
                hint=f"stop that process (or wait for it) and run the command again "
                f"({TIMEOUT_ENV} sets the bound)",
            )
            return True
        except OSError as err:
            if err.errno not in NO_FLOCK:
                raise
        os.close(fd)
        self._fallback = JournalFileSymlinkLock(self.journal_path)
        _logger.warning(
            "journal lock: this filesystem has no flock; using a symlink lock with a 30 s grace "
            "period instead"
        )
        return False

    def _claim(self, fd: int) -> None:
        """Record ourselves as the holder; say so if the last holder died holding it."""
        previous = read_record(fd)
        if previous and previous != holder_record():
            self.took_over_from = previous
            _logger.warning(
                "journal lock: took over %s from %s, which died holding it",
                self.path,
                describe_holder(previous),
            )
        try:
            data = (holder_record() + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError:
            pass  # the record only names the holder; a full disk must not stop the lock


def journal_lock(journal_path: str | Path) -> JournalLock:
    """The lock every harness process uses for the journal at ``journal_path``."""
    return JournalLock(journal_path)


__all__ = ["DEFAULT_TIMEOUT_S", "JournalLock", "LockTimeout", "journal_lock", "lock_timeout_s"]
