"""One coordinator per study: a second ``harness ablate``/``search`` of a study that another
process is coordinating is refused in one line naming that process.

Why refuse rather than share: a coordinator enqueues every missing (cell, seed) when it starts,
reading the study and then writing to it; two coordinators doing so at once both see a pair
missing and both enqueue it, so it runs twice.  Extra workers are safe (they claim trials
atomically): ``harness worker --study NAME`` joins a running study without coordinating it.

The lock is ``flock`` on a file in the results dir.  The kernel drops it when its holder dies,
however it dies (SIGKILL, the OOM killer, a lost power supply only if the results dir survives
it), so a dead coordinator never leaves the study locked and nothing has to judge staleness.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from harness.core.configtools import ConfigError


def lock_path(results_dir: Path, study: str) -> Path:
    return results_dir / f".{study}.coordinator.lock"


@contextlib.contextmanager
def coordinator_lock(results_dir: Path, study: str) -> Iterator[None]:
    """Hold the study's coordinator lock for the block, or raise ConfigError at once (no wait)
    naming the process that holds it."""
    path = lock_path(results_dir, study)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(
                f"study {study!r}: already being run by pid {holder} (lock {path}); wait for it "
                f"to end, or add workers to it with `harness worker --study {study}`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a new holder)
