"""Every process below a given one, found through ``/proc`` and killed, whatever session or
process group it put itself in (Linux; elsewhere nothing is found and nothing is killed).

Why not the process group: a reward that starts ``subprocess.Popen(..., start_new_session=True)``
or daemonizes (fork, ``setsid``, fork again, the middle process exits) leaves the group, so
killing the group misses it; and once its parent has exited the kernel re-parents it to init,
after which no ``ppid`` chain leads back to the reward.  :func:`become_subreaper` closes that
gap: orphans below a child subreaper (``PR_SET_CHILD_SUBREAPER``, Linux 3.4) are re-parented to
it rather than to init, so as long as the subreaper lives, every process started below it, in
any session, is reachable by its ``ppid`` chain (only ``ptrace`` tricks or a process started by
something else, e.g. a system service the reward asked for, are not).

:func:`kill_below` kills what it finds pass by pass until a pass finds nothing alive: a process
that forks between two passes has its new child found by the next one (a child of a killed
process is re-parented to the subreaper, still below it), and ``fork`` fails in a process with a
pending SIGKILL, so the passes end.  Each process is signalled through a pidfd after checking
its start time, so a pid reused meanwhile by an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_DEAD = frozenset("ZXx")  # zombie, dead: nothing left to kill, and no children of their own


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (see the module
    docstring); False where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, start time)`` of ``pid`` from ``/proc/PID/stat``, None when it is gone.

    The command name (field 2) is in parentheses and may hold spaces and ``)``: the fields are
    read after its last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        # fields[0] is field 3 (state), [1] field 4 (ppid), [19] field 22 (start time, ticks)
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def living_below(root: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every process below ``root`` that is not a zombie, parents
    before their children."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    children: dict[int, list[tuple[int, str, int]]] = {}
    for name in names:
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None:
            state, ppid, start = stat
            children.setdefault(ppid, []).append((int(name), state, start))
    found: list[tuple[int, int]] = []
    todo = [root]
    while todo:
        for pid, state, start in children.get(todo.pop(), ()):
            if state not in _DEAD and pid != root:
                found.append((pid, start))
                todo.append(pid)
    return found


def _kill(pid: int, start: int) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``start``."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:  # no pidfd (Linux < 5.3): the start time is checked just before
        stat = _stat(pid)
        if stat is not None and stat[2] == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        fd = opener(pid)
    except OSError:
        return  # gone already
    try:
        # The pidfd names the process it was opened on, for good: if that is the one that
        # started at ``start``, the signal reaches it or (once it is gone) nothing.
        stat = _stat(pid)
        if stat is not None and stat[2] == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def kill_below(root: int, timeout_s: float = 5.0) -> bool:
    """SIGKILL every process below ``root`` (not ``root`` itself), pass after pass, until none
    is left alive or ``timeout_s`` passes; True when none is left.  Meant for a ``root`` that
    is a subreaper (:func:`become_subreaper`) and is still alive: below any other process, an
    orphan's ``ppid`` becomes init's and it is no longer found."""
    deadline = time.monotonic() + timeout_s
    while True:
        living = living_below(root)
        if not living:
            return True
        if time.monotonic() >= deadline:
            return False
        for pid, start in living:
            _kill(pid, start)
        time.sleep(0.005)  # a killed process shows as alive until the kernel has torn it down


__all__ = ["become_subreaper", "kill_below", "living_below"]
