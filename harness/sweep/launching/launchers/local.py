"""Workers on this machine: spawned processes (``local``) or ``harness worker`` subprocesses
(``command``, exactly what a user or ``srun`` starts by hand)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

from harness.core.db import StorageUnavailable
from harness.core.exiting import exit_despite_threads
from harness.core.perf import tune_malloc
from harness.sweep.launching.launchers.base import Resources, worker_options
from harness.sweep.launching.worker import Event, WorkerOptions, worker_loop

# --------------------------------------------------------------------------------------------
# Local processes.


def _local_entry(opts: WorkerOptions, events: Any, stop: Any) -> None:
    """Process entry point: Ctrl-C is the coordinator's to handle; it asks us to stop via ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    tune_malloc()

    def emit(e: Event) -> None:
        try:
            events.put_nowait(e)
        except Exception:  # a full or closed queue must never stop training
            pass

    def flush_events() -> None:  # the last events (exit, crash) reach the coordinator
        try:
            events.close()
            events.join_thread()
        except Exception:
            pass

    def print_error() -> None:  # what multiprocessing prints for a worker's error
        traceback.print_exc()
        flush_events()

    # Each way out ends the process even where the user's code left a thread running: the
    # coordinator waits for this process to end before it finishes the sweep (core.exiting).
    try:
        worker_loop(opts, emit=emit, should_stop=stop.is_set)
    except StorageUnavailable as err:  # its trial stays RUNNING and goes stale: recoverable
        emit({"event": "crash", "worker": opts.worker_id, "reason": str(err)})
        exit_despite_threads(1, before_exit=flush_events)
        sys.exit(1)  # one line on the console (the crash event), no traceback
    except Exception as err:
        emit({"event": "crash", "worker": opts.worker_id, "reason": f"{type(err).__name__}: {err}"})
        exit_despite_threads(1, before_exit=print_error)
        raise
    exit_despite_threads(0, before_exit=flush_events)


class LocalLauncher:
    """Worker processes on this machine (``multiprocessing`` spawn: nothing shared by fork)."""

    name = "local"

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._events = self._ctx.Queue()
        self._stop = self._ctx.Event()
        self.procs: list[Any] = []
        self._reported: set[int] = set()  # workers whose death by a signal was reported

    def start(self, n_workers: int, opts: WorkerOptions, resources: Resources) -> None:
        for i in range(n_workers):
            p = self._ctx.Process(
                target=_local_entry,
                args=(worker_options(opts, i, resources), self._events, self._stop),
                name=f"harness-worker-{i}",
            )
            p.start()
            self.procs.append(p)

    def events(self, timeout: float) -> list[Event]:
        out = _drain(self._events, timeout)
        # A worker killed by a signal (the OOM killer's SIGKILL) could not say so itself.
        for i, p in enumerate(self.procs):
            code = p.exitcode
            if code is not None and code < 0 and i not in self._reported:
                self._reported.add(i)
                out.append(signal_death(i, p.pid, -code))
        return out

    def running(self) -> int:
        return sum(p.is_alive() for p in self.procs)

    def request_stop(self) -> None:
        self._stop.set()

    def terminate(self) -> None:
        for i, p in enumerate(self.procs):
            if p.is_alive() and p.pid is not None:
                self._reported.add(i)  # the coordinator killed it and says so itself
                kill_tree(p.pid)

    def close(self) -> None:
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive() and p.pid is not None:
                kill_tree(p.pid)
                p.join(timeout=5)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]


def signal_death(worker: int, pid: int | None, signum: int) -> Event:
    """The ``crash`` event of a worker that a signal killed (it could send none itself)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return {
        "event": "crash",
        "worker": worker,
        "pid": pid,
        "signal": name,
        "reason": f"killed by {name}",
    }


def kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process it started (a reward may fork): a worker stuck in a
    call that never returns ignores the polite stop, and its children would outlive it."""
    import psutil

    try:
        proc = psutil.Process(pid)
        family = [*proc.children(recursive=True), proc]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def _drain(q: Any, timeout: float) -> list[Event]:
    out: list[Event] = []
    try:
        out.append(q.get(timeout=timeout))
        while True:
            out.append(q.get_nowait())
    except (queue.Empty, EOFError, OSError):
        pass
    return out


# --------------------------------------------------------------------------------------------
# `harness worker` subprocesses (the manual / Slurm way, driven from here).


class CommandLauncher:
    """``harness worker`` subprocesses: the command a user runs by hand on another machine (or
    ``srun`` runs on a Slurm node), started here.  Store URLs travel in the environment
    (``HARNESS_STORAGE``, ``HARNESS_TRACKING_URI``), never on the command line, where any local
    user could read a password from ``/proc``."""

    name = "command"

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, "-m", "harness", "worker"]
        self.procs: list[subprocess.Popen[str]] = []
        self._events: queue.Queue[Event] = queue.Queue()
        self._readers: list[threading.Thread] = []
        self._killed: set[int] = set()

    def start(self, n_workers: int, opts: WorkerOptions, resources: Resources) -> None:
        for i in range(n_workers):
            o = worker_options(opts, i, resources)
            argv = [
                *self.command,
                "--study",
                o.study,
                "--results-dir",
                str(o.results_dir),
                "--threads",
                str(o.threads),
                "--worker-id",
                str(i),
                "--events",
                "jsonl",
            ]
            if o.device:
                argv += ["--device", o.device]
            if o.cells_per_worker > 1:
                argv += ["--cells-per-worker", str(o.cells_per_worker)]
            if not o.exit_when_idle:
                argv.append("--wait")
            env = dict(os.environ)
            env.pop("HARNESS_STORAGE", None)
            env.pop("HARNESS_TRACKING_URI", None)
            if o.storage:
                env["HARNESS_STORAGE"] = o.storage
            if o.tracking_uri:
                env["HARNESS_TRACKING_URI"] = o.tracking_uri
            p = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
            )
            self.procs.append(p)
            reader = threading.Thread(target=self._read, args=(p, i), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read(self, p: subprocess.Popen[str], worker_id: int) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(e, dict) and "event" in e:
                self._events.put(e)
        code = p.wait()
        if code < 0 and worker_id not in self._killed:
            self._events.put(signal_death(worker_id, p.pid, -code))
        elif code > 0:
            self._events.put(
                {"event": "crash", "worker": worker_id, "pid": p.pid, "reason": f"exit {code}"}
            )

    def events(self, timeout: float) -> list[Event]:
        return _drain(self._events, timeout)

    def running(self) -> int:
        # A worker counts until its output is read to the end (its last events delivered).
        return sum(r.is_alive() for r in self._readers)

    def request_stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def terminate(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                self._killed.add(i)  # the coordinator killed it and says so itself
                kill_tree(p.pid)

    def close(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_tree(p.pid)
                p.wait(timeout=5)
        for r in self._readers:
            r.join(timeout=5)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
