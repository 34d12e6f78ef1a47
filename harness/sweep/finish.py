"""End of a sweep: read the study back, print the ranking, write the report, close the parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.sweep.display import wide_console


def finish_study(
    study: Any,
    tracker: Any,
    payload: dict[str, Any],
    *,
    command: str,
    results_dir: Path,
    write_report: bool = True,
    end_parent: bool = True,
) -> bool:
    """Returns True when every (cell, seed) has finished (completed or diverged)."""
    from harness.report import build_report, ranking, render_ranking_table
    from harness.sweep.results import load_study_data

    tracker.flush()
    data = load_study_data(study, tracker, command=command)
    expected = len(payload["cells"]) * len(payload["seeds"])
    finished = sum(1 for r in data.runs if r.status in ("completed", "diverged"))
    console = wide_console()
    parent = payload.get("parent_run_id")
    if finished:
        rows = ranking(data)
        console.print(render_ranking_table(rows, data))
        if parent:
            _label_in_mlflow(tracker, payload, parent, rows)
    if write_report and finished:
        out_dir = results_dir / study.study_name
        files = build_report(data, out_dir)
        console.print(f"report: {files.markdown} and {files.html}")
        if parent:
            # Only the HTML: MLflow shows markdown as plain text, so the report's images would
            # appear as literal `![...](plots/...)`; the HTML embeds them and MLflow renders it.
            tracker.log_artifact(parent, files.html, "report")
            for png in files.pngs:
                tracker.log_artifact(parent, png, "report/plots")
    complete = finished >= expected
    if parent:
        tracker.set_tags(parent, {"harness.trials_finished": f"{finished}/{expected}"})
        if end_parent:
            tracker.end_run(parent, "FINISHED" if complete else "KILLED")
    tracker.flush()
    return complete


def _label_in_mlflow(tracker: Any, payload: dict[str, Any], parent: str, rows: Any) -> None:
    """The experiment's description and saved cell view; the ranking on the parent run."""
    from harness.sweep.mlflow_view import experiment_tags, ranking_metrics, ranking_note

    description = str(payload.get("description") or "")
    metric, direction = payload["metric"], payload.get("direction", "maximize")
    tracker.set_experiment_tags(
        payload["experiment"], experiment_tags(description, metric, direction)
    )
    tracker.log_metrics(parent, ranking_metrics(rows), step=0)
    tracker.set_tags(parent, {"mlflow.note.content": ranking_note(rows, metric, description)})
