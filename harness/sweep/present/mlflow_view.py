"""What a study leaves in MLflow for a person comparing cells in the MLflow UI.

MLflow 3 opens an experiment in its GenAI view and its runs table with no metric column, so a
sweep's experiment gets (once per study, refreshed at the end of every sweep):

* ``mlflow.note.content``: the experiment's description (the experiment page shows it).
* ``mlflow.experimentKind = custom_model_development``: an ML-training experiment.
* ``mlflow.sharedViewState.<VIEW_KEY>``: a saved view of the runs page, opened by
  ``#/experiments/<id>/runs?viewStateShareKey=<VIEW_KEY>``: child runs only, grouped by
  ``ablation.cell`` (MLflow draws each group's mean line with a band over its seeds), the
  experiment's metric as a column (and, for a study whose runs logged ``async/*``, the run
  summaries of the token lag), sorted best first. The format is the one the MLflow 3.17 UI
  writes when a user clicks "Share" on the runs page (a JSON object of its search facets and UI
  state); ``tests/sweep/present/test_ui_browser.py`` opens it in Chromium.

The parent run gets the ranking: per-cell IQM and its 95 % CI and the rank as metrics (one value
each, so they list as columns and compare as bar charts) and the ranking table as its
description (``mlflow.note.content``, rendered as markdown on the run page).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

VIEW_KEY = "harness-cells"
ML_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"
_UNSAFE = re.compile(r"[^\w./\- :]")  # MLflow metric names: alphanumerics, _ . / - space :


def metric_column(key: str) -> str:
    """The runs-table column id MLflow uses for metric ``key``."""
    return f"metrics.`{key}`"


def view_state(metric: str, direction: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The saved runs-page view: children grouped by cell, ``metric`` first, best first;
    ``extra`` run summaries after the fixed columns (the token lags of an asynchronous study)."""
    columns = [
        metric,
        "final/reward",
        "best/reward",
        "final/eval_accuracy",
        "stability/mismatch_kl_k3_mean",  # sampler vs learner: a cell's numerics at a glance
        *extra,
    ]
    columns = list(dict.fromkeys(columns))  # the metric first, no duplicates
    return {
        "searchFilter": "tags.`harness.role` = 'child'",
        "orderByKey": metric_column(metric),
        "orderByAsc": direction == "minimize",
        "selectedColumns": [metric_column(c) for c in columns] + ["tags.`seed`"],
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": "ablation.cell"}],
        },
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "runListHidden": False,
    }


def experiment_tags(
    description: str, metric: str, direction: str, extra: Sequence[str] = ()
) -> dict[str, str]:
    note = description.strip() or "Ablation study run by harness."
    note += (
        "\n\nCompare cells: open the saved view (`harness ui` prints its URL) or group the runs "
        f"by the tag `ablation.cell`, show the column `{metric}`, then the chart view."
    )
    return {
        NOTE_TAG: note,
        "mlflow.experimentKind": ML_KIND,
        f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(view_state(metric, direction, extra)),
    }


def metric_name(text: str) -> str:
    """``text`` made a valid MLflow metric name (cell labels contain ``=``, which is not)."""
    return _UNSAFE.sub(":", text)


def ranking_metrics(rows: Sequence[Any]) -> dict[str, float]:
    """Per cell: ``cell/<label>/iqm``, ``.../iqm_ci_low``, ``.../iqm_ci_high``, ``.../rank``.

    ``rows`` are :class:`harness.report.CellRow` in ranking order (best first). NaNs (a cell with
    no finished run) are left out rather than logged.
    """
    out: dict[str, float] = {}
    for rank, row in enumerate(rows, start=1):
        name = metric_name(row.label)
        values = {
            "iqm": row.iqm.point,
            "iqm_ci_low": row.iqm.low,
            "iqm_ci_high": row.iqm.high,
            "rank": float(rank),
        }
        for key, value in values.items():
            if math.isfinite(value):
                out[f"cell/{name}/{key}"] = float(value)
    return out


def ranking_note(rows: Sequence[Any], metric: str, description: str) -> str:
    """The parent run's description: the ranking as a markdown table."""

    def num(x: float) -> str:
        return f"{x:.4g}" if math.isfinite(x) else "—"

    lines = [description.strip(), ""] if description.strip() else []
    lines += [
        f"Ranking by the IQM of `{metric}` over seeds (95 % bootstrap CI):",
        "",
        "| rank | cell | IQM | 95 % CI | runs used |",
        "|---|---|---|---|---|",
    ]
    for rank, row in enumerate(rows, start=1):
        label = f"`{row.label}`" + (" (baseline)" if row.is_baseline else "")
        ci = f"[{num(row.iqm.low)}, {num(row.iqm.high)}]"
        lines.append(f"| {rank} | {label} | {num(row.iqm.point)} | {ci} | {row.n_used} |")
    lines += ["", "The full report (plots, warnings) is the artifact `report/report.html`."]
    return "\n".join(lines)
