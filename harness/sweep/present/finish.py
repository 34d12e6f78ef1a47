"""End of a sweep (and ``harness report``): read the study back, print the ranking (a grid) or
the best point / Pareto front (a search), say why runs failed, write the report, close the
parent run.

A study in which no run completed still gets a report: it says so and lists the distinct
failure reasons with their counts (the console prints the same lines on stderr)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.table import Table

from harness.core.failures import count_reasons, reason_lines, summary_lines
from harness.core.fsutil import atomic_write, ensure_results_dir
from harness.report import build_report, ranking, render_ranking_table
from harness.report.adaptive import adaptive_lines
from harness.report.allocation import settled
from harness.report.studydata import StudyData
from harness.report.tables import ASYNC_SUMMARY_COLUMNS, logged_columns
from harness.sweep.present.display import wide_console
from harness.sweep.present.mlflow_view import experiment_tags, ranking_metrics, ranking_note
from harness.sweep.scheduler.adaptive import apply_allocation
from harness.sweep.scheduler.results import load_study_data
from harness.sweep.scheduler.spec import StudySpec
from harness.sweep.scheduler.study import (
    search_front,
    search_seed_values,
    seed_spread,
    top_of_front,
)
from harness.sweep.scheduler.trials import SPENT_OUTCOMES
from harness.tracking import Tracker


@dataclass(frozen=True)
class Finished:
    """How a study stands after ``finish_study``: ``complete`` when every (cell, seed) finished
    (completed or diverged), or a search's ``n_trials`` ended (COMPLETE, PRUNED, or diverged);
    ``completed``
    counts the runs (grid) or trials (search) that completed with a result."""

    complete: bool
    completed: int


def _say_failures(reasons: list[str], total: int, finished: int, what: str) -> None:
    # plain stderr, not rich: a reason is the user's text and may hold [markup]
    for line in summary_lines(reasons, total, finished=finished, what=what):
        print(line, file=sys.stderr)


def finish_study(
    study: optuna.Study,
    tracker: Tracker,
    spec: StudySpec,
    *,
    command: str,
    results_dir: Path,
    write_report: bool = True,
    end_parent: bool = True,
) -> Finished:
    """Print the ranking and the failures, write the report, tag and end the parent run."""
    report_dir = results_dir / study.study_name if write_report else None
    if spec.kind == "search":
        return _finish_search(study, tracker, spec, report_dir, end_parent=end_parent)

    tracker.flush()
    states = None
    if spec.adaptive is not None:
        states = apply_allocation(study, spec)  # cancels what a last decision left held
    data = load_study_data(study, tracker, command=command)
    expected = spec.expected_trials
    if states is not None:
        expected = sum(s.released for s in states.values())
    finished = sum(1 for r in data.runs if r.status in ("completed", "diverged"))
    completed = sum(1 for r in data.runs if r.status == "completed")
    failed = [r.reason for r in data.runs if r.status == "failed"]
    console = wide_console()
    parent = spec.parent_run_id
    if finished:
        rows = ranking(data)
        console.print(render_ranking_table(rows, data))
        if parent:
            _label_in_mlflow(tracker, spec, parent, rows, data)
    _say_failures(failed, expected, completed, "run")
    if report_dir is not None and (finished or failed):
        files = build_report(data, report_dir)
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
    if states is not None:  # complete when every cell is decided or at max
        complete = settled(states)
        for line in adaptive_lines(data):
            print(f"  {line}")  # plain print: labels are the user's text
    if parent:
        tracker.set_tags(parent, {"harness.trials_finished": f"{finished}/{expected}"})
        if end_parent:
            _end_parent(tracker, parent, complete)
    tracker.flush()
    return Finished(complete=complete, completed=completed)


OUTCOME_TAG = "harness.outcome"  # how the sweep's last command ended, on the parent run


def _end_parent(tracker: Tracker, parent: str, complete: bool) -> None:
    tracker.set_tags(parent, {OUTCOME_TAG: "complete" if complete else "incomplete"})
    tracker.end_run(parent, "FINISHED" if complete else "KILLED")


def _label_in_mlflow(
    tracker: Tracker, spec: StudySpec, parent: str, rows: Any, data: StudyData
) -> None:
    """The experiment's description and saved cell view (with the token-lag columns when the
    study's runs logged them, as the report's stability table); the ranking on the parent."""
    lags = [key for key, _ in logged_columns(data, ASYNC_SUMMARY_COLUMNS)]
    tracker.set_experiment_tags(
        spec.experiment, experiment_tags(spec.description, spec.metric, spec.direction, lags)
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


def _finish_search(
    study: optuna.Study,
    tracker: Tracker,
    spec: StudySpec,
    report_dir: Path | None,
    *,
    end_parent: bool,
) -> Finished:
    """Print the best point (or the Pareto front) and the failures, log the best point on the
    parent run, write report.md into ``report_dir`` (None: no report)."""
    console = wide_console()
    tracker.flush()
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    failed = [
        str(t.user_attrs.get("reason", ""))
        for t in trials
        if t.state == TrialState.FAIL and t.user_attrs.get("outcome") not in ("diverged",)
    ]
    parent = spec.parent_run_id
    objectives = spec.objectives

    spent = sum(
        t.state == TrialState.FAIL and t.user_attrs.get("outcome") in SPENT_OUTCOMES for t in trials
    )
    done = len(complete) + len(pruned) + spent >= spec.expected_trials
    best = search_front(study, spec)
    if best:
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
        top = top_of_front(best, spec)
        console.print(
            f"trial {top.number}: " + seed_spread(search_seed_values(top), what=objectives[0][0]),
            markup=False,
        )
    else:
        console.print("no completed trial yet")
    _say_failures(failed, spec.expected_trials, len(complete), "trial")
    if report_dir is not None and (complete or failed):
        path = write_search_report(study, spec, best, report_dir)
        console.print(f"report: {path}")
        if parent:
            tracker.log_artifact(parent, path, "report")
    if parent and best:
        top = top_of_front(best, spec)
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
    if parent and end_parent and (best or failed):
        _end_parent(tracker, parent, done)
    tracker.flush()
    return Finished(complete=done, completed=len(complete))


def write_search_report(
    study: optuna.Study, spec: StudySpec, best: list[Any], out_dir: Path
) -> Path:
    """``report.md`` of a search: objectives, the best point(s) with the best point's seed
    spread, why trials failed, and every trial."""
    ensure_results_dir(out_dir)
    assert spec.search is not None

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)

    def md(text: str) -> str:  # the user's text in a table cell or bullet: one line, no pipes
        return " ".join(str(text).split()).replace("|", r"\|")

    trials = study.get_trials(deepcopy=False)
    failed = [
        str(t.user_attrs.get("reason", ""))
        for t in trials
        if t.state == TrialState.FAIL and t.user_attrs.get("outcome") != "diverged"
    ]
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
    ]
    if best:
        lines += [
            "| trial | " + " | ".join(names) + " | params |",
            "|---|" + "---|" * len(names) + "---|",
        ]
        for t in best:
            values = " | ".join(cell(v) for v in t.values)
            lines.append(f"| {t.number} | {values} | {_fmt_point(t.params)} |")
        top = top_of_front(best, spec)
        lines += [
            "",
            f"Trial {top.number}, seed by seed: "
            + seed_spread(search_seed_values(top), what=f"`{spec.objectives[0][0]}`")
            + ". The objective Optuna ranks by is the mean over the seeds; with few seeds the "
            "best point is partly the luckiest one, so read its CI before acting on it.",
        ]
    else:
        lines.append(
            f"**No trial completed** ({len(failed)} failed of {len(trials)} run so far): "
            "there is no best point. Why they failed is below."
        )
    if failed:
        lines += ["", "## Why trials failed", ""]
        lines += [f"- {md(line)}" for line in reason_lines(count_reasons(failed), "trial")]
    lines += ["", "## Every trial", "", "| trial | state | seeds run | values | params |"]
    lines.append("|---|---|---|---|---|")
    for t in trials:
        values = ", ".join(cell(v) for v in (t.values or []))
        if not values and t.intermediate_values:
            values = f"{cell(list(t.intermediate_values.values())[-1])} (last seed mean)"
        seeds_run = t.user_attrs.get("seeds_run", "")
        lines.append(
            f"| {t.number} | {t.state.name} | {seeds_run} | {values} | {_fmt_point(t.params)} |"
        )

    return atomic_write(out_dir / "report.md", "\n".join(lines) + "\n")
