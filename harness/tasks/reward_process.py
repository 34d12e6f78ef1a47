"""A ``python:`` reward called in a child process, each call bounded in time.

Why a child process rather than a signal timer in this one (the chat template's mechanism,
:func:`harness.core.limits.time_bound`): a timer interrupts Python bytecode only, so a reward
stuck in C (a regex, a native library, a blocking read) would still hang the run, and nothing
in-process survives a reward that calls ``os._exit``, forks and returns twice, writes hundreds of
megabytes to the terminal, or scribbles over the caller's strings through ``ctypes``.  In a child:

* a call that does not answer within ``timeout_s`` is ended by killing the child, whatever it
  was doing, and every process below it: the child's first process is a keeper that runs no
  user code and is the subreaper of the rest (:func:`keep`), so a process the reward started in
  a session of its own (``start_new_session=True``, a daemon's double fork) is still found and
  killed (:mod:`harness.tasks.process_tree`), when a call times out, when the run ends, when the
  reward ends its own process, and when the harness dies;
* ``sys.exit``, ``os._exit``, a crash or ``KeyboardInterrupt`` raised by the reward is a reason
  (:class:`~harness.tasks.base.RewardError`), never the end of the harness;
* its stdout and stderr go through a pipe the parent drains: the first :data:`OUTPUT_CAP` bytes
  reach the console, the rest is dropped (one line says so);
* it sees copies of the prompt, completion and answer, so nothing it does to them reaches the
  run's own data;
* it runs in its own session, so Ctrl-C at the terminal interrupts the harness (which closes its
  run) rather than the reward, and it ends if the harness dies (Linux parent-death signal).

The child is a fresh interpreter (not a fork of this one: forking a process that holds a model,
CUDA state and a progress-bar thread is unsafe), started on the first call.  It imports the
reward's module again, so module-level code runs once in each process.  A fresh interpreter's
random generators start from the operating system's entropy, so a reward that draws random
numbers (a sampled judge, a random tie-break) would score a run differently each time it ran: the
child seeds Python's ``random``, and NumPy's and torch's global generators when the reward imports
them, with the run's seed (the parent's ``torch.initial_seed()``, which the run sets to
``cfg.seed``) before and after importing the reward's module, as a forked child would inherit it.
A run and its rerun, or a retried trial, then give a seeded reward the same draws.

Protocol (``multiprocessing.connection`` framing over two pipes): the parent sends
``("init", sys.path, spec, module, function, seed)``, then ``("call", prompt, completion, answer)``
per reward; the child answers ``("ready",)`` once and ``("ok", float)`` or ``("error", reason)``
per call.  The value checks (:func:`reward_value`) run in the child, where a hostile
``__float__`` is bounded by the same deadline.  The parent reads a reply itself
(:func:`_read_frame`) rather than with ``Connection.recv``: the deadline bounds the whole reply,
not its first byte (a reward that writes half a frame to the reply pipe and sleeps would
otherwise hang the run), a reply is at most :data:`REPLY_CAP` bytes (the child cuts a reason
to :data:`REASON_CHARS` characters before sending it), and it is unpickled without calling
anything it names (a reward can write to the pipe itself: what it writes must not run here).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import math
import numbers
import os
import pickle
import random
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import harness
from harness.tasks.base import RewardError, import_module
from harness.tasks.process_tree import become_subreaper, kill_below

# Rewards are trained in float32: a float64 beyond this range becomes inf there.
FLOAT32_MAX = 3.4028234663852886e38
OUTPUT_CAP = 64 * 1024  # bytes of a reward's stdout/stderr shown on the console, per process
START_TIMEOUT_S = 60.0  # starting the interpreter and importing the reward's module
DEFAULT_REWARD_TIMEOUT_S = 10.0  # task_options.reward_timeout_s: one call, seconds
REASON_CHARS = 300  # characters of a reward's exception message a reason keeps
REPLY_CAP = 64 * 1024  # bytes of one reply from the child; its replies are far smaller


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


class RewardProcess:
    """The child process of one ``python:`` reward (see the module docstring)."""

    def __init__(self, spec: str, module: str, function: str, timeout_s: float) -> None:
        self.spec, self.module, self.function = spec, module, function
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._lock = threading.Lock()  # one request in flight: the protocol is call/answer
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def call(self, where: str, prompt: str, completion: str, answer: str) -> float:
        """The reward of one completion; raises :class:`RewardError` naming ``where`` when the
        reward fails, returns no usable number, ends its process or overruns the bound."""
        with self._lock:
            if self._proc is None:
                self._start(where)
            assert self._send is not None and self._recv is not None
            deadline = time.monotonic() + self.timeout_s
            try:
                try:
                    self._send.send(("call", prompt, completion, answer))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the child is gone: reading its reply reports how it ended
                reply = self._reply(where, deadline)
            except BaseException:
                # Ctrl-C or SIGTERM mid-call: the answer would still arrive and be read as the
                # next call's, so this process is done with (as it is after a bad reply).
                self.close()
                raise
            if reply is None:
                self.close()
                raise RewardError(
                    f"{where} did not return within task_options.reward_timeout_s = "
                    f"{self.timeout_s:g} s (its process was stopped)"
                )
        if reply[0] == "ok":
            return float(reply[1])
        raise RewardError(f"{where} {reply[1]}"[:500])

    def _reply(self, where: str, deadline: float) -> tuple[Any, ...] | None:
        """The child's next reply, or None when ``deadline`` (``time.monotonic()``) passes before
        all of it has arrived; raises :class:`RewardError` when the child ended or sent what is
        not a reply."""
        assert self._recv is not None
        try:
            frame = _read_frame(self._recv.fileno(), deadline)
        except _Late:
            return None
        except (EOFError, OSError):
            how = self._ended()
            self.close()
            raise RewardError(f"{where} ended the reward process ({how})") from None
        except _BadReply as err:
            raise RewardError(f"{where}: the reward process sent {err}") from None
        try:
            reply = _PlainUnpickler(io.BytesIO(frame)).load()
        except Exception:
            reply = None
        if not _well_formed(reply):
            raise RewardError(f"{where}: the reward process sent something other than a reply")
        return tuple(reply)

    def _ended(self) -> str:
        """How the child ended (it closed its end of the pipe: it exited or is exiting)."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it closed its pipe and did not exit within 5 s"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}, e.g. os._exit({code})"

    def _start(self, where: str) -> None:

        root = str(Path(harness.__file__).resolve().parent.parent)
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        code = (
            f"import sys; sys.path.insert(0, {root!r}); "
            f"from harness.tasks.reward_process import keep; keep({req_r}, {rep_w})"
        )
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                pass_fds=(req_r, rep_w),
                start_new_session=True,
                cwd=os.getcwd(),
            )
        finally:
            for fd in (req_r, rep_w, out_w):
                os.close(fd)
        self._proc = proc
        self._send = Connection(req_w, readable=False)
        self._recv = Connection(rep_r, writable=False)
        drainer = threading.Thread(target=_drain, args=(out_r, self.function), daemon=True)
        drainer.start()
        self._finalizer = weakref.finalize(self, _kill_group, proc, drainer, self._send, self._recv)
        seed = _run_seed()
        self._send.send(("init", list(sys.path), self.spec, self.module, self.function, seed))
        try:
            reply = self._reply(where, time.monotonic() + START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if reply is None:
            self.close()
            raise RewardError(
                f"{where}: the reward process did not import '{self.module}' within "
                f"{START_TIMEOUT_S:g} s"
            )
        if reply[0] != "ready":
            self.close()
            raise RewardError(f"task '{self.spec}': the reward process {reply[1]}"[:500])

    def close(self) -> None:
        """Kill the child and everything it started; the next call starts a new one."""
        if self._finalizer is not None:
            self._finalizer()
        self._proc = self._send = self._recv = self._finalizer = None


class _Late(Exception):
    """The deadline passed before a whole reply arrived."""


class _BadReply(Exception):
    """A frame no reply of the protocol makes (``str``: what was sent)."""


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    """``n`` bytes from pipe ``fd``, all of them before ``deadline``; EOFError when the writer
    closed it first."""
    got = bytearray()
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not wait([fd], left):
            raise _Late
        chunk = os.read(fd, n - len(got))  # readable: returns what is there, never blocks
        if not chunk:
            raise EOFError
        got += chunk
    return bytes(got)


def _read_frame(fd: int, deadline: float) -> bytes:
    """One ``multiprocessing.connection`` frame (a big-endian int32 length, -1 then a uint64
    length for a long one, then the bytes), read before ``deadline`` and at most
    :data:`REPLY_CAP` bytes long."""
    (size,) = struct.unpack("!i", _read_exact(fd, 4, deadline))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8, deadline))
    if not 0 <= size <= REPLY_CAP:
        raise _BadReply(f"a reply of {size:,} bytes (a reply is at most {REPLY_CAP:,})")
    return _read_exact(fd, size, deadline)


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles tuples, strings and numbers only: a reply that names a class or a function (a
    reward writing ``(os._exit, (1,))`` as a frame) is not called in this process."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a reply names {module}.{name}")


