"""A power cut in an asynchronous sweep (``rollout.async``, on either clock): ``harness ablate``
and its worker are killed with SIGKILL while a trial is mid-run, with the sampler ahead of the
learner (on the threads clock in its own thread); running the same command again completes every
(cell, seed) exactly once, the trial completed before the cut is not run again, and the killed
trial's run ends KILLED (the metrics its tracker still buffered died with it).

The state is made, not waited out: tests/hooks/sitecustomize.py (first on the sweep's PYTHONPATH)
makes the worker hang right after its second run recorded its first step, after writing its pid
to a marker; the test kills the sweep's process group once the marker names the worker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tests.hooks.kill_at import kill_worker_at_marker, rerun_to_the_end
from tests.support.study_reads import mlflow_runs, trials

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"
HOOKS = ROOT / "tests" / "hooks"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _experiment(tmp_path: Path, name: str, clock: str) -> Path:
    """The smoke grid (2 cells, one seed, 3 steps) sampling asynchronously on ``clock``."""
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name=name, seeds=1, steps=3)
    doc["base"]["rollout"]["async"] = {
        "max_staleness": 2,
        "clock": clock,
        "weight_updates": "in_flight",
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow  # two sweeps in subprocesses: about 40 s on an idle 2-core machine
@pytest.mark.parametrize("clock", ["virtual", "threads"])
def test_an_async_sweep_killed_mid_run_reruns_every_cell_seed_exactly_once(
    tmp_path: Path, clock: str
) -> None:
    name = f"async-{clock}"
    exp = _experiment(tmp_path, name, clock)
    marker = tmp_path / "mid-run"
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness", "ablate", str(exp), "--workers", "1"]
    cmd += ["--results-dir", str(results), "--no-report"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT)]),
        "HARNESS_TEST_HOLD_SECOND_RUN": str(marker),
        "HARNESS_HEARTBEAT_S": "1",  # the killed trial goes stale within seconds
    }

    kill_worker_at_marker(cmd, env, marker, "the second run's first step", ROOT)
    before = trials(results, name)
    done_before = {t.number: (t.user_attrs["cell"], t.user_attrs["seed"]) for t in before
                   if t.state.name == "COMPLETE"}  # fmt: skip
    assert len(done_before) == 1, [(t.number, t.state.name, t.user_attrs) for t in before]
    assert [t.state.name for t in before if t.number not in done_before] == ["RUNNING"]

    rerun_to_the_end(cmd, env, ROOT)

    after = trials(results, name)
    complete = [(t.user_attrs["cell"], t.user_attrs["seed"]) for t in after
                if t.state.name == "COMPLETE"]  # fmt: skip
    assert sorted(complete) == [("c_clip=3", 0), ("c_clip=none", 0)]  # each exactly once
    for number, key in done_before.items():  # the one completed before the cut stays
        assert (
            after[number].state.name == "COMPLETE"
            and (
                after[number].user_attrs["cell"],
                after[number].user_attrs["seed"],
            )
            == key
        )
    assert [t.state.name for t in after if t.state.name not in ("COMPLETE", "FAIL")] == []
    _, runs = mlflow_runs(results, name)
    children = [r for r in runs if r.data.tags.get("harness.role") == "child"]
    statuses = sorted(r.info.status for r in children)
    assert statuses == ["FINISHED", "FINISHED", "KILLED"], statuses
    client, _ = mlflow_runs(results, name)
    for r in children:
        if r.info.status == "FINISHED":
            assert r.data.tags["run.status"] == "completed"
            history = client.get_metric_history(r.info.run_id, "objective/reward")
            assert sorted(m.step for m in history) == [0, 1, 2]
