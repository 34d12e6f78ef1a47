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
per call.  The child's side is :mod:`harness.tasks.reward_child`.  The value checks
(:func:`~harness.tasks.reward_child.reward_value`) run in the child, where a hostile
``__float__`` is bounded by the same deadline.  The parent reads a reply itself
(:func:`_read_frame`) rather than with ``Connection.recv``: the deadline bounds the whole reply,
not its first byte (a reward that writes half a frame to the reply pipe and sleeps would
otherwise hang the run), a reply is at most :data:`REPLY_CAP` bytes (the child cuts a reason
to ``REASON_CHARS`` characters before sending it), and it is unpickled without calling anything
it names (a reward can write to the pipe itself: what it writes must not run here).
"""

from __future__ import annotations

import io
import os
import pickle
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
from harness.tasks.base import RewardError
from harness.tasks.process_tree import kill_below
from harness.tasks.reward_child import (
    FLOAT32_MAX,
    OUTPUT_CAP,
    describe_exit,
    reward_value,
    seed_generators,
)

START_TIMEOUT_S = 60.0  # starting the interpreter and importing the reward's module
DEFAULT_REWARD_TIMEOUT_S = 10.0  # task_options.reward_timeout_s: one call, seconds
REPLY_CAP = 64 * 1024  # bytes of one reply from the child; its replies are far smaller


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
            reply = self._exchange(
                where,
                time.monotonic() + self.timeout_s,
                f"{where} did not return within task_options.reward_timeout_s = "
                f"{self.timeout_s:g} s (its process was stopped)",
                request=("call", prompt, completion, answer),
            )
        if reply[0] == "ok":
            return float(reply[1])
        raise RewardError(f"{where} {reply[1]}"[:500])

    def _exchange(
        self,
        where: str,
        deadline: float,
        late: str,
        *,
        request: tuple[Any, ...] | None = None,
    ) -> tuple[Any, ...]:
        """Send ``request`` (when given) and return the child's reply by ``deadline``; past it the
        process is stopped and :class:`RewardError` says ``late``."""
        assert self._send is not None
        try:
            if request is not None:
                try:
                    self._send.send(request)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the child is gone: reading its reply reports how it ended
            reply = self._reply(where, deadline)
        except BaseException:
            # Ctrl-C or SIGTERM mid-exchange: the reply would still arrive and be read as the
            # next one's, so this process is done with (as it is after a bad reply).
            self.close()
            raise
        if reply is None:
            self.close()
            raise RewardError(late)
        return reply

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
            f"from harness.tasks.reward_child import keep; keep({req_r}, {rep_w})"
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
        reply = self._exchange(
            where,
            time.monotonic() + START_TIMEOUT_S,
            f"{where}: the reward process did not import '{self.module}' within "
            f"{START_TIMEOUT_S:g} s",
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


def _run_seed() -> int | None:
    """The run's seed as this process's torch generator was seeded with (None without torch)."""
    torch = sys.modules.get("torch")
    return int(torch.initial_seed()) if torch is not None else None


__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "FLOAT32_MAX",
    "OUTPUT_CAP",
    "RewardProcess",
    "describe_exit",
    "reward_value",
    "seed_generators",
]
