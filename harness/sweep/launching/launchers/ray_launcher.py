"""The Ray launcher: each worker is a Ray task running the shared ``worker_loop`` against the
study's shared storage, placed by Ray's scheduler with ``num_cpus``/``num_gpus`` (one worker per
GPU across the cluster with ``--gpus-per-worker 1``).

The coordinator stays the Ray driver: it enqueues, shows progress and finishes the study as with
local workers.  Events travel through one small actor (``_Channel``), which also carries the
graceful-stop flag; a second Ctrl-C cancels the tasks outright (their trials are then recovered
by the heartbeat, as for any dead worker).  Ray's own task retries restart a worker whose
process or node died; the trial it held is recovered exactly once by the heartbeat.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

from harness.core.configtools import ConfigError
from harness.core.perf import tune_malloc
from harness.sweep.launching.launchers.base import worker_options
from harness.sweep.launching.launchers.ray_checks import (
    check_placement,
    import_ray,
    split_address,
)
from harness.sweep.launching.worker import Event, WorkerOptions, worker_loop

# How often a Ray worker asks the channel whether to stop (a cheap actor call).
STOP_POLL_S = 0.5
# How long one ask waits for the channel's answer, and how long the channel may go without
# answering before the worker stops as if asked. A late answer is a loaded machine (the actor
# process waits for a core), not a gone coordinator: a gone one's channel is killed with it,
# and asking a dead actor raises at once. So one late answer only keeps the last one.
STOP_ASK_TIMEOUT_S = 10.0
CHANNEL_SILENCE_S = 300.0


LOOPBACK = ("127.0.0.1", "::1")


def _single_node(ray: Any) -> contextlib.AbstractContextManager[Any]:
    """Ray's single-node mode for the duration of one ``ray.init``.

    Ray binds its servers to loopback only when the node's IP is a loopback address, and it
    rewrites a loopback address (``_node_ip_address``, or the host of ``address``) into the
    machine's routable IP unless multi-node clusters are off: the environment variable
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which Ray reads once at import, so its constant is
    set here instead.  Without this a local Ray listens on every interface, and a head bound
    to loopback cannot be joined at 127.0.0.1."""
    constants = ray._private.ray_constants
    if not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        return contextlib.nullcontext()
    return mock.patch.object(constants, "ENABLE_RAY_CLUSTER", False)


def _init_local(ray: Any) -> None:
    """Start a Ray on this machine whose every server (GCS, raylet, object manager, workers'
    gRPC servers, the runtime-env agent) listens on 127.0.0.1 only.  ``address="local"``
    starts a new instance even where ``RAY_ADDRESS`` or a ``ray start`` on this machine would
    be joined: without ``--ray-address`` the sweep runs here and nowhere else.  The caller
    checks the IP the node came up on."""
    with _single_node(ray):
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )


def _is_loopback_address(address: str) -> bool:
    try:
        hostport = split_address(address)
    except ConfigError:
        return False
    return hostport is not None and hostport[0] in (*LOOPBACK, "localhost")


@contextlib.contextmanager
def _keep_sigterm_handler(ray: Any) -> Iterator[None]:
    """``ray.init`` installs SIGTERM handlers that end the process on the spot (the driver's
    ``sys.exit``; a head started in-process kills its processes first; the core worker's C++
    failure handler aborts, exit -6), replacing the coordinator's graceful stop
    (``StopSignals``): trials and runs were left RUNNING and Ray's agents orphaned.  Ray's
    Python handlers are not installed, and the coordinator's is put back over the C++ one;
    Ray shuts down from ``close``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    utils = ray._private.utils
    keep = (
        mock.patch.object(utils, "set_sigterm_handler", lambda handler: None)
        if hasattr(utils, "set_sigterm_handler")
        else contextlib.nullcontext()
    )
    try:
        with keep:
            yield
    finally:
        signal.signal(signal.SIGTERM, old)


