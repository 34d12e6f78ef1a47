"""`harness search`: TPE over ranges with seeds inside trials, resumable, best point on the parent run."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.experiments import search_file, smoke_base

PARAMS = {
    "ppo.eps_clip": {"type": "float", "low": 0.05, "high": 0.5, "log": True},
    "ppo.c_clip": {"type": "categorical", "choices": [None, 3.0]},
}


def write(tmp_path: Path, n_trials: int = 3, **search: object) -> Path:
    base = smoke_base()
    return search_file(
        tmp_path,
        "tiny-search",
        base,
        n_trials=n_trials,
        params=PARAMS,
        pruner="median",
        seeds=2,
        search_extra=search,
    )


@pytest.mark.slow
def test_search_runs_resumes_and_logs_the_best_point(tmp_path):
    import optuna

    from harness.sweep.stores.storage import make_storage

    exp = write(tmp_path)
    results = tmp_path / "results"
    runner = CliRunner()
    r = runner.invoke(app, ["search", str(exp), "--workers", "2", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    assert "best trial" in r.output
    study = optuna.load_study(study_name="tiny-search", storage=make_storage(None, results))
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) >= 3
    for t in finished:
        assert 0.05 <= t.params["ppo.eps_clip"] <= 0.5
        assert t.params["ppo.c_clip"] in (None, 3.0)
        assert len(t.intermediate_values) >= 1  # seeds reported as steps for the pruner

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("tiny-search").experiment_id
    runs = client.search_runs([exp_id], max_results=100)
    parent = [x for x in runs if x.data.tags.get("harness.role") == "parent"][0]
    assert parent.data.tags["search.best_trial"] == str(study.best_trial.number)
    assert parent.data.tags["best.ppo.eps_clip"] == str(study.best_trial.params["ppo.eps_clip"])
    children = [x for x in runs if x.data.tags.get("harness.role") == "child"]
    assert all(x.data.tags["mlflow.parentRunId"] == parent.info.run_id for x in children)

    # re-running resumes: the trial budget is already met, nothing new runs
    n_before = len(study.trials)
    r2 = runner.invoke(app, ["search", str(exp), "--results-dir", str(results)])
    assert r2.exit_code == 0, r2.output
    assert (
        len(optuna.load_study(study_name="tiny-search", storage=make_storage(None, results)).trials)
        == n_before
    )


@pytest.mark.slow
def test_two_objective_search_reports_the_pareto_front(tmp_path):
    exp = write(
        tmp_path,
        n_trials=2,
        objectives=[
            {"metric": "final/reward", "direction": "maximize"},
            {"metric": "stability/max_drawdown", "direction": "minimize"},
        ],
        pruner="none",  # Optuna prunes single-objective studies only: a named pruner is refused
    )
    r = CliRunner().invoke(app, ["search", str(exp), "--results-dir", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert "Pareto front" in r.output
