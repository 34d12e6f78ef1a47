"""The Optuna journal file, made to survive failed writes (a full disk, a killed writer).

Optuna's ``JournalFileBackend`` appends one JSON record per line and replays the whole file on
open.  A write that fails part-way (ENOSPC) or a writer killed mid-write leaves a last line
without its newline.  Optuna's reader skips such a tail, but the next append lands on the same
line, and from then on the file no longer replays: every command on the results dir, for every
study sharing the journal, fails with ``JSONDecodeError``.  :class:`SafeJournalFileBackend`:

* appends each batch with ``os.write`` under the journal's lock and, if the write fails, cuts
  the file back to its last complete record before raising (with the journal's path in the
  error), so a failed write leaves nothing behind;
* on open, drops an incomplete last record (or completes one that only lacks its newline),
  under the lock, so no live writer is cut off, with a warning;
* if a replay still meets a damaged line (a journal written by an older harness, where an
  append landed on such a tail), repairs the file once under the lock — a line made of a
  fragment plus a whole record keeps the record, a line with no whole record is dropped — and
  carries on, with a warning.

A journal removed while a command runs (the results directory deleted) is
:class:`~harness.core.fsutil.StoreRemovedError` naming it, one line, not the ``FileNotFoundError``
of whichever read or write met it first.

Why dropping is right: a fragment is a write whose caller saw it fail, so its operation never
happened as far as anyone knows; no reader has applied it (Optuna reads only complete lines),
and every line before it is untouched, so the offsets other processes have cached stay valid.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock

from harness.core.fsutil import StoreRemovedError, removed_reason
from harness.sweep.stores.journal_lock import journal_lock

_logger = logging.getLogger(__name__)

# Optuna's records are flat JSON objects whose first key is the operation; inside string values
# the same bytes would be escaped (\"), so this marks the start of a record.
RECORD_START = b'{"op_code":'
_TAIL_CHUNK = 64 * 1024


class JournalCorruptError(ValueError):
    """The journal has a damaged record that could not be repaired (e.g. no space to rewrite)."""


class SafeJournalFileBackend(JournalFileBackend):
    """``JournalFileBackend`` whose file survives a failed write (see the module docstring)."""

    def __init__(self, file_path: str, lock_obj: BaseJournalFileLock | None = None) -> None:
        # Our own references (Optuna's attributes are private); the same lock object as Optuna's.
        self._path = os.path.abspath(file_path)
        self._file_lock = lock_obj or journal_lock(self._path)
        super().__init__(self._path, lock_obj=self._file_lock)
        self._repair_tail()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._removed_as_such():
            self._file_lock.acquire()
        try:
            yield
        finally:
            self._file_lock.release()

    @contextmanager
    def _removed_as_such(self) -> Iterator[None]:
        """A ``FileNotFoundError`` met while the journal itself is gone is that: the journal
        (or a directory above it) was removed."""
        try:
            yield
        except FileNotFoundError as err:
            if os.path.exists(self._path):
                raise
            raise StoreRemovedError(removed_reason(self._path, "the Optuna journal")) from err

    # -- writing -------------------------------------------------------------------------------

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        with self._locked():
            with self._removed_as_such():
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
            try:
                start = os.fstat(fd).st_size
                written = 0
                try:
                    while written < len(data):
                        written += os.write(fd, data[written:])
                    os.fsync(fd)
                except BaseException as err:  # ENOSPC, EIO, or Ctrl-C mid-write
                    if written < len(data):
                        # Keep whole records (a reader may already have applied them); cut the
                        # fragment, so the next append starts on a line of its own.
                        keep = data.rfind(b"\n", 0, written) + 1
                        self._cut(fd, start + keep)
                    if isinstance(err, OSError):
                        raise OSError(err.errno, err.strerror, self._path) from None
                    raise
            finally:
                os.close(fd)

    def _cut(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as err:  # the next open drops the fragment instead
            _logger.warning("journal %s: could not remove a failed write (%s)", self._path, err)

    # -- repairing on open ---------------------------------------------------------------------

    def _tail_is_complete(self) -> bool:
        with open(self._path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return True
            f.seek(size - 1)
            return f.read(1) == b"\n"

    def _repair_tail(self) -> None:
        """Drop (or complete) a last record without its newline, left by a failed writer."""
        if self._tail_is_complete():
            return
        try:
            with self._locked():  # a live writer finishes its line first
                self._repair_tail_locked()
        except OSError as err:
            # No lock without space for it.  Optuna's reader skips an incomplete tail; the
            # next open with space repairs it.
            _logger.warning(
                "journal %s: its last record is incomplete and could not be repaired now (%s)",
                self._path,
                err.strerror or err,
            )

    def _repair_tail_locked(self) -> None:
        fd = os.open(self._path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            start = size
            while True:
                start = max(0, start - _TAIL_CHUNK)
                chunk = os.pread(fd, size - start, start)
                if not chunk or chunk.endswith(b"\n"):
                    return  # completed by the writer we waited for
                newline = chunk.rfind(b"\n")
                if newline >= 0 or start == 0:
                    break
            keep = start + newline + 1
            if _whole_record(chunk[newline + 1 :]):
                try:  # only the newline is missing: the record is whole, keep it
                    os.pwrite(fd, b"\n", size)
                    os.fsync(fd)
                    _logger.warning(
                        "journal %s: completed a last record that lacked its newline",
                        self._path,
                    )
                    return
                except OSError:
                    pass  # no room even for a newline: drop the record instead
            os.ftruncate(fd, keep)
            os.fsync(fd)
        finally:
            os.close(fd)
        _logger.warning(
            "journal %s: dropped an incomplete last record (%d bytes) left by a write that "
            "failed (full disk?) or by a killed process",
            self._path,
            size - keep,
        )

    # -- repairing a damaged line met while replaying -----------------------------------------

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        number = log_number_from
        repaired = False
        while True:
            try:
                with self._removed_as_such():
                    for log in super().read_logs(number):
                        yield log
                        number += 1
                return
            except ValueError as err:  # JSONDecodeError, or Optuna's "Invalid log format."
                if repaired:
                    raise JournalCorruptError(
                        f"journal {self._path}: record {number + 1} is damaged ({err})"
                    ) from None
                self._repair_lines()
                repaired = True

    def _repair_lines(self) -> None:
        """Rewrite the journal with each damaged complete line recovered or dropped."""
        with self._locked():
            with open(self._path, "rb") as f:
                content = f.read()
            lines = content.split(b"\n")
            # What follows the last newline is a dead writer's fragment (we hold the lock).
            dropped = int(lines.pop() != b"")
            out: list[bytes] = []
            recovered = 0
            for line in lines:
                if _whole_record(line):
                    out.append(line)
                    continue
                record = _last_whole_record(line)
                if record is None:
                    dropped += 1
                else:
                    out.append(record)
                    recovered += 1
            if not recovered and not dropped:
                return  # nothing damaged among complete lines (another process repaired it)
            new = b"".join(line + b"\n" for line in out)
            tmp = f"{self._path}.repair-{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    f.write(new)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, os.stat(self._path).st_mode & 0o777)
                os.replace(tmp, self._path)
            except OSError as err:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise JournalCorruptError(
                    f"journal {self._path}: has damaged records and cannot be repaired "
                    f"({err.strerror or err}); free space and run the command again"
                ) from None
        _logger.warning(
            "journal %s: repaired damaged records left by failed writes (%d recovered, %d "
            "fragments dropped)",
            self._path,
            recovered,
            dropped,
        )


def _whole_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _last_whole_record(line: bytes) -> bytes | None:
    """The whole record a damaged line ends with (fragments of failed writes, then a record)."""
    at = line.find(RECORD_START, 1)
    while at >= 0:
        if _whole_record(line[at:]):
            return line[at:]
        at = line.find(RECORD_START, at + 1)
    return None


__all__ = ["JournalCorruptError", "SafeJournalFileBackend"]
