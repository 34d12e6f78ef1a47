"""A bounded wait for an ``flock``: every process lock of the harness waits through this.

An ``flock`` is released by the kernel when its holder dies, so a killed process never leaves
one behind; but a *live* holder that hangs would keep a waiter for ever.  :func:`wait_flock`
polls instead of blocking, logs what it waits for every 10 s, and raises :class:`LockTimeout`
with one line at its bound.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable

REPORT_EVERY_S = 10.0
NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


class LockTimeout(TimeoutError):
    """A lock was not acquired within its bound (its message is one line)."""


def holder_record() -> str:
    """What a holder writes into its lock file: ``PID HOST``."""
    return f"{os.getpid()} {socket.gethostname()}"


def describe_holder(record: str) -> str:
    parts = record.split()
    if len(parts) >= 2 and parts[0].isdigit():
        return f"pid {parts[0]} on {parts[1]}"
    return "another process"


def read_record(fd: int) -> str:
    try:
        return os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def wait_flock(
    fd: int,
    *,
    timeout_s: float,
    what: str,
    logger: logging.Logger,
    hint: str = "stop that process (or wait for it) and run the command again",
    describe: Callable[[], str] | None = None,
) -> None:
    """Take an exclusive ``flock`` on ``fd``, waiting at most ``timeout_s`` seconds.

    ``what`` names the lock in messages (a path); ``describe`` says who holds it (default: the
    ``PID HOST`` record in the file).  Raises :class:`LockTimeout` at the bound, and OSError
    (errno in :data:`NO_FLOCK`) where the filesystem has no ``flock``."""
    holder = describe or (lambda: describe_holder(read_record(fd)))
    start = time.monotonic()
    next_report = start + REPORT_EVERY_S
    sleep = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        now = time.monotonic()
        waited = now - start
        if waited >= timeout_s:
            raise LockTimeout(f"{what}: held by {holder()} for more than {timeout_s:g} s; {hint}")
        if now >= next_report:
            logger.warning(
                "waiting %.0f s for the lock %s, held by %s (gives up after %g s)",
                waited,
                what,
                holder(),
                timeout_s,
            )
            next_report = now + REPORT_EVERY_S
        time.sleep(sleep)
        sleep = min(sleep * 2, 0.05)


__all__ = [
    "LockTimeout",
    "NO_FLOCK",
    "describe_holder",
    "holder_record",
    "read_record",
    "wait_flock",
]
