"""A grid trial that another worker judged stale while it trained (its heartbeats delayed past
the grace period, e.g. by a slow start under load) and failed and retried: the worker that
finishes the superseded attempt marks its run superseded and goes on to the next trial. Optuna
refuses every write to the ended trial (``UpdateFinishedTrialError``); before, the first refused
attribute write ended the worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from optuna.trial import TrialState

from harness.config.experiment import load_experiment
from harness.sweep.launching import worker
from harness.sweep.launching.trial import ClaimedTrial, run_grid_trial
from harness.sweep.scheduler.study import enqueue_missing, open_study
from harness.sweep.scheduler.trials import next_trial
from harness.sweep.stores.storage import make_storage
from harness.tracking import MemoryTracker

ROOT = Path(__file__).resolve().parents[3]


def _claimed(tmp_path: Path) -> tuple[Any, Any, Any, Any]:
    tracker = MemoryTracker()
    study, spec = open_study(
        load_experiment(ROOT / "experiments" / "smoke.yaml"),
        storage=make_storage(None, tmp_path),
        tracker=tracker,
        study_name=None,
        tracking_uri="memory",
        command="test",
    )
    enqueue_missing(study, spec)
    trial, _ = next_trial(study, spec)
    assert trial is not None
    return study, spec, trial, tracker


def _judged_stale(study: Any, trial: Any) -> None:
    """What another worker's stale-trial check does: FAIL the trial, enqueue its retry copy."""
    study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    study.enqueue_trial({}, user_attrs=dict(trial.user_attrs))


@pytest.mark.parametrize("ends", ["completed", "error"])
def test_a_trial_failed_as_stale_while_it_trained_is_superseded_not_fatal(tmp_path, ends):
    study, spec, trial, tracker = _claimed(tmp_path)
    events: list[dict[str, Any]] = []
    opts = worker.WorkerOptions(study=study.study_name, storage=None, results_dir=tmp_path)
    t = ClaimedTrial(study, trial, spec, tracker, opts, events.append, lambda: False)

    def train(cfg: Any, label: str, seed: int) -> tuple[Any, str]:
        rid = tracker.start_run(experiment=spec.experiment, run_name=f"{label} seed={seed}")
        t.run_id = rid
        _judged_stale(study, trial)  # while this attempt trains
        if ends == "error":
            raise RuntimeError("the run failed after its trial was retried elsewhere")
        result = SimpleNamespace(
            status="completed", reason="", summary={spec.metric: 0.5}, inert_clip=False, tags={}
        )
        return result, rid

    t.train = train  # type: ignore[method-assign]
    n_before = len(study.get_trials(deepcopy=False))
    assert run_grid_trial(t) == "interrupted"
    run = tracker.runs[t.run_id]
    assert run.tags["run.superseded"] == "trial was judged stale and retried elsewhere"
    done = [e for e in events if e["event"] == "done"]
    assert [(e["outcome"], e["reason"]) for e in done] == [("interrupted", "superseded")]
    # The stale check's retry copy is the only new trial (no second retry from this attempt).
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == n_before + 1
    assert study.get_trials(deepcopy=False)[trial.number].state == TrialState.FAIL
