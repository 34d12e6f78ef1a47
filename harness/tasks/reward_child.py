"""The child side of a ``python:`` reward's process (the parent side, and why a child at all,
is :mod:`harness.tasks.reward_process`).

The child's first process is the keeper (:func:`keep`): it runs no user code, is the subreaper of
everything below it and forks the server (:func:`serve`), which imports the reward's module,
seeds the random generators with the run's seed and answers each call with ``("ok", float)`` or
``("error", reason)``.  The value checks (:func:`reward_value`) run here, where a hostile
``__float__`` is bounded by the parent's deadline, and the output the reward prints is capped
here (:class:`_CappedText`) before it reaches the pipe the parent drains.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import numbers
import os
import random
import resource
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from harness.tasks.base import import_module
from harness.tasks.process_tree import become_subreaper, kill_below

# Rewards are trained in float32: a float64 beyond this range becomes inf there.
FLOAT32_MAX = 3.4028234663852886e38
OUTPUT_CAP = 64 * 1024  # bytes of a reward's stdout/stderr shown on the console, per process
REASON_CHARS = 300  # characters of a reward's exception message a reason keeps


def reward_value(value: Any) -> float | str:
    """``value`` as the float reward, or the reason it cannot be one (a short phrase).

    A reward is a real number (``int``, ``float``, ``bool`` as 0/1, numpy's number scalars and
    ``numpy.bool_`` as 0/1) that is finite and inside the float32 range the loss is computed in;
    anything else (a string, None, a list, an array) is refused rather than guessed at."""
    numpy = sys.modules.get("numpy")  # a reward that returns a numpy value has imported it
    if numpy is not None and isinstance(value, numpy.bool_):
        value = bool(value)  # numpy's bool is not a numbers.Real, unlike Python's
    if not isinstance(value, numbers.Real):
        return f"returned {value!r:.60}, not a number"
    try:
        number = float(value)
    except OverflowError:
        if isinstance(value, int):
            return f"returned an integer of {value.bit_length()} bits, beyond float range"
        return f"returned {value!r:.60}, beyond float range"
    if not math.isfinite(number):
        return f"returned {number}, not a finite number"
    if abs(number) > FLOAT32_MAX:
        return (
            f"returned {number:g}, outside the float32 range (±{FLOAT32_MAX:.4g}) rewards are "
            "trained in"
        )
    return number


def describe_exit(exc: BaseException) -> str:
    """What a reward's exception says as a reason."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r:.{REASON_CHARS}})"
    text = str(exc)
    lines = text[: REASON_CHARS + 1].splitlines()  # a 300 MB message is not split whole
    first = lines[0] if lines else ""
    if len(first) > REASON_CHARS:
        first = first[:REASON_CHARS] + "..."
    return f"raised {type(exc).__name__}: {first}" if first else f"raised {type(exc).__name__}"


class _CappedText:
    """The child's ``sys.stdout``/``sys.stderr``: text past the shared budget is dropped here,
    so a reward printing 100 MB costs a length check, not 100 MB through the pipe (what it
    writes to the file descriptors directly is still capped by the parent's :func:`_drain`)."""

    budget = OUTPUT_CAP + 1  # shared by both streams; one byte more so the parent says "dropped"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, text: str) -> int:
        if _CappedText.budget > 0:
            data = text[: _CappedText.budget].encode("utf-8", "replace")[: _CappedText.budget]
            _CappedText.budget -= len(data)
            try:
                os.write(self._fd, data)
            except OSError:
                _CappedText.budget = 0
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd


def _die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (elsewhere: a closed
    pipe ends it between calls, which is the best the platform allows).  Linux ties this to the
    thread that started the process; for the keeper that is the thread that scores: the main
    thread of a run."""
    if not sys.platform.startswith("linux"):
        return

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signum)
    except (OSError, AttributeError):
        return


def keep(req_fd: int, rep_fd: int) -> None:
    """The reward process's first process, the keeper: the subreaper of everything below it.

    It forks the server (:func:`serve`, which imports and calls the reward) and only waits:
    no user code runs in it, so it outlives whatever the reward does, and every process the
    reward starts, in whatever session, stays below it (:mod:`harness.tasks.process_tree`).
    The harness kills all of them before the keeper when the run ends; when the server ends
    by itself (``os._exit``, a crash) the keeper kills what is left below it and then ends as
    the server ended, so the harness reads the server's exit status as the keeper's; when the
    harness dies (even by SIGKILL) the keeper is sent SIGTERM and kills everything below it."""
    parent = os.getppid()
    become_subreaper()
    server = os.fork()
    if server == 0:
        serve(req_fd, rep_fd)
        return
    os.close(req_fd)  # only the server talks to the harness: its death closes the pipes
    os.close(rep_fd)

    def harness_died(signum: int, frame: object) -> None:
        kill_below(os.getpid())
        os._exit(1)

    signal.signal(signal.SIGTERM, harness_died)
    _die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the harness died before the death signal was set
        harness_died(signal.SIGTERM, None)
    _, status = os.waitpid(server, 0)
    kill_below(os.getpid(), timeout_s=3.0)  # within the 5 s the harness waits for this exit
    with contextlib.suppress(ChildProcessError):  # reap what it adopted: init may not
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    _end_as(status)


def _end_as(status: int) -> None:
    """End this process as the wait status ``status`` says its child ended."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the server's crash is reported
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal this process could not die of
    os._exit(os.waitstatus_to_exitcode(status))


def seed_generators(seed: int | None) -> None:
    """Seed ``random`` with ``seed``, and NumPy's and torch's global generators when this
    process has imported them (a reward that never imports torch does not pay for it here)."""
    if seed is None:
        return

    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)  # NumPy's legacy global seed is 32-bit
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def serve(req_fd: int, rep_fd: int) -> None:
    """The child's loop (see the module docstring)."""
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was set
        os._exit(1)
    sys.stdout, sys.stderr = _CappedText(1), _CappedText(2)  # type: ignore[assignment]
    recv = Connection(req_fd, writable=False)
    send = Connection(rep_fd, readable=False)
    _, path, spec, module, function, seed = recv.recv()
    sys.path[:] = path
    seed_generators(seed)  # module-level draws, too
    try:
        func = getattr(import_module(spec, module), function)
    except BaseException as exc:  # the parent imported it; a second import may still fail
        send.send(("error", f"could not import '{module}': {describe_exit(exc)}"))
        return
    seed_generators(seed)  # the generators the import brought in
    send.send(("ready",))
    me = os.getpid()
    while True:
        try:
            _, prompt, completion, answer = recv.recv()
        except EOFError:
            return  # the parent closed the pipe: the run is over
        try:
            value = reward_value(func(prompt, completion, answer))
            reply = ("ok", value) if isinstance(value, float) else ("error", value)
        except BaseException as exc:  # sys.exit and KeyboardInterrupt are the reward's, too
            reply = ("error", describe_exit(exc))
        if os.getpid() != me:
            os._exit(0)  # a process the reward forked returned here: only the child answers
        send.send(reply)


__all__ = [
    "FLOAT32_MAX",
    "OUTPUT_CAP",
    "REASON_CHARS",
    "describe_exit",
    "keep",
    "reward_value",
    "seed_generators",
    "serve",
]
