"""A power cut in an asynchronous sweep (``rollout.async``, on either clock): ``harness ablate``
and its worker are killed with SIGKILL while a trial is mid-run, with the sampler ahead of the
learner (on the threads clock in its own thread); running the same command again completes every
(cell, seed) exactly once, the trial completed before the cut is not run again, and the killed
trial's run ends KILLED (the metrics its tracker still buffered died with it).

The state is made, not waited out: a ``sitecustomize`` (first on the sweep's PYTHONPATH) makes the
worker hang right after its second run recorded its first step, after writing its pid to a
marker; the test kills the sweep's process group once the marker names the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from tests.hooks.kill_at import kill_group_at_marker
from tests.support.study_reads import mlflow_runs, trials

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"

optuna.logging.set_verbosity(optuna.logging.WARNING)

HANG_AFTER_FIRST_STEP = '''
"""Hang the process once its second run recorded its first step, after writing its pid to the
marker HARNESS_TEST_HANG_MID_RUN names. Patched when harness.run.scaffold is first imported, so
a process that never trains (the coordinator's helpers) does not import torch for it."""
import importlib.abc
import importlib.util
import os
import sys
import time

MARKER = os.environ.get("HARNESS_TEST_HANG_MID_RUN")


def _patch(scaffold):
    record = scaffold.Run.record
    runs = []

    def hanging_record(self, step, metrics, **kw):
        record(self, step, metrics, **kw)  # handed to the tracker: the step is recorded
        if step != 0:
            return
        runs.append(id(self))
        if len(runs) < 2:
            return
        try:
            fd = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return  # a rerun: the marker is from the killed sweep
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        while True:  # until SIGKILL
            time.sleep(3600)

    scaffold.Run.record = hanging_record


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "harness.run.scaffold":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if MARKER:
    sys.meta_path.insert(0, _PatchOnImport())
'''


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


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow  # two sweeps in subprocesses: about 40 s on an idle 2-core machine
@pytest.mark.parametrize("clock", ["virtual", "threads"])
def test_an_async_sweep_killed_mid_run_reruns_every_cell_seed_exactly_once(
    tmp_path: Path, clock: str
) -> None:
    name = f"async-{clock}"
    exp = _experiment(tmp_path, name, clock)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HANG_AFTER_FIRST_STEP)
    marker = tmp_path / "mid-run"
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness", "ablate", str(exp), "--workers", "1"]
    cmd += ["--results-dir", str(results), "--no-report"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)]),
        "HARNESS_TEST_HANG_MID_RUN": str(marker),
        "HARNESS_HEARTBEAT_S": "1",  # the killed trial goes stale within seconds
    }

    worker = int(kill_group_at_marker(cmd, env, marker, "the second run's first step", ROOT))
    end = time.monotonic() + 60  # killed already: a bounded reap at most
    while not _gone(worker):
        assert time.monotonic() < end, f"worker {worker} still alive 60 s after SIGKILL"
        time.sleep(0.05)
    before = trials(results, name)
    done_before = {t.number: (t.user_attrs["cell"], t.user_attrs["seed"]) for t in before
                   if t.state.name == "COMPLETE"}  # fmt: skip
    assert len(done_before) == 1, [(t.number, t.state.name, t.user_attrs) for t in before]
    assert [t.state.name for t in before if t.number not in done_before] == ["RUNNING"]

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Traceback" not in again.stderr, again.stderr[-3000:]

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
