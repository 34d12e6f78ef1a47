"""Launchers: where a sweep's workers run, and the one coordinator loop over them.

Every launcher runs the same ``worker_loop`` (``harness.sweep.launching.launchers``):

    local    worker processes on this machine (spawned; the default)
    command  ``harness worker`` subprocesses, exactly what a user (or ``srun``) starts by hand
    ray      Ray tasks placed by a Ray cluster's scheduler

``run_workers`` is the one coordinator loop: live progress, Ctrl-C / SIGTERM, fail-fast.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from harness.core.configtools import ConfigError
from harness.sweep.launching.launchers.base import LAUNCHERS, Launcher, Resources, worker_options
from harness.sweep.launching.launchers.local import CommandLauncher, LocalLauncher
from harness.sweep.launching.launchers.ray_launcher import RayLauncher
from harness.sweep.launching.worker import Event, WorkerOptions
from harness.sweep.present.progress import SweepProgress

__all__ = [
    "LAUNCHERS",
    "CommandLauncher",
    "Launcher",
    "LocalLauncher",
    "Resources",
    "make_launcher",
    "run_workers",
    "worker_options",
]


def make_launcher(name: str, *, ray_address: str | None = None) -> Launcher:
    if name == "local":
        return LocalLauncher()
    if name == "command":
        return CommandLauncher()
    if name == "ray":
        return RayLauncher(address=ray_address)

    raise ConfigError(f"--launcher: {name!r} is not one of {', '.join(LAUNCHERS)}")


# --------------------------------------------------------------------------------------------
# The coordinator loop.


def stop_grace_s() -> float:
    """How long a stopped sweep waits for its workers to finish their current step before it
    kills them: ``HARNESS_STOP_GRACE_S`` seconds (default 30)."""
    raw = os.environ.get("HARNESS_STOP_GRACE_S", "30")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ConfigError(f"HARNESS_STOP_GRACE_S: must be seconds in (0, 3600]; got {raw!r}")
    return value


class StopSignals:
    """SIGINT/SIGTERM handling of a coordinator: the first signal asks the workers to stop (they
    finish the current step and record their trials as interrupted); a second one has them
    killed.  The handler only records; ``run_workers`` acts.  Use as a context manager; the
    previous handlers come back on exit."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher, self.count = launcher, 0
        self.names: list[str] = []

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.names.append(signal.Signals(signum).name)
        if self.count == 1:
            self.launcher.request_stop()

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


def _held(held: dict[Any, dict[str, Any]] | None) -> str:
    """What a worker was running (one trial, or a pack's), for a line about its end."""
    if not held:
        return "no trial"
    texts = []
    for h in held.values():
        seed = f" seed={h['seed']}" if h.get("seed") is not None else ""
        cell = h.get("cell")
        texts.append(
            f"{h['trial']} ({cell}{seed})" if cell and cell != f"trial {h['trial']}" else
            str(h["trial"])
        )  # fmt: skip
    return ("trial " if len(texts) == 1 else "trials ") + ", ".join(texts)


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
    say: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """Start the workers, show live progress until they exit, and count outcomes.

    SIGINT/SIGTERM: workers are asked to stop (their running trials end as 'interrupted' and are
    resumed by the next run).  Every stop (a signal, fail-fast, a full disk) waits at most
    ``stop_grace_s()`` for the workers; then, or at a second signal, the workers still running
    are killed (SIGKILL, with every process they started), one line each, and a ``killed``
    event names each trial it held (the caller records it as interrupted and closes its run).
    A worker that dies of a signal (the OOM killer) gets one line naming the trial it held,
    which the heartbeat then finds stale and retries.  A worker's ``fatal`` event (a full disk)
    asks all workers to stop; ``counts["fatal"]`` says how many sent one.
    """
    grace = stop_grace_s()
    progress = SweepProgress(n_workers, total=total, done=done_before)
    c = _Coordinator(launcher, progress, fail_fast, on_event, show_progress, say)
    signals = StopSignals(launcher)
    try:
        with signals, progress if show_progress else nullcontext():
            launcher.start(n_workers, opts, resources)
            first_signal: float | None = None
            killed = False
            while True:
                batch = launcher.events(0.25)
                for e in batch:
                    c.handle(e)
                if signals.count and first_signal is None:
                    first_signal = time.monotonic()
                    c.line(
                        f"{signals.names[0]}: stopping the workers (waiting at most {grace:g} s "
                        "for them to finish their step; a second signal kills them now)"
                    )
                asked = [t for t in (first_signal, *c.stop_asked) if t is not None]
                if not killed and launcher.running():
                    if signals.count >= 2:
                        c.kill_stragglers(f"second {signals.names[1]}")
                        killed = True
                    elif asked and time.monotonic() - min(asked) > grace:
                        c.kill_stragglers(f"still running {grace:g} s after the stop was asked")
                        killed = True
                if not batch and not launcher.running():
                    for e in launcher.events(0.05):  # anything sent just before the exit
                        c.handle(e)
                    break
    finally:
        launcher.close()
    c.counts["interrupted_by_user"] = int(signals.interrupted)
    return c.counts


