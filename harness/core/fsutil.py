"""Checks on the results directory before anything is written there, the file-mode policy,
recognising a full disk, and whole-file (atomic) writes.

Why explicit modes: containers often run with umask 000, where every file a library creates
(the Optuna journal, MLflow's database and artifacts, reports) would be world-writable.  The CLI
therefore raises the process umask to at least 022 before it creates anything (children inherit
it), and directories the harness creates get mode 0755 explicitly.  A directory the harness did
not create is never chmod-ed: ``--results-dir /tmp`` (a shared sticky directory) must keep its
mode.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from harness.core.configtools import ConfigError

MIN_FREE_BYTES = 50 * 1024 * 1024
DIR_MODE = 0o755


def restrict_umask() -> None:
    """Mask at least group/other write for every file this process (and its children) creates."""
    current = os.umask(0o022)
    os.umask(current | 0o022)


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` with mode 0755 on each directory it creates (and only on those).

    Returns the directories created, outermost first.
    """
    missing: list[Path] = []
    cur = path
    while not cur.exists() and not cur.is_symlink():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # another worker made it first: not ours to chmod
        os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask; make it exact
        created.append(d)
    return created


def ensure_results_dir(path: Path | str) -> Path:
    """Create ``path`` (mode 0755) if missing and check it is a writable directory, not full."""
    p = Path(path)
    # Free space first, on the nearest directory that exists: a full or tiny filesystem is
    # refused before the results dir is created on it.
    existing = p
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    # A pseudo filesystem (/proc, /sys) has no blocks at all: creating the dir there fails
    # below with the truer reason.
    if existing.is_dir() and os.statvfs(existing).f_blocks > 0:
        _check_free(p, existing)
    try:
        make_dirs(p)
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: cannot create it ({err.strerror})") from None
    if not p.is_dir():
        raise ConfigError(f"results dir {str(p)!r}: exists and is not a directory")
    probe = p / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: not writable ({err.strerror})") from None
    _check_free(p, p)
    return p


def _check_free(results_dir: Path, on: Path) -> None:
    free = shutil.disk_usage(on).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"results dir {str(results_dir)!r}: only {free // (1024 * 1024)} MiB free (need at "
            f"least {MIN_FREE_BYTES // (1024 * 1024)} MiB)"
        )


# --------------------------------------------------------------------------------------------
# A full disk.  Every store the harness writes (the Optuna journal, MLflow's SQLite database and
# artifacts, reports, the warm-start cache) reports it differently: OSError ENOSPC/EDQUOT,
# SQLite's SQLITE_FULL ("database or disk is full", wrapped by SQLAlchemy and then MLflow), or
# PostgreSQL's disk_full (SQLSTATE 53100).  The sweep must recognise all of them, so that it stops
# with one line instead of retrying, failing trial after trial, or printing tracebacks.

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXT = ("database or disk is full", "no space left on device", "disk quota exceeded")


def _error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and everything it wraps: causes, contexts (unless ``raise ... from None`` hid
    them) and SQLAlchemy's ``orig``."""
    todo: list[BaseException] = [error]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        context = None if e.__suppress_context__ else e.__context__
        for nxt in (e.__cause__, context, getattr(e, "orig", None)):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


