"""What a finished sweep left in its stores, read back as the tests check it."""

from __future__ import annotations

from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient

from harness.sweep.stores.storage import make_storage


def trials(results: Path, study: str, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    """The trials of ``study`` in the Optuna storage under ``results`` (or ``storage``)."""
    st = make_storage(storage, results)
    return optuna.load_study(study_name=study, storage=st).get_trials()


def mlflow_runs(results: Path, experiment: str):
    """(client, runs) of ``experiment`` in the default MLflow store under ``results``."""
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} under {results}"
    return client, client.search_runs([exp.experiment_id], max_results=1000)
