"""``harness report``: write a study's report again (and attach it to its parent MLflow run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, Storage, TrackingUri, user_errors


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
    from harness.cli.commands.report import write_study_report  # noqa: PLC0415 - a command's body loads when it runs

    write_study_report(study, storage=storage, tracking_uri=tracking_uri, results_dir=results_dir)
