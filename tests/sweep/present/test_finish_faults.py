"""Faults around finishing trials and studies: which MLflow runs a retry may close, two reports
of one study written at once, Ctrl-C while a sweep finishes, and a PostgreSQL password with a
raw '@' in driver errors."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.sweep.stores.storage import make_storage
from harness.tracking import MemoryTracker
from tests.hooks.kill_at import kill_group_at_marker
from tests.support.experiments import small_experiment
from tests.support.studies import open_test_study

ROOT = Path(__file__).resolve().parents[3]

optuna.logging.set_verbosity(optuna.logging.WARNING)

REWARDS = """
import os, time

GATE, READY = {gate!r}, {ready!r}

def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]

def raises(prompt, completion, answer):
    return 1 / 0

def gated(prompt, completion, answer):
    # The first call waits until GATE exists (after writing READY): the test acts while a trial
    # is known to be mid-training.
    if not os.path.exists(GATE):
        open(READY, "w").close()
        while not os.path.exists(GATE):
            time.sleep(0.02)
    return float(completion == answer)
"""


def _rewards(tmp_path: Path) -> tuple[Path, Path, Path]:
    gate, ready = tmp_path / "gate", tmp_path / "ready"
    module = tmp_path / "rewards.py"
    module.write_text(REWARDS.format(gate=str(gate), ready=str(ready)))
    return module, gate, ready


def _experiment(tmp_path: Path, name: str, task: str, cells: list[Any]) -> Path:
    grid, baseline = {"ppo.c_clip": cells}, {"ppo.c_clip": cells[0]}
    return small_experiment(tmp_path, name, task, grid=grid, baseline=baseline)


def _open(exp: Path, results: Path, tracker: Any, max_retries: int = 0) -> tuple[Any, Any]:
    uri = "memory" if isinstance(tracker, MemoryTracker) else None
    return open_test_study(exp, results, tracker, tracking_uri=uri, max_retries=max_retries)


# -- a retry keeps the history of the attempt it retries --------------------------------------


def test_a_failing_attempt_keeps_its_failed_run_and_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-retries 1 and a reward that raises: both attempts' runs stay FAILED with the real
    reason; none is rewritten to KILLED 'worker died; trial retried'."""
    from harness.sweep.launching.worker import WorkerOptions, worker_loop

    module, _, _ = _rewards(tmp_path)
    exp = _experiment(tmp_path, "retried", f"python:{module}:raises", [None])
    results = tmp_path / "results"
    tracker = MemoryTracker()  # the worker runs in this process and shares it
    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    study, _ = _open(exp, results, tracker, max_retries=1)
    counts = worker_loop(WorkerOptions(study="retried", storage=None, results_dir=results))
    assert counts["error"] == 2, counts
    trials = study.get_trials()
    assert [(t.state.name, t.user_attrs["attempt"]) for t in trials] == [("FAIL", 0), ("FAIL", 1)]
    children = [r for r in tracker.runs.values() if r.tags.get("harness.role") == "child"]
    assert [r.tags["optuna.trial_number"] for r in children] == ["0", "1"]
    for run in children:
        assert run.status == "FAILED", (run.status, run.tags)
        assert run.tags["run.status"] == "failed"
        assert "raised ZeroDivisionError: division by zero" in run.tags["run.reason"]
    assert [t.user_attrs["reason"] for t in trials] == [
        r.tags["run.reason"] for r in children
    ]  # the trial and its run give the same reason