class _Coordinator:
    """What ``run_workers`` knows of its workers while they run: the outcome counts, the trial
    each worker holds and its process, and when a stop was first asked (not by a signal)."""

    def __init__(
        self,
        launcher: Launcher,
        progress: SweepProgress,
        fail_fast: bool,
        on_event: Callable[[Event], None] | None,
        show_progress: bool,
        say: Callable[[str], None] | None,
    ) -> None:
        self.launcher, self.progress, self.fail_fast = launcher, progress, fail_fast
        self.on_event, self.show_progress, self.say = on_event, show_progress, say
        self.counts = dict.fromkeys(
            ("completed", "diverged", "pruned", "error", "interrupted", "fatal", "died", "killed"),
            0,
        )
        # worker -> trial number -> (trial, cell, seed) of the trials it is running (several
        # when it trains a pack)
        self.held: dict[int, dict[Any, dict[str, Any]]] = {}
        self.pids: dict[int, int] = {}
        self.stop_asked: list[float] = []  # when a stop was first asked (not by a signal)

    def line(self, text: str) -> None:
        if self.show_progress:
            self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif self.say is not None:
            self.say(text)

    def ask_stop(self) -> None:
        if not self.stop_asked:
            self.stop_asked.append(time.monotonic())
        self.launcher.request_stop()

    def handle(self, e: Event) -> None:
        counts, held, pids = self.counts, self.held, self.pids
        w = e.get("worker", 0)
        old, new = pids.get(w), e.get("pid")
        if e["event"] in ("start", "exit") and w in held and old and new and new != old:
            # Ray restarts a worker whose process died (the OOM killer's SIGKILL) without telling
            # us: a new process of that worker (taking a trial, or finding none left) while the
            # old one held a trial is the old one's death.
            counts["died"] += 1
            self.line(
                f"worker {w} (pid {old}) died while running {_held(held.pop(w))} and was "
                f"restarted as pid {new}; the trial is retried once its heartbeat goes stale"
            )
        if e["event"] == "start":
            held.setdefault(w, {})[e.get("trial")] = {
                k: e.get(k) for k in ("trial", "cell", "seed")
            }
            if new:
                pids[w] = new
        if e["event"] == "crash" and e.get("signal"):  # killed from outside: say what it held
            counts["died"] += 1
            e["line"] = (
                f"worker {w} (pid {e.get('pid') or pids.get(w, '?')}) was killed by "
                f"{e['signal']} while running {_held(held.get(w))}; a running trial is retried "
                "once its heartbeat goes stale (by another worker, or by running the same "
                "command again)"
            )
            self.line(e["line"])
        if self.show_progress:
            self.progress.handle(e)
        if self.on_event is not None:
            self.on_event(e)
        if e["event"] == "done":
            held.get(w, {}).pop(e.get("trial"), None)
            if not held.get(w):
                held.pop(w, None)
            counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
            if self.fail_fast and e["outcome"] == "error":
                self.ask_stop()
        elif e["event"] == "crash":
            counts["error"] += 1
            held.pop(w, None)  # dead: its trial is the heartbeat's to recover, not ours to kill
        elif e["event"] == "fatal":  # a full disk: every other worker would hit it too
            counts["fatal"] += 1
            self.ask_stop()
        elif e["event"] == "exit":
            held.pop(w, None)

    def kill_stragglers(self, why: str) -> None:
        alive = self.launcher.running()
        self.launcher.terminate()
        for w in sorted(self.held):
            self.line(
                f"worker {w} (pid {self.pids.get(w, '?')}) killed: {why}; "
                f"it was running {_held(self.held[w])}"
            )
            for h in self.held[w].values():  # each trial of a pack is recorded on its own
                self.counts["killed"] += 1
                if self.on_event is not None:
                    self.on_event({"event": "killed", "worker": w, **h, "reason": why})
        if alive and not self.held:
            self.line(f"{alive} worker(s) killed: {why}")
