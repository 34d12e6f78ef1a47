"""`harness ablate` end to end: a two-worker sweep tracked in MLflow, resume, refusal of a changed
grid, PostgreSQL with 4 workers (exactly once), a killed worker, determinism across worker counts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.support.study_reads import mlflow_runs, trials

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def write_exp(tmp_path: Path, **over) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(over)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow  # long multi-process run; CI's slow suite runs it
def test_two_worker_sweep_tracks_parent_and_children_and_resumes(tmp_path):
    results = tmp_path / "results"
    runner = CliRunner()
    r = runner.invoke(app, ["ablate", str(SMOKE), "--workers", "2", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    ts = trials(results, "smoke")
    assert len(ts) == 4 and all(t.state.name == "COMPLETE" for t in ts)
    assert sorted((t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts) == sorted(
        (c, s) for c in ("c_clip=none", "c_clip=3") for s in (0, 1)
    )
    client, runs = mlflow_runs(results, "smoke")
    parents = [r for r in runs if r.data.tags.get("harness.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("harness.role") == "child"]
    assert len(parents) == 1 and len(children) == 4
    pid = parents[0].info.run_id
    assert parents[0].info.status == "FINISHED"
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == pid
        assert c.info.status == "FINISHED"
        assert c.data.tags["ablation.cell"] in ("c_clip=none", "c_clip=3")
        assert {
            "git.commit",
            "harness.grid_hash",
            "optuna.trial_number",
            "seed",
            "version.torch",
        } <= set(c.data.tags)
        assert "final/reward" in c.data.metrics and "ppo.c_clip" in c.data.params
        assert len(client.get_metric_history(c.info.run_id, "objective/reward")) == 3
    arts = [a.path for a in client.list_artifacts(pid, "report")]
    assert "report/report.html" in arts and "report/report.md" not in arts
    assert (results / "smoke" / "report.md").exists()

    # re-running resumes: nothing is redone, the parent run is reused
    r2 = runner.invoke(app, ["ablate", str(SMOKE), "--workers", "2", "--results-dir", str(results)])
    assert r2.exit_code == 0, r2.output
    assert "4 already done, 0 enqueued" in r2.output
    assert len(trials(results, "smoke")) == 4
    _, runs2 = mlflow_runs(results, "smoke")
    assert len([r for r in runs2 if r.data.tags.get("harness.role") == "parent"]) == 1
    assert len(runs2) == 5

    # a changed grid under the same name is refused, nothing is enqueued
    changed = write_exp(tmp_path, grid={"ppo.c_clip": [None, 5.0]})
    r3 = runner.invoke(app, ["ablate", str(changed), "--results-dir", str(results)])
    assert (
        r3.exit_code == 2
        and "already exists with a different grid" in r3.output
        and "--study-name" in r3.output
    )
    assert len(trials(results, "smoke")) == 4

    # status shows it
    r4 = runner.invoke(app, ["status", "--results-dir", str(results)])
    assert r4.exit_code == 0 and "smoke" in r4.output


def test_dry_run_prints_the_grid_and_writes_nothing(tmp_path):
    r = CliRunner().invoke(
        app, ["ablate", "experiments/clip.yaml", "--dry-run", "--results-dir", str(tmp_path / "r")]
    )
    assert r.exit_code == 0
    assert "12 cells x 5 seeds = 60 trials" in r.output
    assert "eps_clip=0.2 eps_clip_higher=none c_clip=none" in r.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_postgresql_study_with_four_workers_runs_each_cell_seed_exactly_once(tmp_path, pg_url):
    exp = write_exp(
        tmp_path,
        name="pgsweep",
        grid={"ppo.eps_clip": [0.1, 0.2, 0.3, 0.4]},
        seeds=2,
        steps=2,
        baseline={"ppo.eps_clip": 0.2},
    )
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        ["ablate", str(exp), "--workers", "4", "--storage", pg_url, "--results-dir", str(results)],
    )
    assert r.exit_code == 0, r.output
    ts = trials(results, "pgsweep", pg_url)
    keys = [(t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts]
    assert len(ts) == 8 and len(set(keys)) == 8
    assert all(t.state.name == "COMPLETE" for t in ts)
    password = pg_url.split(":")[2].split("@")[0]
    client, runs = mlflow_runs(results, "pgsweep")
    for run in runs:
        blob = json.dumps([run.data.params, run.data.tags])
        assert password not in blob


def _harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m harness ARGS`` from the repository root, run to its end (at most 300 s), its
    output captured."""
    cmd = [sys.executable, "-m", "harness", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _start_ablate(
    exp: Path, results: Path, workers: int = 1, storage: list[str] | None = None, heartbeat: int = 1
) -> subprocess.Popen:
    env = {**os.environ, "HARNESS_HEARTBEAT_S": str(heartbeat), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "ablate",
            str(exp),
            "--workers",
            str(workers),
            "--results-dir",
            str(results),
            "--no-report",
            *(storage or []),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for_running(
    results: Path,
    study: str,
    timeout: float = 600,
    storage: str | None = None,
    proc: subprocess.Popen | None = None,
) -> None:
    """Wait until a trial of ``study`` is RUNNING (or ``proc`` exits: then fail at once).

    The bound is a safety net only: on a loaded 2-core machine the coordinator's start (torch,
    MLflow, spawning a worker) alone can take a minute."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise AssertionError(f"the sweep exited {proc.returncode} first:\n{out[-2000:]}")
        try:
            if any(t.state.name == "RUNNING" for t in trials(results, study, storage)):
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError("no trial started")


def _wait_for_child_run(results: Path, experiment: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            _, runs = mlflow_runs(results, experiment)
            if any(r.data.tags.get("harness.role") == "child" for r in runs):
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError("no child run started")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["journal", "postgresql"])
def test_killed_worker_trial_is_retried_and_its_run_ends_killed(tmp_path, backend, request):
    storage = None
    if backend == "postgresql":
        pg = request.getfixturevalue("pg")
        storage = pg.create_database("killed_" + str(abs(hash(str(tmp_path))) % 10**6))
    extra = ["--storage", storage] if storage else []
    exp = write_exp(
        tmp_path, name="killed", steps=400, seeds=1
    )  # long enough to be killed mid-trial
    results = tmp_path / "results"
    proc = _start_ablate(exp, results, storage=extra)
    _wait_for_running(results, "killed", storage=storage, proc=proc)
    _wait_for_child_run(results, "killed")  # MLflow's first call can take seconds under load
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)  # coordinator and worker, mid-trial
    proc.wait()
    env = {**os.environ, "HARNESS_HEARTBEAT_S": "1"}
    args = ["--workers", "1", "--results-dir", str(results), "--no-report", *extra]
    r = _harness("ablate", str(exp), *args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    ts = trials(results, "killed", storage)
    complete = [
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts if t.state.name == "COMPLETE"
    ]
    assert sorted(complete) == [("c_clip=3", 0), ("c_clip=none", 0)]
    assert any(t.state.name == "FAIL" for t in ts), [
        (t.number, t.state.name, t.user_attrs, t.system_attrs) for t in ts
    ]  # the dead worker's trial
    _, runs = mlflow_runs(results, "killed")
    statuses = sorted(r.info.status for r in runs if r.data.tags.get("harness.role") == "child")
    assert "RUNNING" not in statuses
    assert statuses.count("FINISHED") == 2 and statuses.count("KILLED") >= 1


@pytest.mark.slow
def test_sigterm_stops_workers_quickly_and_rerun_resumes(tmp_path):
    exp = write_exp(tmp_path, name="sigterm", steps=400, seeds=1)  # ~10 s: SIGTERM lands mid-trial
    results = tmp_path / "results"
    proc = _start_ablate(exp, results)
    _wait_for_running(results, "sigterm", proc=proc)
    time.sleep(1)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    stop_time = time.time() - t0
    # A few seconds on an idle machine (the stop lands at the next training step); the bound
    # leaves room for a 2-core machine loaded by other work.
    assert stop_time < 60, stop_time
    assert proc.returncode == 130, out.decode()[-2000:]
    ts = trials(results, "sigterm")
    assert any(t.user_attrs.get("outcome") == "interrupted" for t in ts)
    assert not any(t.state.name == "RUNNING" for t in ts)
    _, runs = mlflow_runs(results, "sigterm")
    assert all(
        r.info.status != "RUNNING" for r in runs if r.data.tags.get("harness.role") == "child"
    )
    done_before = {
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts if t.state.name == "COMPLETE"
    }
    r = _harness("ablate", str(exp), "--results-dir", str(results), "--no-report")
    assert r.returncode == 0, r.stderr
    ts = trials(results, "sigterm")
    complete = [
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts if t.state.name == "COMPLETE"
    ]
    assert sorted(complete) == sorted({("c_clip=3", 0), ("c_clip=none", 0)})
    assert len(complete) == 2  # nothing completed was redone
    assert done_before <= set(complete)


@pytest.mark.slow
def test_one_and_two_workers_give_identical_histories(tmp_path):
    runner = CliRunner()
    hist = {}
    for n in (1, 2):
        results = tmp_path / f"r{n}"
        r = runner.invoke(
            app,
            [
                "ablate",
                str(SMOKE),
                "--workers",
                str(n),
                "--results-dir",
                str(results),
                "--no-report",
            ],
        )
        assert r.exit_code == 0, r.output
        client, runs = mlflow_runs(results, "smoke")
        out = {}
        for run in runs:
            if run.data.tags.get("harness.role") != "child":
                continue
            key = (run.data.tags["ablation.cell"], run.data.tags["seed"])
            out[key] = {
                m: [
                    x.value
                    for x in sorted(
                        client.get_metric_history(run.info.run_id, m), key=lambda x: x.step
                    )
                ]
                for m in (
                    "objective/reward",
                    "policy/entropy",
                    "policy/approx_kl",
                    "stability/grad_norm",
                )
            }
        hist[n] = out
    assert hist[1].keys() == hist[2].keys() and len(hist[1]) == 4
    assert hist[1] == hist[2]


@pytest.mark.slow
def test_worker_command_joins_a_running_study(tmp_path):
    """`harness worker --study NAME` on the same storage takes waiting trials of a running sweep."""
    exp = write_exp(
        tmp_path,
        name="joined",
        grid={"ppo.eps_clip": [0.1, 0.2, 0.3]},
        seeds=2,
        steps=300,
        baseline={"ppo.eps_clip": 0.2},
    )
    results = tmp_path / "results"
    coordinator = _start_ablate(exp, results, heartbeat=5)
    _wait_for_running(results, "joined")
    r = _harness("worker", "--study", "joined", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    out, _ = coordinator.communicate(timeout=300)
    assert coordinator.returncode == 0, out.decode()[-2000:]
    ts = trials(results, "joined")
    done = [(t.user_attrs["cell"], t.user_attrs["seed"]) for t in ts if t.state.name == "COMPLETE"]
    assert len(done) == 6 and len(set(done)) == 6  # every (cell, seed) exactly once
    _, runs = mlflow_runs(results, "joined")
    workers = {
        r.data.tags["harness.worker"] for r in runs if r.data.tags.get("harness.role") == "child"
    }
    assert len(workers) == 2, (
        workers,
        r.stderr[-1500:],
    )  # the coordinator's worker and the joined one both ran trials
