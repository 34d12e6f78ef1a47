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

import time
from typing import Any

from harness.configtools import ConfigError
from harness.sweep.worker import Event, WorkerOptions, worker_loop

INSTALL_HINT = "pip install 'harness[ray]'"
# How often a Ray worker asks the channel whether to stop (a cheap actor call).
STOP_POLL_S = 0.5


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--launcher ray: Ray is not installed ({INSTALL_HINT})") from None
    return ray


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

    from harness.perf import tune_malloc

    tune_malloc()
    last = [0.0, False]

    def should_stop() -> bool:
        now = time.monotonic()
        if now - float(last[0]) >= STOP_POLL_S:
            try:
                last[1] = bool(ray.get(channel.stopped.remote(), timeout=10))
            except Exception:  # the coordinator is gone: stop as if asked
                last[1] = True
            last[0] = now
        return bool(last[1])

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

    def start(self, n_workers: int, opts: Any, resources: Any) -> None:
        from harness.sweep.launch import worker_options

        ray = self.ray
        if not ray.is_initialized():
            try:
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
        channel_cls = ray.remote(num_cpus=0)(_Channel)
        self._channel = channel_cls.remote()
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
        if self._channel is not None:
            self._channel.set_stop.remote()

    def terminate(self) -> None:
        for ref in self.refs:
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
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


def check_shareable(
    storage: str | None, tracking_uri: str | None, *, address: str | None, shared_fs: bool
) -> None:
    """Refuse stores that workers on other Ray nodes cannot reach: the journal file or a SQLite
    path (Optuna storage or MLflow) on this machine's disk.  A Ray started here (no address) is
    one machine; ``--shared-fs`` says the results directory is on a filesystem every node sees."""
    if address is None or shared_fs:
        return
    local = []
    if storage in (None, "journal") or (storage or "").startswith("sqlite"):
        local.append(f"--storage {storage or 'journal'}")
    if tracking_uri is None or tracking_uri.startswith("sqlite"):
        local.append(f"--tracking-uri {tracking_uri or 'sqlite (default)'}")
    if local:
        raise ConfigError(
            f"--launcher ray: {' and '.join(local)} is a file on this machine that workers on "
            "other Ray nodes may not see; use --storage postgresql://... and --tracking-uri "
            "http://MLFLOW:5000 (or postgresql://...), or pass --shared-fs if RESULTS is on a "
            "filesystem every node mounts"
        )
