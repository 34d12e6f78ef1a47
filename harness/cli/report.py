"""``harness report``: write a study's report again (and attach it to its parent MLflow run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, Storage, TrackingUri, command_line, say, user_errors


@user_errors
def report_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Write results/<study>/report.md (and report.html for a grid) and attach them to the parent
    MLflow run.  Exit code 1 when no run of the study completed: the report is still written and
    says why (each distinct failure reason with its count, also printed on stderr)."""
    import optuna

    from harness import tracking
    from harness.core.configtools import ConfigError, check_name
    from harness.sweep.present.finish import finish_study
    from harness.sweep.scheduler.spec import COMMAND_ATTR, load_study_spec
    from harness.sweep.stores.opening import check_store_urls, existing_storage

    check_name(study, "study")  # the report goes to RESULTS/<study>/
    check_store_urls(storage, tracking_uri)
    optuna_storage = existing_storage(storage, results_dir, study)
    try:
        st = optuna.load_study(study_name=study, storage=optuna_storage)
    except KeyError:
        raise ConfigError(f"study: no study named {study!r} (see `harness status`)") from None
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
