"""The body of ``harness report``: write a study's report again and attach it to its parent
MLflow run."""

from __future__ import annotations

from pathlib import Path

import typer

from harness import tracking
from harness.cli.options import command_line, say
from harness.core.configtools import check_name
from harness.sweep.present.finish import finish_study
from harness.sweep.scheduler.spec import COMMAND_ATTR, load_study_spec
from harness.sweep.stores.opening import check_store_urls, existing_storage, load_existing_study


def write_study_report(
    study: str, *, storage: str | None, tracking_uri: str | None, results_dir: Path
) -> None:
    """Write RESULTS/<study>/report.md (and report.html for a grid) and attach them to the parent
    MLflow run; exit code 1 when no run of the study completed."""
    check_name(study, "study")  # the report goes to RESULTS/<study>/
    check_store_urls(storage, tracking_uri)
    optuna_storage = existing_storage(storage, results_dir, study)
    st = load_existing_study(
        study, optuna_storage, f"study: no study named {study!r} (see `harness status`)"
    )
    spec = load_study_spec(st)
    tracking.probe_tracking_uri(tracking_uri)
    tracker = tracking.open_tracker(tracking_uri, results_dir)
    finished = finish_study(
        st,
        tracker,
        spec,
        command=st.user_attrs.get(COMMAND_ATTR, command_line()),
        results_dir=results_dir,
        write_report=True,
        end_parent=False,
    )
    if not finished.completed:
        say(f"study {study!r}: no run completed")
        raise typer.Exit(1)
