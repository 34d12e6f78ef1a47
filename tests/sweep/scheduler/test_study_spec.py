"""The typed study contract: StudySpec round trips, older payloads refused in one line, the one
RunConfig builder, and `status` / `report` on search studies (once a KeyError 'axes' and
miscounted)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError, to_dict
from harness.sweep.scheduler.spec import SPEC_ATTR, StudySpec, load_study_spec
from harness.sweep.scheduler.study import best_point, study_counts
from harness.sweep.stores.storage import make_storage
from tests.support.experiments import search_file, smoke_base

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def spec_search(tmp_path: Path) -> Path:
    return search_file(tmp_path, "spec-search", smoke_base())


def test_grid_spec_round_trips_and_builds_cells() -> None:
    spec = StudySpec.from_experiment(load_experiment(SMOKE), max_retries=2, heartbeat_interval=3)
    assert spec.kind == "grid" and spec.search is None
    assert list(spec.cells) == ["c_clip=none", "c_clip=3"]
    assert spec.seeds == (0, 1) and spec.expected_trials == 4
    back = StudySpec.from_json(spec.to_json())
    assert back == spec
    assert json.loads(spec.to_json())["schema"] == 2
    cfg = back.cell_config("c_clip=3", 1, device="cpu", threads=4)
    assert cfg.ppo.c_clip == 3.0 and cfg.seed == 1 and cfg.steps == 3
    assert cfg.threads == 1  # the config sets threads: a worker's default does not override it
    assert back.cell_config("c_clip=none", 0).ppo.c_clip is None  # no leak from the other cell
    with pytest.raises(ConfigError, match="not a cell"):
        back.cell_config("nope", 0)


def test_search_spec_round_trips_and_samples(tmp_path: Path) -> None:
    spec = StudySpec.from_experiment(load_experiment(spec_search(tmp_path)))
    assert spec.kind == "search" and spec.cells == {}
    assert spec.search is not None and spec.search.n_trials == 2
    assert spec.objectives == (("final/reward", "maximize"),) and spec.expected_trials == 2
    assert StudySpec.from_json(spec.to_json()) == spec
    study = optuna.create_study()
    point = spec.search.suggest(study.ask())
    assert set(point) == {"ppo.eps_clip"} and 0.1 <= point["ppo.eps_clip"] <= 0.3
    assert spec.run_config(point, 0).ppo.eps_clip == point["ppo.eps_clip"]


def test_schema_1_payloads_are_refused_in_one_line(tmp_path: Path) -> None:
    """A study made by harness <= 0.1 stored an untyped spec (no "schema"); reading it is one
    ConfigError line, from the API and from `harness report`, not a guess at missing fields."""
    base = to_dict(load_experiment(SMOKE).base)
    grid = {
        "experiment": "old",
        "grid_hash": "abc",
        "base": base,
        "axes": {"ppo.c_clip": [None, 3.0]},
        "cells": {"c_clip=3": {"ppo.c_clip": 3.0}},
        "seeds": [0],
        "steps": 2,
        "metric": "final/reward",
        "direction": "maximize",
        "heartbeat_interval": 7,
    }
    with pytest.raises(ConfigError, match=r"schema 1 \(an older harness\).*reads schema 2"):
        StudySpec.from_json(json.dumps(grid))
    with pytest.raises(ConfigError, match="schema 3"):
        StudySpec.from_json(json.dumps({**grid, "schema": 3}))
    results = tmp_path / "results"
    study = optuna.create_study(study_name="old", storage=make_storage(None, results))
    study.set_user_attr(SPEC_ATTR, json.dumps(grid))
    r = CliRunner().invoke(app, ["report", "old", "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "schema 1" in lines[0] and "Traceback" not in r.output


def test_search_study_status_report_and_best_point(tmp_path: Path) -> None:
    """`harness report <search study>` was once a KeyError traceback; `harness status`
    showed 2 completed search trials as 1 done of 0."""
    exp = spec_search(tmp_path)
    results = tmp_path / "results"
    runner = CliRunner()
    r = runner.invoke(app, ["search", str(exp), "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="spec-search", storage=make_storage(None, results))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    spec = load_study_spec(study)
    assert spec.kind == "search" and spec.parent_run_id
    counts = study_counts(study, spec)
    assert (counts.done, counts.total, counts.running, counts.failed) == (2, 2, 0, 0)

    r = runner.invoke(app, ["status", "spec-search", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "spec-search" in line and "│" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "spec-search",
        "2",  # done
        "0",  # pruned
        "0",
        "0",
        "0",
        "0",
        "2",
    ]

    report = results / "spec-search" / "report.md"
    report.unlink()
    r = runner.invoke(app, ["report", "spec-search", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    text = report.read_text()
    assert (
        "## Best point" in text
        and "| 0 | COMPLETE | 1 |" in text
        and "| 1 | COMPLETE | 1 |" in text
    )

    best = best_point(study, spec)
    assert best is not None and best.label == f"trial {study.best_trial.number}"
    assert best.value == pytest.approx(study.best_value)
    assert spec.run_config(best.overrides, 0).ppo.eps_clip == study.best_params["ppo.eps_clip"]


def test_grid_best_point_is_the_top_of_the_ranking(tmp_path: Path) -> None:
    spec = StudySpec.from_experiment(load_experiment(SMOKE))
    study = optuna.create_study(direction="maximize")
    for cell, seed, value in [
        ("c_clip=none", 0, 0.2),
        ("c_clip=none", 1, 0.4),
        ("c_clip=3", 0, 0.5),
        ("c_clip=3", 1, 0.0),
    ]:
        t = study.ask()
        t.set_user_attr("cell", cell)
        t.set_user_attr("seed", seed)
        t.set_user_attr("outcome", "completed")
        t.set_user_attr("summary", json.dumps({"final/reward": value}))
        study.tell(t, value)
    study.set_user_attr(SPEC_ATTR, spec.to_json())
    best = best_point(study, load_study_spec(study))
    assert best is not None and best.label == "c_clip=none" and best.seeds == 2
    assert best.value == pytest.approx(0.3) and best.overrides == {"ppo.c_clip": None}


def test_report_on_a_study_the_harness_did_not_make_is_one_line(tmp_path: Path) -> None:
    results = tmp_path / "results"
    optuna.create_study(study_name="foreign", storage=make_storage(None, results))
    r = CliRunner().invoke(app, ["report", "foreign", "--results-dir", str(results)])
    assert r.exit_code == 2 and "was not made by" in r.output and "Traceback" not in r.output
