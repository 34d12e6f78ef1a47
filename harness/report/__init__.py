"""The ablation report: ranking, warnings, conclusion and plots, from a ``StudyData`` alone.

Why it exists: an ablation is only useful when a reader who did not run it can trust its
conclusion.  RL runs are noisy, so every cell is shown as an interval estimate next to its seed
count, its diverged runs and its collapse rate (Agarwal et al. 2021, arXiv 2108.13264), and the
conclusion says plainly when the seeds cannot separate the cells.  ``docs/report.md`` explains
each section; ``docs/stability.md`` defines the statistics (implemented in :mod:`harness.report.stats`).

Only ``StudyData`` goes in (no Optuna, MLflow or torch), so the report can be rebuilt and tested
from stored runs.  Every number in the text is computed here from the data.

Diverged runs (``status == "diverged"``) are never dropped.  By default (``diverged="worst"``)
each one is scored as the worst value of ``data.metric`` observed in the study on the same task
(lowest for ``maximize``, highest for ``minimize``), so a cell that diverges is penalized in its
IQM, mean, median, P(improve) and performance profile instead of being flattered by losing its
worst seed.  ``diverged="exclude"`` leaves them out of the statistics instead.  Either way
``n_diverged`` is printed next to every interval.  Failed (crashed) and unfinished runs have no
score and are excluded, and counted.

The package: :mod:`~harness.report.scores` (run scores, the ranking, curve fits),
:mod:`~harness.report.prose` (warnings, conclusion), :mod:`~harness.report.render` (the terminal
table, the Markdown/HTML writer), :mod:`~harness.report.header`,
:mod:`~harness.report.sections` and :mod:`~harness.report.tables` (the report's sections and
their tables), :mod:`~harness.report.configview` (what the report reads from the
configuration) and :mod:`~harness.report.build` (``build_report``), with
:mod:`~harness.report.stats`, :mod:`~harness.report.plots` and :mod:`~harness.report.series`
(per-step arrays, numpy only) below them.
"""

from __future__ import annotations

from harness.report import stats
from harness.report.build import ReportFiles, build_report
from harness.report.format import fmt, fmt_interval, fmt_pct, fmt_pct_interval
from harness.report.prose import conclusion, no_run_completed, warnings_for
from harness.report.render import render_ranking_table
from harness.report.scores import CurveFitRow, DivergedPolicy, fit_curves, ranking, run_scores
from harness.report.studydata import CellRow
from harness.report.tables import summary_table

__all__ = [
    "CellRow",
    "CurveFitRow",
    "DivergedPolicy",
    "ReportFiles",
    "build_report",
    "conclusion",
    "fit_curves",
    "fmt",
    "fmt_interval",
    "fmt_pct",
    "fmt_pct_interval",
    "no_run_completed",
    "ranking",
    "render_ranking_table",
    "run_scores",
    "stats",
    "summary_table",
    "warnings_for",
]
