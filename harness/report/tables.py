"""The report's tables of numbers per cell (run-level summaries, pass@k, the correction's and
the mismatch's statistics) and ``runs.csv``, every run one row."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.report.configview import cell_config, study_has_mismatch
from harness.report.factors import cell_choices
from harness.report.format import fmt, value_str
from harness.report.scores import _mean_finite
from harness.report.series import step_matrix
from harness.report.studydata import CellRow, StudyData

SUMMARY_COLUMNS = (
    ("start/reward", "start reward"),
    ("final/reward", "final reward"),
    ("best/reward", "best reward"),
    ("final/eval_accuracy", "eval acc"),
    ("start/eval_reward", "start eval reward"),
    ("final/eval_reward", "final eval reward"),
    ("stability/entropy_ratio", "entropy end/start"),
    ("stability/mean_approx_kl", "mean KL"),
    ("stability/max_approx_kl", "max KL"),
    ("stability/kl_spikes", "KL spikes"),
    ("stability/grad_norm_spikes", "grad-norm spikes"),
    ("stability/mean_clipfrac", "clip frac (mean)"),
    ("stability/max_drawdown", "max drawdown"),
)

# Columns a study has only when its runs measured them: the training–inference mismatch
# (rollout.measure_mismatch; absent from studies recorded before it existed and from TRL runs).
OPTIONAL_SUMMARY_COLUMNS = (
    ("stability/mismatch_kl_k3_mean", "mismatch KL (mean)"),
    ("stability/mismatch_kl_k3_max", "mismatch KL (max)"),
)


# The per-token lag of asynchronous rollouts (rollout.async): only studies whose runs logged
# async/* have them; a synchronous or strictly lagged cell of such a study shows no value.
ASYNC_SUMMARY_COLUMNS = (
    ("stability/token_lag_mean", "token lag (mean)"),
    ("stability/token_lag_max", "token lag (max)"),
    ("stability/mixed_version_fraction", "mixed-version frac"),
)


def logged_columns(data: StudyData, columns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``columns`` some run of the study has a finite run summary for."""
    return [
        (key, label)
        for key, label in columns
        if any(math.isfinite(r.summary.get(key, math.nan)) for r in data.runs)
    ]


def _columns(data: StudyData) -> list[tuple[str, str]]:
    logged = logged_columns(data, OPTIONAL_SUMMARY_COLUMNS)
    present = logged if study_has_mismatch(data) else []
    return [*SUMMARY_COLUMNS, *present, *logged_columns(data, ASYNC_SUMMARY_COLUMNS)]


def summary_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """Per cell: the mean over its completed and diverged runs of each run-level summary (the
    optional columns only where some run of the study has the summary)."""
    columns = _columns(data)
    header = ["cell", "runs"] + [label for _, label in columns]
    rows = []
    for cell in data.cells:
        runs = [r for r in data.runs_of(cell) if r.status in ("completed", "diverged")]
        values = [
            fmt(_mean_finite(r.summary.get(key, math.nan) for r in runs)) for key, _ in columns
        ]
        rows.append([cell, str(len(runs)), *values])
    return header, rows


# Sampled evaluation (eval.samples > 0): pass@k before training is the start of the final's.
EVAL_SAMPLED_COLUMNS = (
    ("start/eval_pass_at_1", "pass@1 start"),
    ("final/eval_pass_at_1", "pass@1 final"),
    ("start/eval_pass_at_k", "pass@k start"),
    ("final/eval_pass_at_k", "pass@k final"),
)

# Per-step statistics of the correction and of the mismatch's parts, averaged over a run's
# logged steps: (history key, column label, when it means something).
CORRECTION_COLUMNS = (
    ("policy/correction_masked_frac", "masked frac"),
    ("policy/correction_truncated_frac", "truncated frac"),
    ("policy/behave_weight_min", "weight min"),
    ("policy/behave_weight_max", "weight max"),
    ("policy/behave_ess", "weight ESS"),
)
MISMATCH_SPLIT_COLUMNS = (
    ("mismatch/numerics_kl_k3", "numerics KL (k3)"),
    ("mismatch/lag_kl_k3", "policy-lag KL (k3)"),
)


def _run_mean(run: Any, key: str) -> float:
    """Mean of a run's finite logged values of ``key`` (NaN when it logged none)."""
    a = step_matrix([run], key)[0]
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def measured_table(
    data: StudyData, columns: Sequence[tuple[str, str]], *, history: bool
) -> tuple[list[str], list[list[str]]] | None:
    """Per cell, the mean over its completed and diverged runs of each column some run of the
    study measured (a run summary, or the run's mean over steps of a logged metric with
    ``history``); None when no run measured any of them."""

    def value(run: Any, key: str) -> float:
        return _run_mean(run, key) if history else run.summary.get(key, math.nan)

    ran = [r for r in data.runs if r.status in ("completed", "diverged")]
    present = [(k, lab) for k, lab in columns if any(math.isfinite(value(r, k)) for r in ran)]
    if not present:
        return None
    rows = []
    for cell in data.cells:
        runs = [r for r in data.runs_of(cell) if r.status in ("completed", "diverged")]
        rows.append(
            [cell, str(len(runs))]
            + [fmt(_mean_finite(value(r, k) for r in runs)) for k, _ in present]
        )
    return ["cell", "runs"] + [lab for _, lab in present], rows


def with_k(
    data: StudyData, header: list[str], rows: list[list[str]]
) -> tuple[list[str], list[list[str]], str]:
    """The pass@k table with its k said: in the column names when every cell has the same
    ``eval.k``, in a column of its own when they differ; and how the paragraph names k."""
    ks = {c: cell_config(data, c).get("eval.k") for c in data.cells}
    distinct = set(ks.values())
    if distinct == {None}:
        return header, rows, "k = `eval.k`, not recorded in this study"
    if len(distinct) == 1:
        (k,) = distinct
        return [h.replace("pass@k", f"pass@{k}") for h in header], rows, f"k = `eval.k` = {k}"
    by_label = dict(zip(data.cells, rows, strict=True))
    return (
        [*header[:2], "k", *header[2:]],
        [
            [*row[:2], value_str(ks[c]) if ks[c] is not None else "—", *row[2:]]
            for c, row in by_label.items()
        ],
        "k = `eval.k`, per cell in the column k",
    )


RUNS_CSV = "runs.csv"


def runs_csv(data: StudyData, rows: Sequence[CellRow]) -> str:
    """Every run of the study, one row each, for notebooks: its cell, the axis levels, seed,
    task, status, the score the ranking used, the reason of a failed or diverged run, wall time,
    and every run-level summary any run logged (empty where a run has none)."""
    choices = cell_choices(data) or {}
    axes = list(data.axes) if choices else []
    keys = sorted({k for r in data.runs for k in r.summary})
    score_of: dict[tuple[str, str, int], float] = {}
    for row in rows:
        for run, v in zip(data.runs_of(row.label), row.scores, strict=True):
            score_of[(run.cell, run.task, run.seed)] = v
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cell", *axes, "seed", "task", "status", "score", "reason", "wall_time", *keys])

    def num(x: float) -> str:
        return repr(float(x)) if math.isfinite(x) else ""

    for r in data.runs:
        w.writerow(
            [
                r.cell,
                *(choices.get(r.cell, {}).get(a, "") for a in axes),
                r.seed,
                r.task,
                r.status,
                num(score_of.get((r.cell, r.task, r.seed), math.nan)),
                r.reason,
                num(r.wall_time),
                *(num(r.summary.get(k, math.nan)) for k in keys),
            ]
        )
    return buf.getvalue()
