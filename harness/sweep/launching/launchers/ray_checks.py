"""What ``--launcher ray`` checks before any store is opened: that Ray is installed, that
workers on other nodes can reach the stores, that the cluster's address answers, and (once the
launcher has joined the cluster, :func:`check_placement`) that a node can hold one worker.

Apart from the launcher (``ray_launcher.py``), which runs the worker loop and so loads Optuna:
``launch_checks`` imports these, and ``harness run`` imports ``launch_checks``."""

from __future__ import annotations

import socket
from typing import Any

from harness.core.configtools import ConfigError

INSTALL_HINT = "pip install 'harness[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--launcher ray: Ray is not installed ({INSTALL_HINT})") from None
    return ray


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


# How long `--ray-address` may take to accept a TCP connection before the sweep is refused.
PROBE_TIMEOUT_S = 5.0


def split_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT`` or ``ray://HOST:PORT`` → (host, port); None for ``auto``
    (Ray looks the cluster up itself).  Anything else is a ConfigError."""
    if address == "auto":
        return None
    rest = address.split("://", 1)[1] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--ray-address: must be HOST:PORT (the head's GCS port, e.g. head:6379), "
            f"ray://HOST:PORT or auto; got {address!r}"
        )
    return host, int(port)


def probe_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One TCP connection to the cluster's address, bounded by ``timeout``: an address where
    nothing listens is refused before any study is created (``ray.init`` would instead retry
    the GCS for many minutes, printing warnings)."""
    hostport = split_address(address)
    if hostport is None:
        return
    try:
        with socket.create_connection(hostport, timeout=timeout):
            return
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
    except OSError as err:
        reason = err.strerror or type(err).__name__
    raise ConfigError(
        f"--ray-address: cannot connect to {address} ({reason}); is the Ray head running "
        "(ray start --head --port PORT)?"
    )


def check_placement(nodes: list[dict[str, Any]], gpus: float, cpus: float) -> None:
    """Refuse ``--gpus-per-worker`` / ``--cpus-per-worker`` that no node of the cluster can
    give one worker: Ray keeps an infeasible task pending for ever, so the sweep would wait
    without a word.  ``nodes`` is ``ray.nodes()`` (dead nodes are skipped); a private Ray
    counts what it detected on this machine.  The cluster is judged as it is at launch: an
    autoscaler that would add larger nodes on demand is not asked."""
    alive = [n.get("Resources") or {} for n in nodes if n.get("Alive", True)]
    have = [(float(r.get("GPU", 0.0)), float(r.get("CPU", 0.0))) for r in alive]
    for flag, asked, col, unit in (
        ("--gpus-per-worker", gpus, 0, "GPU"),
        ("--cpus-per-worker", cpus, 1, "CPU"),
    ):
        if asked <= 0:
            continue
        per_node = [h[col] for h in have]
        most = max(per_node, default=0.0)
        if most >= asked:
            continue
        summary = f"nodes: {len(have)}, {unit}s: {_num(sum(per_node))}"
        if most <= 0:
            raise ConfigError(
                f"{flag}: {_num(asked)} asked per worker, but no node of the Ray cluster has "
                f"a {unit} ({summary})"
            )
        raise ConfigError(
            f"{flag}: {_num(asked)} asked per worker, but no node of the Ray cluster has that "
            f"many (at most {_num(most)} on one node; {summary})"
        )
    if gpus > 0 and cpus > 0 and not any(g >= gpus and c >= cpus for g, c in have):
        raise ConfigError(
            f"--cpus-per-worker: {_num(cpus)} asked per worker with --gpus-per-worker "
            f"{_num(gpus)}, but no node of the Ray cluster has both (GPUs/CPUs of its "
            f"{len(have)} nodes: {_shown(have)})"
        )


def _num(x: float) -> str:
    return f"{x:g}"


def _shown(have: list[tuple[float, float]], most: int = 8) -> str:
    shown = ", ".join(f"{_num(g)}/{_num(c)}" for g, c in have[:most])
    return shown + (f", ... ({len(have) - most} more)" if len(have) > most else "")
