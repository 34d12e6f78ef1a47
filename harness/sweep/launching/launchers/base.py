"""What every launcher is: the ``Launcher`` protocol, the resources a worker gets, its options.

A ``Launcher`` starts N workers on a study with given resources, reports their events, says how
many are still running, and stops them: gracefully first (each worker finishes its current step
and records its trial as interrupted), for good on a second request.  Implementations:
``local`` and ``command`` (``launchers/local.py``), ``ray`` (``launchers/ray_launcher.py``).
One contract suite (``tests/sweep/launching/test_launcher_contract.py``) runs against every
launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from harness.sweep.launching.worker import Event, WorkerOptions

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
