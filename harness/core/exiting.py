"""Ending a harness process whatever threads the user's code left running.

Python does not exit while a non-daemon thread runs: at exit it joins every one, without a
bound.  A ``python:`` task module that starts such a thread (a metrics uploader, a watchdog, a
pool it never shuts down) would keep ``harness run`` alive after its run was recorded, and keep
a sweep's worker alive after its last trial, so the sweep would never write its report.  The
harness itself leaves none, so a non-daemon thread still running when a command or a worker is
done is the user's (or a library's): it gets :data:`GRACE_S` seconds to end, then one line
names it and the process ends without it (``os._exit``), after what a normal exit would do
first: the caller's own flushing (``before_exit``), the ``atexit`` handlers (logging,
multiprocessing's queues and finalizers, the reward process's cleanup) and the standard
streams.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable

GRACE_S = 2.0  # how long a finished process waits for the threads the user's code left


def leftover_threads() -> list[threading.Thread]:
    """The non-daemon threads other than the main one that still run: what Python's exit
    would wait for."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def exit_status(code: object) -> tuple[int, str | None]:
    """The process status ``SystemExit(code)`` ends with, and the text Python prints for it
    (``sys.exit("message")`` prints the message and exits 1)."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, None
    return 1, str(code)


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass  # a closed console must not stop the exit


def exit_despite_threads(
    code: int, *, before_exit: Callable[[], None] | None = None, grace_s: float = GRACE_S
) -> None:
    """Return when no thread would hold up this process's exit (none is left, or those left end
    within ``grace_s``): the caller then exits as usual.  Otherwise name them on stderr, run
    ``before_exit``, the ``atexit`` handlers and a flush of the standard streams, and end the
    process with status ``code`` without joining them."""
    left = leftover_threads()
    deadline = time.monotonic() + grace_s
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in left if t.is_alive()]
    if not left:
        return
    names = ", ".join(t.name for t in left[:5]) + (", ..." if len(left) > 5 else "")
    try:
        sys.stderr.write(
            f"note: {len(left)} thread(s) not started by the harness (a task module's, a "
            f"library's) still run ({names}) {grace_s:g} s after it finished; exiting without "
            "them\n"
        )
    except Exception:
        pass
    try:
        if before_exit is not None:
            before_exit()
        atexit._run_exitfuncs()
    finally:
        _flush_standard_streams()
        os._exit(code)


__all__ = ["GRACE_S", "exit_despite_threads", "exit_status", "leftover_threads"]
