"""The token lag of asynchronous rollouts (rollout.async) in the run summaries, the report's
stability table and the saved MLflow view: present, with per-cell values, for a study whose runs
logged async/*; absent (the table, its paragraph and the view unchanged) for one that did not."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from harness.metrics.stability import summarize_run
from harness.report import build_report, ranking, summary_table
from harness.sweep.present.finish import _label_in_mlflow
from harness.sweep.present.mlflow_view import VIEW_KEY, experiment_tags, view_state
from harness.tracking import MemoryTracker
from tests.fixtures import synthetic

LAGS = ("token lag (mean)", "token lag (max)", "mixed-version frac")


def test_run_summary_of_the_lags():
    nan = math.nan
    history = {
        "objective/reward": [0.1, 0.2, 0.3, 0.4],
        # step 2 logged nothing (NaN): it does not count
        "async/token_lag_mean": [0.0, 1.5, nan, 0.5],
        "async/token_lag_max": [0.0, 2.0, nan, 1.0],
        "async/mixed_version_fraction": [0.0, 0.25, nan, 0.5],
    }
    out = summarize_run(history)
    assert out["stability/token_lag_mean"] == pytest.approx((0.0 + 1.5 + 0.5) / 3)
    assert out["stability/token_lag_max"] == 2.0
    assert out["stability/mixed_version_fraction"] == pytest.approx(0.75 / 3)
    sync = summarize_run({"objective/reward": [0.1, 0.2]})
    assert all(
        math.isnan(sync[k])
        for k in (
            "stability/token_lag_mean",
            "stability/token_lag_max",
            "stability/mixed_version_fraction",
        )
    )


def _async_study():
    """The fixture with lags logged by every run but the first cell's (a synchronous cell of an
    asynchronous study): cell i, seed s has mean lag (i + s)/10, max lag i, mixed (i)/4."""
    study = synthetic.three_cells()
    cells = list(study.cells)
    runs = []
    for r in study.runs:
        i = cells.index(r.cell)
        if i == 0:
            runs.append(r)
            continue
        summary = {
            **r.summary,
            "stability/token_lag_mean": (i + r.seed) / 10,
            "stability/token_lag_max": float(i),
            "stability/mixed_version_fraction": i / 4,
        }
        runs.append(replace(r, summary=summary))
    return replace(study, runs=runs), cells


def test_the_stability_table_gains_the_lag_columns_with_per_cell_means():
    study, cells = _async_study()
    header, rows = summary_table(study)
    assert header[-3:] == list(LAGS)
    by = {row[0]: row for row in rows}
    assert [by[cells[0]][header.index(c)] for c in LAGS] == ["—", "—", "—"]
    for i, cell in enumerate(cells[1:], start=1):
        seeds = [r.seed for r in study.runs_of(cell) if r.status in ("completed", "diverged")]
        want = np.mean([(i + s) / 10 for s in seeds])
        assert float(by[cell][header.index("token lag (mean)")]) == pytest.approx(want, rel=1e-2)
        assert float(by[cell][header.index("token lag (max)")]) == pytest.approx(i)
        assert float(by[cell][header.index("mixed-version frac")]) == pytest.approx(i / 4)


def test_a_study_without_lags_keeps_its_table_and_paragraph(tmp_path):
    plain = synthetic.three_cells()
    header, _ = summary_table(plain)
    assert not set(LAGS) & set(header)
    md = build_report(plain, tmp_path / "plain", n_boot=50, fit=False).markdown.read_text()
    assert "token lag" not in md and "mixed-version" not in md
    study, _ = _async_study()
    md = build_report(study, tmp_path / "async", n_boot=50, fit=False).markdown.read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("| cell | runs | start reward")]
    assert len(table) == 1 and table[0].rstrip(" |").endswith("mixed-version frac")
    assert "token lag = how many updates behind the learner" in md


def test_the_mlflow_view_shows_the_lag_summaries_only_when_asked():
    plain = view_state("final/reward", "maximize")
    lag = view_state("final/reward", "maximize", ["stability/token_lag_mean"])
    assert lag["selectedColumns"][:-1] == [
        *plain["selectedColumns"][:-1],
        "metrics.`stability/token_lag_mean`",
    ]
    assert lag["selectedColumns"][-1] == plain["selectedColumns"][-1] == "tags.`seed`"
    assert experiment_tags("d", "final/reward", "maximize") == experiment_tags(
        "d", "final/reward", "maximize", ()
    )


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_finished_sweep_saves_the_view_with_the_lags_of_an_async_study(asynchronous):
    study = _async_study()[0] if asynchronous else synthetic.three_cells()
    tracker = MemoryTracker()
    parent = tracker.start_run(experiment="exp", run_name="study (study)")
    spec = SimpleNamespace(
        experiment="exp", description="", metric="final/reward", direction="maximize"
    )
    _label_in_mlflow(tracker, spec, parent, ranking(study, n_boot=50), study)  # type: ignore[arg-type]
    view = json.loads(tracker.get_experiment_tags("exp")[f"mlflow.sharedViewState.{VIEW_KEY}"])
    lag_columns = [c for c in view["selectedColumns"] if "token_lag" in c or "mixed_version" in c]
    if asynchronous:
        assert lag_columns == [
            "metrics.`stability/token_lag_mean`",
            "metrics.`stability/token_lag_max`",
            "metrics.`stability/mixed_version_fraction`",
        ]
    else:
        assert lag_columns == []


def test_config_view_reads_the_async_alias_and_leaves_the_block_out_when_off():
    from harness.config import build_run_config
    from harness.core.configtools import to_dict
    from harness.report.configview import held_fixed, mismatch_sources, varied_keys

    base = to_dict(build_run_config({}))
    study = replace(
        synthetic.three_cells(),
        base_config=base,
        axes={"rollout.async.max_staleness": [0, 2]},
        cells={
            "sync": {"rollout.async.max_staleness": 0},
            "eta2": {"rollout.async.max_staleness": 2},
        },
        baseline="sync",
        runs=[],
    )
    assert "rollout.asynchronous.max_staleness" in varied_keys(study)
    kept = dict(held_fixed(study)[0])
    assert "rollout.asynchronous.max_staleness" not in kept  # varied, under either spelling
    assert kept["rollout.asynchronous.clock"] == "virtual"  # acts in the η = 2 cell
    assert mismatch_sources({"rollout.asynchronous.max_staleness": 2}) == [
        "rollout.async (max_staleness 2): tokens lag the learner"
    ]
    off = replace(study, axes={"ppo.eps_clip": [0.1]}, cells={"a": {"ppo.eps_clip": 0.1}})
    kept_off, notes_off = held_fixed(off)
    assert not [k for k, _ in kept_off if k.startswith("rollout.asynchronous.")]
    assert "8 keys: synchronous sampling (rollout.async off)" in notes_off
