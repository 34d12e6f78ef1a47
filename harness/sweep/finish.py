"""End of a sweep (and ``harness report``): read the study back, print the ranking (a grid) or
the best point / Pareto front (a search), write the report, close the parent run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.sweep.display import wide_console
from harness.sweep.spec import StudySpec


def finish_study(
    study: Any,
    tracker: Any,
    spec: StudySpec,
    *,
    command: str,
    results_dir: Path,
    write_report: bool = True,
    end_parent: bool = True,
) -> bool:
    """Returns True when the study is done: every (cell, seed) finished (completed or
    diverged), or a search's ``n_trials`` COMPLETE or PRUNED."""
    if spec.kind == "search":
        return finish_search(
            study,
            tracker,
            spec,
            results_dir=results_dir,
            write_report=write_report,
            end_parent=end_parent,
        )
    from harness.report import build_report, ranking, render_ranking_table
    from harness.sweep.results import load_study_data

    tracker.flush()
    data = load_study_data(study, tracker, command=command)
    expected = spec.expected_trials
    finished = sum(1 for r in data.runs if r.status in ("completed", "diverged"))
    console = wide_console()
    parent = spec.parent_run_id
    if finished:
        rows = ranking(data)
        console.print(render_ranking_table(rows, data))
        if parent:
            _label_in_mlflow(tracker, spec, parent, rows)
    if write_report and finished:
        out_dir = results_dir / study.study_name
        files = build_report(data, out_dir)
        console.print(f"report: {files.markdown} and {files.html}")
        if parent:
            # Only the HTML: MLflow shows markdown as plain text, so the report's images would
            # appear as literal `![...](plots/...)`; the HTML embeds them and MLflow renders it.
            tracker.log_artifact(parent, files.html, "report")
            for png in files.pngs:
                try:
                    tracker.log_artifact(parent, png, "report/plots")
                except FileNotFoundError:
                    pass  # a concurrent report of this study no longer draws it (its HTML has it)
    complete = finished >= expected
    if parent:
        tracker.set_tags(parent, {"harness.trials_finished": f"{finished}/{expected}"})
        if end_parent:
            _end_parent(tracker, parent, complete)
    tracker.flush()
    return complete


OUTCOME_TAG = "harness.outcome"  # how the sweep's last command ended, on the parent run


def _end_parent(tracker: Any, parent: str, complete: bool) -> None:
    tracker.set_tags(parent, {OUTCOME_TAG: "complete" if complete else "incomplete"})
    tracker.end_run(parent, "FINISHED" if complete else "KILLED")


def _label_in_mlflow(tracker: Any, spec: StudySpec, parent: str, rows: Any) -> None:
    """The experiment's description and saved cell view; the ranking on the parent run."""
    from harness.sweep.mlflow_view import experiment_tags, ranking_metrics, ranking_note

    tracker.set_experiment_tags(
        spec.experiment, experiment_tags(spec.description, spec.metric, spec.direction)
    )
    tracker.log_metrics(parent, ranking_metrics(rows), step=0)
    tracker.set_tags(
        parent, {"mlflow.note.content": ranking_note(rows, spec.metric, spec.description)}
    )


def _fmt_point(point: dict[str, Any]) -> str:
    return " ".join(
        f"{k.split('.')[-1]}={v:.4g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
        for k, v in point.items()
    )


def finish_search(
    study: Any,
    tracker: Any,
    spec: StudySpec,
    *,
    results_dir: Path,
    write_report: bool = True,
    end_parent: bool = True,
) -> bool:
    """Print the best point (or the Pareto front), log it on the parent run, write report.md."""
    from optuna.trial import TrialState
    from rich.table import Table

    console = wide_console()
    tracker.flush()
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
    parent = spec.parent_run_id
    objectives = spec.objectives
    total = len(complete) + len(pruned)
    done = total >= spec.expected_trials
    if not complete:
        console.print("no completed trial yet")
        return done
    best = study.best_trials if len(objectives) > 1 else [study.best_trial]
    title = "Pareto front" if len(objectives) > 1 else "best trial"
    table = Table(
        title=f"{study.study_name}: {title} ({len(complete)} complete, {len(pruned)} pruned)"
    )
    table.add_column("trial")
    for metric, direction in objectives:
        table.add_column(f"{metric} ({direction})", justify="right")
    table.add_column("params")
    for t in best:
        table.add_row(str(t.number), *[f"{v:.4g}" for v in t.values], _fmt_point(t.params))
    console.print(table)
    if write_report:
        path = write_search_report(study, spec, best, results_dir / study.study_name)
        console.print(f"report: {path}")
        if parent:
            tracker.log_artifact(parent, path, "report")
    if parent:
        top = best[0]
        tracker.set_tags(
            parent, {"search.best_trial": str(top.number), "search.pareto_size": str(len(best))}
        )
        tracker.log_text(
            parent,
            json.dumps(
                [{"trial": t.number, "values": t.values, "params": t.params} for t in best],
                indent=2,
                default=str,
            ),
            "best_trials.json",
        )
        tracker.log_metrics(
            parent,
            {f"best/{m}": v for (m, _), v in zip(objectives, top.values, strict=True)},
            step=0,
        )
        # Tags, not params: a resumed search may find a better point and tags can change.
        tracker.set_tags(parent, {f"best.{k}": str(v) for k, v in top.params.items()})
        if end_parent:
            _end_parent(tracker, parent, done)
    tracker.flush()
    return done


def write_search_report(study: Any, spec: StudySpec, best: list[Any], out_dir: Path) -> Path:
    """``report.md`` of a search: objectives, the best point(s), and every trial."""
    from harness.fsutil import ensure_results_dir

    ensure_results_dir(out_dir)
    assert spec.search is not None

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)

    names = [f"{m} ({d})" for m, d in spec.objectives]
    lines = [
        f"# Search `{study.study_name}`",
        "",
        spec.description or "",
        "",
        f"{spec.search.n_trials} trials x {len(spec.seeds)} seeds, {spec.steps} steps per run; "
        f"pruner {spec.search.pruner}; grid hash {spec.grid_hash}.",
        "",
        "## " + ("Pareto front" if len(best) > 1 or len(spec.objectives) > 1 else "Best point"),
        "",
        "| trial | " + " | ".join(names) + " | params |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    for t in best:
        values = " | ".join(cell(v) for v in t.values)
        lines.append(f"| {t.number} | {values} | {_fmt_point(t.params)} |")
    lines += ["", "## Every trial", "", "| trial | state | seeds run | values | params |"]
    lines.append("|---|---|---|---|---|")
    for t in study.get_trials(deepcopy=False):
        values = ", ".join(cell(v) for v in (t.values or []))
        if not values and t.intermediate_values:
            values = f"{cell(list(t.intermediate_values.values())[-1])} (last seed mean)"
        seeds_run = t.user_attrs.get("seeds_run", "")
        lines.append(
            f"| {t.number} | {t.state.name} | {seeds_run} | {values} | {_fmt_point(t.params)} |"
        )
    from harness.fsutil import atomic_write

    return atomic_write(out_dir / "report.md", "\n".join(lines) + "\n")