class DiskFullError(OSError):
    """A full disk reported elsewhere (by a worker); ``str()`` is its one-line reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.ENOSPC, reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def is_disk_full(error: BaseException) -> bool:
    """True if ``error`` is (or wraps) a write refused for lack of space or quota."""
    for e in _error_chain(error):
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if getattr(e, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
            return True
        if getattr(e, "pgcode", None) == "53100":  # PostgreSQL disk_full
            return True
        message = str(e).lower()
        if any(text in message for text in _DISK_FULL_TEXT):
            return True
    return False


def disk_full_message(error: BaseException) -> str:
    """One line for a full disk: what was refused, and where when the error says so."""
    for e in _error_chain(error):
        if isinstance(e, DiskFullError):
            return e.reason
    for e in _error_chain(error):
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            where = f" writing {e.filename}" if e.filename else ""
            return f"disk full ({e.strerror or os.strerror(e.errno or 0)}{where})"
    for e in _error_chain(error):
        for text in _DISK_FULL_TEXT:
            if text in str(e).lower():
                return f"disk full ({text})"
    return "disk full"


# --------------------------------------------------------------------------------------------
# A store removed while a command runs (``rm -rf results`` in another shell, or user code such as
# a reward doing it).  SQLite then refuses every write to the unlinked file ("attempt to write a
# readonly database") and the Optuna journal's next open is FileNotFoundError: each write failed
# with a traceback of its own (hundreds of lines).  The store that meets it raises
# :class:`StoreRemovedError`, and everything above treats it as a full disk is treated: one line,
# the sweep stops, nothing is retried.


class StoreRemovedError(OSError):
    """A store the harness writes (the MLflow SQLite database, the Optuna journal) is gone: it, or
    a directory above it, was removed while the command ran, so nothing more can be recorded
    there and no retry can help.  ``str()`` is its one-line reason (:func:`removed_reason`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.ENOENT, reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def file_identity(path: Path | str) -> tuple[int, int] | None:
    """``(device, inode)`` of ``path``, None when there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def removed_reason(path: Path | str, what: str) -> str:
    """One line saying that store ``path`` (``what``: "the MLflow store") was removed, naming
    the outermost directory removed with it, if any."""
    p = Path(path).absolute()
    gone = p
    while not gone.parent.exists() and gone.parent != gone.parent.parent:
        gone = gone.parent
    if gone == p:
        return f"{what} {p} was removed during the run"
    return f"the directory {gone} was removed during the run, and {what} {p.name} with it"


def store_removed_reason(error: BaseException) -> str | None:
    """The reason of a :class:`StoreRemovedError` that ``error`` is or wraps, else None."""
    for e in _error_chain(error):
        if isinstance(e, StoreRemovedError):
            return e.reason
    return None


def fatal_store_error(error: BaseException) -> OSError | None:
    """The condition that stops a sweep which ``error`` is or wraps, as the error it stops with:
    a full disk (a :class:`DiskFullError`) or a removed store (a :class:`StoreRemovedError`),
    each with its one line; None for any other error.  Every write would meet either again, so
    the sweep stops instead of failing trial after trial."""
    removed = store_removed_reason(error)
    if removed is not None:
        return StoreRemovedError(removed)
    if is_disk_full(error):
        return DiskFullError(disk_full_message(error))
    return None


def fatal_event_error(event: dict[str, object]) -> OSError:
    """The error of a worker's ``fatal`` event (its ``reason``; ``removed`` for a store that
    was removed rather than a full disk)."""
    reason = str(event.get("reason") or "disk full")
    return StoreRemovedError(reason) if event.get("removed") else DiskFullError(reason)


ORPHAN_TEMP_AGE_S = 3600.0  # a temp file of another host's writer is left this long


def temp_path(path: Path) -> Path:
    """The hidden sibling ``atomic_write`` writes first: ``.NAME.HOST.PID.RANDOM.tmp``, so a
    later writer can tell a dead writer's leftover from a live one's."""
    return path.with_name(
        f".{path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphan_temps(path: Path) -> list[Path]:
    """Remove the temp files of ``path``'s writers that died before their ``os.replace`` (kill -9
    or a power cut mid-write): a writer on this host whose pid is gone, or any writer's file older
    than ``ORPHAN_TEMP_AGE_S`` (a pid on another host cannot be asked).  Returns what it removed."""
    here = f".{path.name}.{socket.gethostname()}"
    removed = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        prefix, _, rest = tmp.name[: -len(".tmp")].rpartition(".")  # rest: the random part
        prefix, _, pid = prefix.rpartition(".")
        try:
            dead = prefix == here and pid.isdigit() and not _pid_alive(int(pid))
            old = time.time() - tmp.stat().st_mtime > ORPHAN_TEMP_AGE_S
        except OSError:
            continue  # removed meanwhile by its writer or another cleaner
        if dead or old:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write ``path`` whole or not at all: a temp file in the same directory, then ``os.replace``.

    Readers (and a second process writing the same report) see the old file or the new one,
    never a half-written or missing one; a failed write (a full disk) removes its temp file and
    leaves the old file as it was.  A writer killed mid-write cannot remove its temp file, so
    each write first removes such leftovers (``remove_orphan_temps``).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    remove_orphan_temps(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
