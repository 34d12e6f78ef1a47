"""Launchers: where a sweep's workers run, and the one coordinator loop over them.

Every launcher runs the same ``worker_loop`` (``harness.sweep.launchers``):

    local    worker processes on this machine (spawned; the default)
    command  ``harness worker`` subprocesses, exactly what a user (or ``srun``) starts by hand
    ray      Ray tasks placed by a Ray cluster's scheduler

``run_workers`` is the one coordinator loop: live progress, Ctrl-C / SIGTERM, fail-fast.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from harness.sweep.launchers.base import LAUNCHERS, Launcher, Resources, worker_options
from harness.sweep.launchers.local import CommandLauncher, LocalLauncher
from harness.sweep.worker import Event, WorkerOptions

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
        from harness.sweep.launchers.ray_launcher import RayLauncher

        return RayLauncher(address=ray_address)
    from harness.core.configtools import ConfigError

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
