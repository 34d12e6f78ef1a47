"""Launcher contract: one suite run against every launcher (local processes, `harness worker`
subprocesses, Ray).  Each must start N workers running the shared worker loop, deliver their
events, say when they have stopped, and stop them on request with nothing left RUNNING."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.config.experiment import load_experiment
from harness.sweep.launching.launch import Resources, make_launcher, run_workers
from harness.sweep.launching.worker import WorkerOptions
from harness.sweep.scheduler.study import open_study
from harness.sweep.stores.storage import make_storage
from tests.support.studies import open_test_study

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"

# `harness worker` subprocesses run the same worker loop as local ones: their cases are slow.
LAUNCHERS = ["local", pytest.param("command", marks=pytest.mark.slow), "ray"]


@pytest.fixture(params=LAUNCHERS)
def launcher_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(launcher_name: str, request: pytest.FixtureRequest) -> Any:
    """Builds the launcher under test (Ray: on the session's private head)."""
    address = request.getfixturevalue("ray_head") if launcher_name == "ray" else None
    return lambda: make_launcher(launcher_name, ray_address=address)


def _open(tmp_path: Path, name: str, steps: int, storage: str | None = None) -> tuple[Any, Any]:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name=name, steps=steps)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    study, spec = open_test_study(path, results, storage=storage)
    opts = WorkerOptions(study=study.study_name, storage=storage, results_dir=results)
    return study, opts


def _states(study: Any) -> Counter[tuple[str, int, str]]:
    return Counter(
        (t.user_attrs["cell"], int(t.user_attrs["seed"]), t.state.name)
        for t in study.get_trials(deepcopy=False)
    )


def test_workers_complete_every_trial_exactly_once(tmp_path: Path, make: Any) -> None:
    study, opts = _open(tmp_path, "contract", steps=2)
    launcher = make()
    events: list[dict[str, Any]] = []
    counts = run_workers(
        launcher,
        2,
        opts,
        resources=Resources(devices=("cpu",)),
        total=4,
        done_before=0,
        on_event=events.append,
        show_progress=False,
    )
    assert launcher.running() == 0
    assert counts["completed"] == 4 and counts["error"] == 0, counts
    states = _states(study)
    assert sorted(states) == sorted(
        (c, s, "COMPLETE") for c in ("c_clip=none", "c_clip=3") for s in (0, 1)
    )
    assert set(states.values()) == {1}  # each (cell, seed) exactly once
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 4 and {e["outcome"] for e in done} == {"completed"}
    assert sorted(e["worker"] for e in events if e["event"] == "exit") == [0, 1]
    assert any(e["event"] == "step" for e in events)


def test_stop_request_interrupts_and_leaves_nothing_running(tmp_path: Path, make: Any) -> None:
    study, opts = _open(tmp_path, "stopped", steps=400)
    launcher = make()
    asked: list[float] = []

    def on_event(e: dict[str, Any]) -> None:
        if e["event"] == "step" and not asked:
            asked.append(time.time())
            launcher.request_stop()

    counts = run_workers(
        launcher, 1, opts, total=4, done_before=0, on_event=on_event, show_progress=False
    )
    assert asked, "no step ran"
    assert time.time() - asked[0] < 60
    assert launcher.running() == 0
    assert counts["interrupted"] == 1 and counts["completed"] == 0, counts
    trials = study.get_trials(deepcopy=False)
    assert not any(t.state.name == "RUNNING" for t in trials)
    assert [t.user_attrs.get("outcome") for t in trials if t.state.name == "FAIL"] == [
        "interrupted"
    ]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{opts.results_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("stopped")
    children = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("harness.role") == "child"
    ]
    assert [r.info.status for r in children] == ["KILLED"]


def test_resuming_a_study_from_another_tracking_store_is_one_clear_error(tmp_path: Path) -> None:
    """The same storage with a different results dir / tracking store: exit-2 message, not
    MLflow's 'Run ... not found' traceback once training has started."""
    from harness.core.configtools import ConfigError
    from harness.tracking import MemoryTracker

    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name="moved", steps=2)
    path = tmp_path / "moved.yaml"
    path.write_text(yaml.safe_dump(doc))
    storage_url = f"sqlite:///{tmp_path / 'optuna.db'}"

    def open_with(tracker: Any) -> Any:
        return open_study(
            load_experiment(path),
            storage=make_storage(storage_url, tmp_path / "r"),
            tracker=tracker,
            study_name=None,
            tracking_uri=None,
            command="test",
        )

    first = MemoryTracker()
    study, spec = open_with(first)
    assert spec.parent_run_id in first.runs
    open_with(first)  # a resume against the same store is fine
    with pytest.raises(ConfigError, match=r"study 'moved' exists in this storage but its MLflow"):
        open_with(MemoryTracker())
