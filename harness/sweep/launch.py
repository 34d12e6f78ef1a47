"""Launchers: where a sweep's workers run.  Every launcher runs the same ``worker_loop``.

A ``Launcher`` starts N workers on a study with given resources, reports their events, says how
many are still running, and stops them — gracefully first (each worker finishes its current
step and records its trial as interrupted), for good on a second request.  Implementations:

    local    worker processes on this machine (spawned; the default)
    command  ``harness worker`` subprocesses — exactly what a user (or ``srun``) starts by hand
    ray      Ray tasks placed by a Ray cluster's scheduler (``harness.sweep.ray_launcher``)

``run_workers`` is the one coordinator loop: live progress, Ctrl-C / SIGTERM, fail-fast.  One
contract suite (``tests/test_launchers.py``) runs against every launcher.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from harness.sweep.worker import Event, WorkerOptions, worker_loop

LAUNCHERS = ("local", "ray")


@dataclass(frozen=True)
class Resources:
    """What each worker gets.  ``devices`` are handed out round-robin (local and command
    launchers); Ray places workers by ``gpus``/``cpus`` instead."""

    devices: tuple[str, ...] = ()
    gpus: float = 0.0
    cpus: float = 1.0


class Launcher(Protocol):
    name: str

    def start(self, n_workers: int, opts: WorkerOptions, resources: Resources) -> None:
        """Start ``n_workers`` workers, ids 0..n-1, each running ``worker_loop``."""

    def events(self, timeout: float) -> list[Event]:
        """Events the workers emitted since the last call (waits up to ``timeout`` for one)."""

    def running(self) -> int:
        """How many workers have not exited yet."""

    def request_stop(self) -> None:
        """Ask every worker to stop after its current step (its trial ends 'interrupted')."""

    def terminate(self) -> None:
        """Stop every worker now (a second Ctrl-C); their trials are recovered by heartbeat."""

    def close(self) -> None:
        """Wait for the workers to exit (terminating stragglers) and release resources."""


def worker_options(opts: WorkerOptions, i: int, resources: Resources) -> WorkerOptions:
    device = resources.devices[i % len(resources.devices)] if resources.devices else opts.device
    return replace(opts, worker_id=i, device=device)


# --------------------------------------------------------------------------------------------
# Local processes.


def _local_entry(opts: WorkerOptions, events: Any, stop: Any) -> None:
    """Process entry point: Ctrl-C is the coordinator's to handle; it asks us to stop via ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from harness.perf import tune_malloc

    tune_malloc()

    def emit(e: Event) -> None:
        try:
            events.put_nowait(e)
        except Exception:  # a full or closed queue must never stop training
            pass

    from harness.db import StorageUnavailable

    try:
        worker_loop(opts, emit=emit, should_stop=stop.is_set)
    except StorageUnavailable as err:  # its trial stays RUNNING and goes stale: recoverable
        emit({"event": "crash", "worker": opts.worker_id, "reason": str(err)})
        sys.exit(1)  # one line on the console (the crash event), no traceback
    except Exception as err:
        emit({"event": "crash", "worker": opts.worker_id, "reason": f"{type(err).__name__}: {err}"})
        raise


class LocalLauncher:
    """Worker processes on this machine (``multiprocessing`` spawn: nothing shared by fork)."""

    name = "local"

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._events = self._ctx.Queue()
        self._stop = self._ctx.Event()
        self.procs: list[Any] = []

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
        return _drain(self._events, timeout)

    def running(self) -> int:
        return sum(p.is_alive() for p in self.procs)

    def request_stop(self) -> None:
        self._stop.set()

    def terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def close(self) -> None:
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]


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
        if p.wait() != 0:
            self._events.put(
                {"event": "crash", "worker": worker_id, "reason": f"exit {p.returncode}"}
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
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def close(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for r in self._readers:
            r.join(timeout=5)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


def make_launcher(name: str, *, ray_address: str | None = None) -> Launcher:
    if name == "local":
        return LocalLauncher()
    if name == "command":
        return CommandLauncher()
    if name == "ray":
        from harness.sweep.ray_launcher import RayLauncher

        return RayLauncher(address=ray_address)
    from harness.configtools import ConfigError

    raise ConfigError(f"--launcher: {name!r} is not one of {', '.join(LAUNCHERS)}")


# --------------------------------------------------------------------------------------------
# The coordinator loop.


class StopSignals:
    """SIGINT/SIGTERM handling of a coordinator: the first signal asks the workers to stop (they
    finish the current step and record their trials as interrupted); a second one terminates
    them.  Use as a context manager; the previous handlers come back on exit."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher, self.count = launcher, 0

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.launcher.request_stop()
        else:
            self.launcher.terminate()

    def __enter__(self) -> StopSignals:
        self._old = (
            signal.signal(signal.SIGINT, self._handle),
            signal.signal(signal.SIGTERM, self._handle),
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._old[0])
        signal.signal(signal.SIGTERM, self._old[1])

    @property
    def interrupted(self) -> bool:
        return self.count > 0


def run_workers(
    launcher: Launcher,
    n_workers: int,
    opts: WorkerOptions,
    *,
    resources: Resources = Resources(),
    total: int,
    done_before: int,
    fail_fast: bool = False,
    on_event: Callable[[Event], None] | None = None,
    show_progress: bool = True,
) -> dict[str, int]:
    """Start the workers, show live progress until they exit, and count outcomes.

    SIGINT/SIGTERM: workers are asked to stop (their running trials end as 'interrupted' and are
    resumed by the next run); a second signal terminates them.  A worker's ``fatal`` event (a
    full disk) asks all workers to stop the same way; ``counts["fatal"]`` says how many sent one.
    """
    from contextlib import nullcontext

    from harness.sweep.progress import SweepProgress

    counts = {
        "completed": 0,
        "diverged": 0,
        "pruned": 0,
        "error": 0,
        "interrupted": 0,
        "fatal": 0,
    }
    progress = SweepProgress(n_workers, total=total, done=done_before)
    signals = StopSignals(launcher)

    def handle(e: Event) -> None:
        if show_progress:
            progress.handle(e)
        if on_event is not None:
            on_event(e)
        if e["event"] == "done":
            counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
            if fail_fast and e["outcome"] == "error":
                launcher.request_stop()
        elif e["event"] == "crash":
            counts["error"] += 1
        elif e["event"] == "fatal":  # a full disk: every other worker would hit it too
            counts["fatal"] += 1
            launcher.request_stop()

    try:
        with signals, progress if show_progress else nullcontext():
            launcher.start(n_workers, opts, resources)
            while True:
                batch = launcher.events(0.25)
                for e in batch:
                    handle(e)
                if not batch and not launcher.running():
                    for e in launcher.events(0.05):  # anything sent just before the exit
                        handle(e)
                    break
    finally:
        launcher.close()
    counts["interrupted_by_user"] = int(signals.interrupted)
    return counts
