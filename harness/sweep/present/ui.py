"""`harness ui`: the MLflow UI and optuna-dashboard for this project's stores, on 127.0.0.1.

Secrets never go on a command line. A store URL may carry a password
(``postgresql://user:PASS@host/db``), and every local user can read any process's argv in
``/proc/<pid>/cmdline``; the environment (``/proc/<pid>/environ``) is readable by the owner
only. So the MLflow server gets its store through ``MLFLOW_BACKEND_STORE_URI`` (an option
``mlflow server`` reads from the environment) and optuna-dashboard is started through
:func:`serve_dashboard` (``python -m harness.sweep.present.ui``), which reads the storage from
``HARNESS_DASHBOARD_STORAGE`` and pins ``postgresql://`` to the installed psycopg2 driver (plain
``optuna-dashboard postgresql://...`` dies with "Failed to import DB access module" under
SQLAlchemy 2.1, whose default PostgreSQL driver is psycopg 3).

The servers run in their own sessions and are stopped, whole process groups, on every exit
path: normal return, Ctrl-C, SIGTERM, SIGHUP, an exception; and, if ``harness ui`` itself is
SIGKILLed, the kernel sends each server SIGTERM (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import typer
from optuna.storages.journal import JournalFileBackend

from harness.core.db import sqlalchemy_url
from harness.core.redact import redact_url
from harness.sweep.present.mlflow_view import VIEW_KEY
from harness.sweep.stores.journal_lock import journal_lock
from harness.sweep.stores.opening import check_store_urls
from harness.sweep.stores.storage import JOURNAL_FILE
from harness.tracking import default_tracking_uri

STORAGE_ENV = "HARNESS_DASHBOARD_STORAGE"
# MLflow 3 starts a job runner and 7 huey consumers unless told not to: 13 processes and about
# 2.7 GB, against 2 processes and about 490 MB with job execution off (measured on 3.17).
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
# The MLflow 3 UI opens an experiment in its GenAI view (traces) unless asked for the
# "Model training" one, where runs, grouping and charts live.
ML_VIEW = "workflowType=machine_learning"
START_TIMEOUT_S = 180
LANDING_TIMEOUT_S = 180


@dataclass
class Server:
    """One server to start: its argv holds no secret; ``env`` (added to ours) may."""

    name: str
    argv: list[str]
    url: str
    env: dict[str, str] = field(default_factory=dict)

    def shown(self) -> str:
        """The command as printed: environment first, any password redacted."""
        env = " ".join(f"{k}={redact_url(v)}" for k, v in self.env.items())
        return f"{env} {' '.join(self.argv)}".strip()


def _servers(
    *,
    host: str,
    port: int,
    dashboard_port: int,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
) -> list[Server]:
    uri = tracking_uri or default_tracking_uri(results_dir)
    bindir = Path(sys.executable).parent
    mlflow_bin = (
        str(bindir / "mlflow")
        if (bindir / "mlflow").exists()
        else (shutil.which("mlflow") or "mlflow")
    )
    servers: list[Server] = []
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow tracking server already at {redact_url(uri)}: open it in a browser")
    else:
        # `--workers 1`: the default starts 4 uvicorn workers for a UI that one person reads.
        servers.append(
            Server(
                "mlflow",
                [
                    mlflow_bin,
                    "server",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--default-artifact-root",
                    str((results_dir / "mlartifacts").resolve()),
                ],
                f"http://{host}:{port}",
                {"MLFLOW_BACKEND_STORE_URI": sqlalchemy_url(uri), **MLFLOW_SERVER_ENV},
            )
        )
    store = storage or str((results_dir / JOURNAL_FILE).resolve())
    if importlib.util.find_spec("optuna_dashboard") is not None:
        servers.append(
            Server(
                "optuna-dashboard",
                [
                    sys.executable,
                    "-m",
                    "harness.sweep.present.ui",
                    "--host",
                    host,
                    "--port",
                    str(dashboard_port),
                ],
                f"http://{host}:{dashboard_port}",
                {STORAGE_ENV: store},
            )
        )
    else:
        typer.echo("optuna-dashboard is not installed (pip install optuna-dashboard) — skipping it")
    return servers


def ui(*, start: bool, **where: Any) -> None:
    """Print the two servers' commands (``where``: :func:`_servers`' arguments); with ``start``,
    run them. The store URLs are checked first (one line for a bad one)."""
    check_store_urls(where["storage"], where["tracking_uri"])
    servers = _servers(**where)
    for s in servers:
        typer.echo(f"{s.name}: {s.shown()}")
    if not start:
        for s in servers:
            if s.name == "mlflow":
                typer.echo(f"then open {s.url}/#/experiments?{ML_VIEW} (the runs view)")
        return
    names = " and ".join(s.name for s in servers)
    typer.echo(f"starting {names}, this can take a minute...")
    with _running(servers) as procs:
        for s, p in zip(servers, procs, strict=True):
            if _wait_ready(s, p):
                for line in _landing_urls(s):
                    typer.echo(f"{s.name}: {line}")
        typer.echo("Ctrl-C stops both")
        _supervise(servers, procs)


def _landing_urls(server: Server) -> list[str]:
    """The pages to open: each experiment's runs (MLflow) or each study (optuna-dashboard)."""
    if server.name != "mlflow":
        return [f"{server.url}/dashboard"]
    try:
        req = urllib.request.Request(
            f"{server.url}/api/2.0/mlflow/experiments/search",
            data=json.dumps({"max_results": 100}).encode(),
            headers={"Content-Type": "application/json"},
        )
        # The server answered /health already: this bound only stops a hang. Its first API
        # answer opens the store and can take tens of seconds on a loaded machine, and a
        # timeout here would print the generic page instead of each experiment's.
        with urllib.request.urlopen(req, timeout=LANDING_TIMEOUT_S) as r:
            experiments = json.loads(r.read()).get("experiments", [])
    except (OSError, ValueError):
        experiments = []

    urls = []
    for e in experiments:
        if e.get("name") == "Default":
            continue
        tags = {t["key"]: t.get("value") for t in e.get("tags", [])}
        view = VIEW_KEY if f"mlflow.sharedViewState.{VIEW_KEY}" in tags else None
        urls.append(f"{experiment_url(server.url, e['experiment_id'], view)}   ({e['name']})")
    return urls or [f"{server.url}/#/experiments?{ML_VIEW}"]