@pytest.mark.slow
def test_a_sigkilled_workers_run_is_ended_killed_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker SIGKILLed mid-trial leaves its run RUNNING; the worker that takes the retried
    trial ends exactly that run KILLED 'worker died; trial retried'."""
    from mlflow.tracking import MlflowClient

    from harness.sweep.launching.worker import WorkerOptions, worker_loop
    from harness.sweep.scheduler.trials import DIED
    from harness.tracking import make_tracker

    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "1")  # stale after 4 s
    module, gate, ready = _rewards(tmp_path)
    exp = _experiment(tmp_path, "sigkill", f"python:{module}:gated", [None])
    results = tmp_path / "results"
    study, _ = _open(exp, results, make_tracker(None, results))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "worker", "--study", "sigkill"]
        + ["--results-dir", str(results)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not ready.exists():  # its trial is mid-training, its run RUNNING
            assert proc.poll() is None, "the worker exited before training"
            threading.Event().wait(0.05)
    finally:
        proc.kill()
        proc.wait()
    gate.write_text("")
    counts = worker_loop(WorkerOptions(study="sigkill", storage=None, results_dir=results))
    assert counts["completed"] == 1, counts
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]  # stale, then its retry
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sigkill").experiment_id])
    children = {
        r.data.tags["optuna.trial_number"]: r
        for r in runs
        if r.data.tags.get("harness.role") == "child"
    }
    assert sorted(children) == ["0", "1"]
    assert children["0"].info.status == "KILLED"
    assert children["0"].data.tags["run.reason"] == DIED
    assert children["1"].info.status == "FINISHED"


# -- two reports of one study at once ---------------------------------------------------------


def _report_repeatedly(out_dir: str, times: int, barrier: Any, errors: Any) -> None:
    from harness.report import build_report
    from tests.fixtures import synthetic

    data = synthetic.three_cells(seeds=3)
    barrier.wait()
    for _ in range(times):
        try:
            files = build_report(data, Path(out_dir), n_boot=100, fit=False)
            for png in files.pngs:  # what finish_study then attaches to the parent run
                png.read_bytes()
        except Exception as err:  # reported to the test, which fails on any
            errors.put(f"{type(err).__name__}: {err}")


def test_two_coordinators_reporting_at_once_both_succeed(tmp_path: Path) -> None:
    """Two processes write the same study's report at once, over and over: neither fails
    (FileNotFoundError on a plot the other removed, before), and the result is whole."""
    ctx = mp.get_context("spawn")
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    out = tmp_path / "report"
    procs = [
        ctx.Process(target=_report_repeatedly, args=(str(out), 4, barrier, errors))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(900)  # against a hang only: 12 s idle, 100 s beside other busy processes
    assert [p.exitcode for p in procs] == [0, 0]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    html = (out / "report.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in (out / "plots").iterdir())
    assert pngs and all(name.endswith(".png") for name in pngs)  # no temp file left behind
    assert html.count('<img src="data:image/png;base64,') == len(pngs)
    assert (out / "report.md").read_text(encoding="utf-8").count("](plots/") == len(pngs)


def test_a_report_write_that_fails_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from harness.core.fsutil import atomic_write

    target = tmp_path / "report.md"
    atomic_write(target, "old\n")
    real_open = open

    def full_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        if "w" in mode:
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new\n")
    monkeypatch.undo()
    assert target.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["report.md"]


# -- Ctrl-C while the sweep finishes ----------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_while_finishing_ends_the_parent_run_and_a_rerun_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT after the trials, while the report is written: the parent run ends KILLED (not
    left RUNNING), exit 130 with the resume hint and no traceback; running the command again
    finishes the study and its parent run."""
    from mlflow.tracking import MlflowClient

    from harness.sweep.present import finish

    exp = _experiment(tmp_path, "finishing", "reverse", [None])
    results = tmp_path / "results"
    real_build = finish.build_report

    def interrupted_build(*args: Any, **kwargs: Any) -> Any:
        # Ctrl-C while the report is written. raise_signal delivers it to this thread: a signal
        # sent to the process may land on another of its threads (MLflow's, Optuna's), and the
        # handler then runs here at the next bytecode, which a long blocking wait would delay.
        signal.raise_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)  # KeyboardInterrupt cuts this wait
        raise AssertionError("SIGINT was not delivered")

    monkeypatch.setattr(finish, "build_report", interrupted_build)
    # A terminal's Ctrl-C: pytest-xdist workers and background shells start with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    args = ["ablate", str(exp), "--results-dir", str(results)]
    try:
        r = CliRunner().invoke(app, args)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert r.exit_code == 130, r.output
    assert r.stderr.splitlines()[-1] == "interrupted: run the same command again to resume"
    assert "Traceback" not in r.output and not isinstance(r.exception, KeyboardInterrupt)
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("finishing").experiment_id

    def parents() -> list[tuple[str, str | None]]:
        runs = client.search_runs([exp_id], "tags.`harness.role` = 'parent'")
        return [(p.info.status, p.data.tags.get("harness.outcome")) for p in runs]

    assert parents() == [("KILLED", "interrupted")]
    trials = optuna.load_study(study_name="finishing", storage=make_storage(None, results)).trials
    assert [t.state.name for t in trials] == ["COMPLETE"]  # the trial itself is safe

    monkeypatch.setattr(finish, "build_report", real_build)
    again = CliRunner().invoke(app, [*args, "--workers", "1"])
    assert again.exit_code == 0, again.output
    assert "1 already done, 0 enqueued" in again.stderr
    assert parents() == [("FINISHED", "complete")]
    assert (results / "finishing" / "report.md").exists()


# -- a raw '@' in a PostgreSQL password ---------------------------------------------------------

AT_URL = "postgresql://u:p@ss@127.0.0.1:1/db"