class _Channel:
    """Events from the workers to the coordinator, and the stop flag the other way."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.stop = False

    def put(self, e: Event) -> None:
        self.events.append(e)

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def set_stop(self) -> None:
        self.stop = True

    def stopped(self) -> bool:
        return self.stop


def _ray_worker(opts: WorkerOptions, channel: Any) -> dict[str, int]:
    """Body of one Ray task: the shared worker loop, reporting through ``channel``."""
    import ray

    tune_malloc()
    asked_at, answered_at, stop = 0.0, time.monotonic(), False

    def should_stop() -> bool:
        nonlocal asked_at, answered_at, stop
        now = time.monotonic()
        if not stop and now - asked_at >= STOP_POLL_S:
            try:
                stop = bool(ray.get(channel.stopped.remote(), timeout=STOP_ASK_TIMEOUT_S))
                answered_at = time.monotonic()
            except ray.exceptions.GetTimeoutError:  # late, not gone: see CHANNEL_SILENCE_S
                stop = time.monotonic() - answered_at > CHANNEL_SILENCE_S
            except Exception:  # the channel died with the coordinator: stop as if asked
                stop = True
            asked_at = time.monotonic()
        return stop

    def emit(e: Event) -> None:
        channel.put.remote(e)  # fire and forget: a slow coordinator never blocks training

    try:
        return worker_loop(opts, emit=emit, should_stop=should_stop)
    except Exception as err:
        emit({"event": "crash", "worker": opts.worker_id, "reason": f"{type(err).__name__}: {err}"})
        raise


class RayLauncher:
    """Workers as Ray tasks on the cluster at ``address`` (``None``: a Ray started here)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, max_task_retries: int = 2) -> None:
        self.ray = import_ray()
        self.address = address
        self.max_task_retries = max_task_retries
        self.refs: list[Any] = []
        self._started_ray = False
        self._channel: Any = None
        self._reported: set[Any] = set()
        self._closed = False
        self._stop_asked = False  # a stop asked before the channel existed (while Ray started)

    def connect(self) -> None:
        """Join the cluster at ``address``, or start a Ray on this machine bound to loopback."""
        ray = self.ray
        if ray.is_initialized():
            return
        try:
            with _keep_sigterm_handler(ray):
                if self.address is None:
                    _init_local(ray)
                else:
                    # A head on this machine's loopback is joined at loopback, not at the
                    # routable IP Ray would rewrite 127.0.0.1 into.
                    here = _is_loopback_address(self.address)
                    with _single_node(ray) if here else contextlib.nullcontext():
                        ray.init(
                            address=self.address,
                            include_dashboard=False,
                            log_to_driver=False,
                            configure_logging=False,
                        )
        except (ConnectionError, ValueError, RuntimeError) as err:
            where = self.address or "a local Ray"
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"--ray-address: cannot connect to {where} ({first})") from None
        self._started_ray = True
        if self.address is None:
            ip = ray.util.get_node_ip_address()
            if ip not in LOOPBACK:  # never leave a cluster listening beyond this machine
                self.close()
                raise ConfigError(
                    f"--launcher ray: the Ray started here came up on {ip}, not on 127.0.0.1 "
                    "(this Ray version ignores a loopback node IP), so it would listen beyond "
                    "this machine; pass --ray-address of a cluster you started"
                )

    def check_placement(self, gpus: float, cpus: float) -> None:
        """Join the cluster (or start the Ray here) and refuse, as a ConfigError, a worker that
        no node can hold (``ray_checks.check_placement``): its task would wait for ever.  The
        coordinator calls this before it writes anything; a refusal leaves no Ray running."""
        self.connect()
        try:
            check_placement(self.ray.nodes(), gpus, cpus)
        except ConfigError:
            self.close()
            raise

    def start(self, n_workers: int, opts: Any, resources: Any) -> None:
        ray = self.ray
        self.connect()
        if self._stop_asked:  # stopped while Ray was starting: no worker takes a trial
            return
        channel_cls = ray.remote(num_cpus=0)(_Channel)
        self._channel = channel_cls.remote()
        if self._stop_asked:  # a signal between the check above and the channel's creation
            self._channel.set_stop.remote()
        task = ray.remote(_ray_worker).options(
            num_cpus=resources.cpus,
            num_gpus=resources.gpus,
            max_retries=self.max_task_retries,
            name="harness-worker",
        )
        for i in range(n_workers):
            o = worker_options(opts, i, resources)
            if resources.gpus > 0 and not o.device:
                o.device = "cuda"  # Ray sets CUDA_VISIBLE_DEVICES to the GPU(s) it granted
            self.refs.append(task.remote(o, self._channel))

    def events(self, timeout: float) -> list[Event]:
        if self._channel is None:  # stopped before any worker started
            return []
        deadline = time.monotonic() + timeout
        while True:
            out: list[Event] = self.ray.get(self._channel.drain.remote())
            out += self._task_failures()
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _task_failures(self) -> list[Event]:
        """A task that ended in an error (its process died beyond Ray's retries): a crash."""
        if not self.refs:
            return []
        done, _ = self.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        out: list[Event] = []
        for ref in done:
            if ref in self._reported:
                continue
            self._reported.add(ref)
            try:
                self.ray.get(ref)
            except Exception as err:
                reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                out.append(
                    {"event": "crash", "worker": self.refs.index(ref), "reason": reason[:300]}
                )
        return out

    def running(self) -> int:
        if not self.refs or self._closed:
            return 0
        _, pending = self.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(pending)

    def request_stop(self) -> None:
        self._stop_asked = True
        if self._channel is not None:
            self._channel.set_stop.remote()

    def terminate(self) -> None:
        for ref in self.refs:
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._closed:  # closed already (a refusal, then the caller's own close)
            return
        ray = self.ray
        try:
            if self.refs:
                _, pending = ray.wait(self.refs, num_returns=len(self.refs), timeout=60)
                for ref in pending:
                    ray.cancel(ref, force=True)
            if self._channel is not None:
                ray.kill(self._channel)
        finally:
            self._closed = True
            if self._started_ray:
                ray.shutdown()