def experiment_url(base: str, experiment_id: str, view: str | None = None) -> str:
    """The MLflow 3 page of an experiment's runs (not its GenAI traces view); with ``view``, the
    saved view of that name (a sweep's: children grouped by cell, its metric as a column)."""
    url = f"{base}/#/experiments/{experiment_id}/runs?{ML_VIEW}"
    return f"{url}&viewStateShareKey={view}" if view else url


def _wait_ready(server: Server, proc: subprocess.Popen[bytes]) -> bool:
    """Wait until the server answers HTTP; False if it exited or never answered."""
    probe = f"{server.url}/health" if server.name == "mlflow" else f"{server.url}/api/studies"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(probe, timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def _supervise(servers: list[Server], procs: list[subprocess.Popen[bytes]]) -> None:
    """Run until every server has exited; one that dies does not take the other down."""
    reported: set[int] = set()
    while True:
        for i, (s, p) in enumerate(zip(servers, procs, strict=True)):
            code = p.poll()
            if code is not None and i not in reported:
                reported.add(i)
                typer.echo(f"{s.name} exited with code {code}", err=True)
        if len(reported) == len(procs):
            return
        time.sleep(0.5)


class _Stop(Exception):
    """Raised in the main thread by SIGTERM/SIGHUP so that the servers are stopped."""


@contextmanager
def _running(servers: list[Server]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start the servers; stop them (process groups) however the block is left."""

    def stop_signal(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    old = {sig: signal.signal(sig, stop_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for s in servers:
            procs.append(
                subprocess.Popen(
                    s.argv,
                    env={**os.environ, **s.env},
                    start_new_session=True,  # its own group: stopped whole, not by our Ctrl-C
                    preexec_fn=_die_with_parent,
                )
            )
        yield procs
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        # Further signals must not interrupt the cleanup itself.
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)
        _stop_all(procs)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stop_all(procs: list[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Workers the server forked may outlive it; the group goes in any case.
        _signal_group(p, signal.SIGKILL)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # start_new_session made the server its group's leader
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when ``harness ui`` dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def serve_dashboard(host: str, port: int) -> None:
    """optuna-dashboard over the storage named in ``$HARNESS_DASHBOARD_STORAGE``.

    A journal file path, ``sqlite:///PATH`` or ``postgresql://...`` (pinned to psycopg2).
    """
    import optuna_dashboard  # noqa: PLC0415 - may be absent (ui() checks find_spec): only the dashboard's process loads it

    url = os.environ.get(STORAGE_ENV, "")
    if not url:
        raise SystemExit(f"{STORAGE_ENV} is not set")
    storage: optuna.storages.BaseStorage
    if "://" in url:
        storage = optuna.storages.RDBStorage(sqlalchemy_url(url))
    else:
        backend = JournalFileBackend(os.path.abspath(url), lock_obj=journal_lock(url))
        storage = optuna.storages.JournalStorage(backend)
    optuna_dashboard.run_server(storage, host=host, port=port)


if __name__ == "__main__":  # pragma: no cover - run by `harness ui --start`
    import argparse

    parser = argparse.ArgumentParser(description="optuna-dashboard over $" + STORAGE_ENV)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    serve_dashboard(args.host, args.port)
