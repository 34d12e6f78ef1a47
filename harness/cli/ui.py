"""``harness ui``: the MLflow UI and optuna-dashboard over this project's stores."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, Storage, TrackingUri, user_errors


@user_errors
def ui_cmd(
    start: Annotated[
        bool, typer.Option("--start", help="Start the UIs (default: print the commands).")
    ] = False,
    host: Annotated[
        str,
        typer.Option("--host", help="Interface to bind (127.0.0.1 unless you mean to expose it)."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="MLflow UI port.")] = 5000,
    dashboard_port: Annotated[
        int, typer.Option("--dashboard-port", help="optuna-dashboard port.")
    ] = 8080,
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Print (or start) the MLflow UI and optuna-dashboard for this project's stores."""
    from harness.sweep.present.ui import ui  # noqa: PLC0415 - a command's body loads when it runs

    ui(
        start=start,
        host=host,
        port=port,
        dashboard_port=dashboard_port,
        storage=storage,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
    )
