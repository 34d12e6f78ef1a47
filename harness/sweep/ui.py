"""`harness ui`: the MLflow UI and optuna-dashboard for this project's stores, on 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import typer

from harness.redact import redact_url


def _commands(
    host: str,
    port: int,
    dashboard_port: int,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
) -> list[tuple[str, list[str]]]:
    from harness.sweep.storage import JOURNAL_FILE
    from harness.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri(results_dir)
    bindir = Path(sys.executable).parent
    mlflow_bin = (
        str(bindir / "mlflow")
        if (bindir / "mlflow").exists()
        else (shutil.which("mlflow") or "mlflow")
    )
    cmds: list[tuple[str, list[str]]] = []
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow tracking server already at {redact_url(uri)}: open it in a browser")
    else:
        # `mlflow server --workers 1`: the default starts many processes (~3 GB).
        cmds.append(
            (
                "mlflow",
                [
                    mlflow_bin,
                    "server",
                    "--backend-store-uri",
                    uri,
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--default-artifact-root",
                    str((results_dir / "mlartifacts").resolve()),
                ],
            )
        )
    dash_bin = (
        str(bindir / "optuna-dashboard")
        if (bindir / "optuna-dashboard").exists()
        else shutil.which("optuna-dashboard")
    )
    store = storage or str((results_dir / JOURNAL_FILE).resolve())
    if dash_bin:
        cmds.append(
            ("optuna-dashboard", [dash_bin, store, "--host", host, "--port", str(dashboard_port)])
        )
    else:
        typer.echo("optuna-dashboard is not installed (pip install optuna-dashboard) — skipping it")
    return cmds


def ui(
    *,
    start: bool,
    host: str,
    port: int,
    dashboard_port: int,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
) -> None:
    cmds = _commands(host, port, dashboard_port, storage, tracking_uri, results_dir)
    for name, argv in cmds:
        typer.echo(f"{name}: " + " ".join(redact_url(a) if "://" in a else a for a in argv))
    if not start:
        return
    procs = [subprocess.Popen(argv) for _, argv in cmds]
    typer.echo(
        f"MLflow UI: http://{host}:{port}   optuna-dashboard: http://{host}:{dashboard_port}   (Ctrl-C stops both)"
    )
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
