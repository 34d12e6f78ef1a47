"""Faults and hygiene: a diverging cell inside a sweep, unusable results directories, checkpoint
loading, file permissions."""

import re
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.support.rewards import FAILING_REWARDS
from tests.support.tiny import SMALL_SETS, set_flags

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a whole sweep; errors at sweep level stay fast (test_run_errors)
def test_diverged_run_is_a_failed_trial_with_reason_and_the_sweep_goes_on(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc.update(
        name="diverge",
        grid={"optim.lr": [1e-3, 1e20]},
        seeds=1,
        steps=40,
        baseline={"optim.lr": 1e-3},
    )
    doc["base"]["optim"] = {"grad_clip": None}
    exp = tmp_path / "diverge.yaml"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    runner = CliRunner()
    r = runner.invoke(app, ["ablate", str(exp), "--workers", "2", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output

    import optuna

    from harness.sweep.stores.storage import make_storage

    trials = optuna.load_study(
        study_name="diverge", storage=make_storage(None, results)
    ).get_trials()
    by_cell = {t.user_attrs["cell"]: t for t in trials}
    bad, good = by_cell["lr=1e+20"], by_cell["lr=0.001"]
    assert good.state.name == "COMPLETE"
    assert bad.state.name == "FAIL" and bad.user_attrs["outcome"] == "diverged"
    assert re.match(r"diverged at step \d+: ", bad.user_attrs["reason"])
    step = int(re.match(r"diverged at step (\d+)", bad.user_attrs["reason"]).group(1))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    run = client.get_run(bad.user_attrs["run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["run.reason"] == bad.user_attrs["reason"]
    history = client.get_metric_history(run.info.run_id, "objective/reward")
    assert len(history) == step  # metrics kept up to the divergence
    report = (results / "diverge" / "report.md").read_text()
    assert "1/1" in report and "diverged at step" in report  # counted and explained

    # a resume does not re-run a diverged trial: it is a result
    r2 = runner.invoke(app, ["ablate", str(exp), "--results-dir", str(results), "--no-report"])
    assert r2.exit_code == 0 and "2 already done, 0 enqueued" in r2.output


def test_results_dir_that_cannot_be_created_or_is_full_is_a_clear_error(tmp_path, monkeypatch):
    runner = CliRunner()
    r = runner.invoke(
        app, ["ablate", "experiments/smoke.yaml", "--results-dir", "/proc/harness-results"]
    )
    assert r.exit_code == 2 and "results dir '/proc/harness-results': cannot create it" in r.output
    assert "Traceback" not in r.output
    a_file = tmp_path / "file"
    a_file.write_text("x")
    r = runner.invoke(app, ["run", "--set", "steps=1", "--results-dir", str(a_file / "sub")])
    assert r.exit_code == 2 and "cannot create it" in r.output

    import harness.core.fsutil as fsutil

    class Usage:
        free = 1024

    monkeypatch.setattr(fsutil.shutil, "disk_usage", lambda p: Usage())
    results = tmp_path / "full"
    r = runner.invoke(app, ["ablate", "experiments/smoke.yaml", "--results-dir", str(results)])
    assert r.exit_code == 2 and "0 MiB free" in r.output
    assert not (results / "optuna-journal.log").exists() and not (results / "mlflow.db").exists()


def test_checkpoints_are_never_unpickled():
    """Weights are loaded with safetensors or torch.load(weights_only=True), never plain pickle."""
    for path in (ROOT / "harness").rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            assert "weights_only=True" in m.group(1), f"{path}: {m.group(0)}"
        assert "pickle.load" not in text, path
    assert "safetensors" in (ROOT / "harness" / "run" / "warmstart.py").read_text()


@pytest.mark.slow  # 30+ s: a whole sweep or several processes
def test_nothing_in_results_is_world_writable_even_under_umask_000(tmp_path):
    """A smoke sweep under umask 000 (common in containers) into a results dir that is a symlink
    to a shared sticky directory: nothing it creates is group/world-writable, and the shared
    directory, which the harness did not create, keeps its mode (drwxrwxrwt)."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = tmp_path / "results-link"
    link.symlink_to(shared)
    results = link / "sub" / "results"  # two levels the harness creates
    old = os.umask(0)
    try:
        r = CliRunner().invoke(
            app, ["ablate", "experiments/smoke.yaml", "--results-dir", str(results)]
        )
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    created = list(shared.rglob("*"))
    assert len(created) > 10  # journal, mlflow.db, artifacts, report, plots
    offenders = [p for p in created if p.stat().st_mode & (stat.S_IWOTH | stat.S_IWGRP)]
    assert not offenders, offenders
    assert stat.S_IMODE((shared / "sub").stat().st_mode) == 0o755


def test_a_bad_command_never_changes_the_mode_of_a_shared_directory(tmp_path):
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = tmp_path / "link"
    link.symlink_to(shared)
    for target in (shared, link):
        r = CliRunner().invoke(
            app,
            ["ablate", "experiments/smoke.yaml", "--workers", "0", "--results-dir", str(target)],
        )
        assert r.exit_code == 2
        r = CliRunner().invoke(app, ["report", "nosuch", "--results-dir", str(target)])
        assert r.exit_code == 2
        from harness.core.fsutil import ensure_results_dir

        ensure_results_dir(target)  # a usable existing dir: checked, never chmod-ed
        assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []


SMALL = set_flags("steps=2", *SMALL_SETS)


def test_bad_reward_code_in_a_run_is_a_failed_run_with_its_reason(tmp_path):
    from mlflow.tracking import MlflowClient

    module = tmp_path / "rewards.py"
    module.write_text(FAILING_REWARDS)
    results = tmp_path / "results"
    expect = {
        "raises": "raised ZeroDivisionError: division by zero",
        "text": "returned 'high', not a number",
        "nan": "returned nan, not a finite number",
    }
    for func, reason in expect.items():
        r = CliRunner().invoke(
            app,
            ["run", "--set", f"task=python:{module}:{func}", *SMALL, "--results-dir", str(results)],
        )
        assert r.exit_code == 1, r.output
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]  # the progress line, then ours
        assert err[-1].startswith("error: run FAILED: task 'python:"), err
        assert reason in err[-1] and "Traceback" not in r.output
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs(client.get_experiment_by_name("harness-run").experiment_id)
    assert len(runs) == 3 and {run.info.status for run in runs} == {"FAILED"}
    reasons = sorted(run.data.tags["run.reason"] for run in runs)
    for reason in expect.values():
        assert sum(reason in r for r in reasons) == 1, reasons


@pytest.mark.slow
def test_bad_reward_code_in_a_sweep_fails_its_trials_with_the_reason(tmp_path):
    module = tmp_path / "rewards.py"
    module.write_text(FAILING_REWARDS)
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc.update(
        name="badreward",
        grid={"task": [f"python:{module}:good", f"python:{module}:raises"]},
        seeds=1,
        steps=2,
    )
    doc.pop("baseline")
    exp = tmp_path / "badreward.yaml"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(exp), "--results-dir", str(results)])
    assert "Traceback" not in r.output

    import optuna

    from harness.sweep.stores.storage import make_storage

    trials = optuna.load_study(study_name="badreward", storage=make_storage(None, results)).trials
    by_task = {t.user_attrs["cell"].split(":")[-1]: t for t in trials}
    assert by_task["good"].state.name == "COMPLETE"
    bad = by_task["raises"]
    assert bad.state.name == "FAIL" and bad.user_attrs["outcome"] == "error"
    assert "raised ZeroDivisionError: division by zero" in bad.user_attrs["reason"]
