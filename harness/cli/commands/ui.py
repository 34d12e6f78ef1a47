"""The body of ``harness ui``: the MLflow UI and optuna-dashboard over this project's stores."""

from __future__ import annotations

from pathlib import Path

from harness.sweep.present.ui import ui
from harness.sweep.stores.opening import check_store_urls


def show_uis(
    *,
    start: bool,
    host: str,
    port: int,
    dashboard_port: int,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
) -> None:
    """Print (or, with ``start``, start) the MLflow UI and optuna-dashboard commands."""
    check_store_urls(storage, tracking_uri)
    ui(
        start=start,
        host=host,
        port=port,
        dashboard_port=dashboard_port,
        storage=storage,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
    )