def _well_formed(reply: Any) -> bool:
    """Whether ``reply`` is one the child's loop makes: ``("ready",)``, ``("ok", float)`` or
    ``("error", str)``."""
    if not isinstance(reply, tuple) or not reply or not isinstance(reply[0], str):
        return False
    if reply[0] == "ready":
        return len(reply) == 1
    kinds = {"ok": float, "error": str}
    return len(reply) == 2 and reply[0] in kinds and type(reply[1]) is kinds[reply[0]]


def _kill_group(
    proc: subprocess.Popen[bytes], drainer: threading.Thread, *conns: Connection
) -> None:
    # Everything below the keeper (the reward's server and whatever it started, in any session:
    # the keeper is their subreaper), then the keeper's own group.
    kill_below(proc.pid)
    try:
        proc.wait(timeout=1)  # the keeper ends by itself once the server is gone
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # SIGKILLed: it is gone as soon as the kernel reaps it
    for conn in conns:
        conn.close()
    # Its output so far reaches the console before whatever the caller prints next; bounded,
    # since a process the kill could not reach (one that was already gone from below the
    # keeper, see harness.tasks.process_tree) may still hold the pipe open.
    drainer.join(timeout=5)


def _drain(fd: int, function: str) -> None:
    """Pass the child's output to this process's stderr up to :data:`OUTPUT_CAP` bytes, then
    read and drop the rest (the child must never block on a full pipe)."""
    shown = 0
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 20):
            if shown >= OUTPUT_CAP:
                continue
            part = chunk[: OUTPUT_CAP - shown]
            shown += len(part)
            try:
                sys.stderr.write(part.decode("utf-8", "replace"))
                if shown >= OUTPUT_CAP:
                    sys.stderr.write(
                        f"\n[reward {function}: output past {OUTPUT_CAP // 1024} KiB is dropped]\n"
                    )
                sys.stderr.flush()
            except (OSError, ValueError):
                shown = OUTPUT_CAP  # the console is gone: keep draining


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


def _run_seed() -> int | None:
    """The run's seed as this process's torch generator was seeded with (None without torch)."""
    torch = sys.modules.get("torch")
    return int(torch.initial_seed()) if torch is not None else None


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
    "DEFAULT_REWARD_TIMEOUT_S",
    "FLOAT32_MAX",
    "OUTPUT_CAP",
    "RewardProcess",
    "describe_exit",
    "reward_value",
    "seed_generators",
]