def test_a_password_with_a_raw_at_reaches_the_host_and_never_leaks(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as error:
        make_storage(AT_URL, tmp_path)
    message = str(error.value)
    # The driver is given p%40ss, so it tries 127.0.0.1:1 (closed), not a host named "ss@...".
    assert (
        message
        == "storage: cannot connect to postgresql://u:***@127.0.0.1:1/db (Connection refused)"
    )

    for argv in (
        ["status", "--storage", AT_URL, "--results-dir", str(tmp_path)],
        ["run", "--tracking-uri", AT_URL, "--results-dir", str(tmp_path / "r")],
    ):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2, r.output
        assert r.stderr.count("\n") == 1 and "refused" in r.stderr, r.stderr
        assert "ss@" not in r.output and "p@ss" not in r.output and "p%40ss" not in r.output


def test_driver_messages_never_show_fragments_of_such_a_password() -> None:
    from harness.core.db import short_reason

    url = "postgresql://u:pa@ss@word@db.example:5432/x"
    misparsed = Exception(
        'could not translate host name "ss@word@db.example" to address: Name or service not known'
    )
    assert short_reason(misparsed, url) == (
        'could not translate host name "***@db.example" to address: Name or service not known'
    )
    # Masked only where the driver shows it as part of a host, not in ordinary words.
    words = Exception('password authentication failed for user "u" (word count)')
    assert short_reason(words, url) == str(words)
    encoded = Exception("bad dsn: password=pa%40ss%40word host=db.example")
    assert short_reason(encoded, url) == "bad dsn: password=*** host=db.example"


# -- kill -9 while the report is written ------------------------------------------------------

HOOKS = Path(__file__).resolve().parents[2] / "hooks"


@pytest.mark.slow  # two sweeps in subprocesses
def test_a_sweep_killed_mid_report_reruns_to_a_whole_report_and_no_leftovers(
    tmp_path: Path,
) -> None:
    """A power cut while ``report.md`` is half written: no trial is run again, the rerun writes
    the whole report, closes the parent run, and removes the dead writer's temp file."""
    from mlflow.tracking import MlflowClient

    exp = _experiment(tmp_path, "midreport", "reverse", [None, 3.0])
    results = tmp_path / "results"
    marker = tmp_path / "writing"
    cmd = [sys.executable, "-m", "harness", "ablate", str(exp), "--results-dir", str(results)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT)])}
    kill_group_at_marker(
        [*cmd, "--workers", "2"], {**env, "HARNESS_TEST_HANG_IN_REPORT": str(marker)}, marker,
        "the report",
    )  # fmt: skip
    report_dir = results / "midreport"
    assert not (report_dir / "report.md").exists()
    (left,) = report_dir.glob(".report.md.*.tmp")  # the half-written report of the dead writer
    assert left.name.startswith(f".report.md.{socket.gethostname()}.{marker.read_text()}.")

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2 already done, 0 enqueued" in again.stderr
    text = (report_dir / "report.md").read_text()
    assert text.startswith("# ") and "## Conclusion" in text and text.endswith("\n")
    assert "held fixed" in text.lower()  # the last section: the file is whole
    assert list(report_dir.glob(".*.tmp")) == []
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("midreport").experiment_id
    parents = client.search_runs([exp_id], "tags.`harness.role` = 'parent'")
    assert [(p.info.status, p.data.tags.get("harness.outcome")) for p in parents] == [
        ("FINISHED", "complete")
    ]
    trials = optuna.load_study(study_name="midreport", storage=make_storage(None, results)).trials
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "COMPLETE"]


def test_orphan_temp_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    from harness.core import fsutil

    target = tmp_path / "report.md"
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    mine = tmp_path / f".report.md.{host}.{os.getpid()}.aaaaaaaa.tmp"
    gone = tmp_path / f".report.md.{host}.{dead.stdout.strip()}.bbbbbbbb.tmp"
    elsewhere = tmp_path / ".report.md.other-host.1.cccccccc.tmp"
    stale = tmp_path / ".report.md.other-host.2.dddddddd.tmp"
    other_file = tmp_path / f".runs.csv.{host}.{dead.stdout.strip()}.eeeeeeee.tmp"
    for p in (mine, gone, elsewhere, stale, other_file):
        p.write_text("half")
    hour_ago = time.time() - fsutil.ORPHAN_TEMP_AGE_S - 5
    os.utime(stale, (hour_ago, hour_ago))
    assert sorted(p.name for p in fsutil.remove_orphan_temps(target)) == sorted(
        [gone.name, stale.name]
    )
    fsutil.atomic_write(target, "whole\n")
    assert target.read_text() == "whole\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.name, elsewhere.name, other_file.name, "report.md"]
    )
