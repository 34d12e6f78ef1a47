"""Hostile and careless use of a sweep as a whole: grids too big to enumerate, stores on
filesystems that refuse writes, a worker killed by the OOM killer, SIGTERM to the coordinator,
and two coordinators on one study."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.support.experiments import small_experiment, start_ablate
from tests.support.mounts import mounted
from tests.support.studies import open_test_study

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only mount (a bind mount of itself): root cannot write it either."""
    d = tmp_path / "ro"
    d.mkdir()
    (d / "old.db").write_bytes(b"")  # an existing database file there
    yield from mounted(["--bind", "-o", "ro", str(d)], d)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 200 KiB tmpfs."""
    yield from mounted(["-t", "tmpfs", "-o", "size=200k", "tmpfs"], tmp_path / "tiny")


# -- stores on filesystems that refuse writes ----------------------------------------------------


@pytest.mark.parametrize(
    "where", ["/proc/harness-x.db", "ro/new.db", "ro/old.db"], ids=["proc", "ro-new", "ro-old"]
)
def test_a_tracking_database_that_cannot_be_written_is_one_line(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    if where.startswith("ro/"):
        where = str(request.getfixturevalue("read_only_dir") / where[3:])
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        [
            "ablate",
            str(SMOKE),
            "--results-dir",
            str(results),
            "--tracking-uri",
            f"sqlite:///{where}",
        ],
    )
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert line.startswith(f"error: --tracking-uri: cannot write the SQLite database '{where}'")
    assert "Read-only file system" in line or "No such file" in line, line
    assert not results.exists()  # nothing written


def test_a_results_dir_on_a_read_only_mount_is_one_line(
    tmp_path: Path, read_only_dir: Path
) -> None:
    for results, why in (
        (read_only_dir, "not writable (Read-only file system)"),
        (read_only_dir / "results", "cannot create it (Read-only file system)"),
    ):
        r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--results-dir", str(results)])
        assert r.exit_code == 2, r.output
        assert _one_error_line(r.output) == f"error: results dir {str(results)!r}: {why}"
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["old.db"]


def test_a_results_dir_on_a_tiny_filesystem_is_refused_before_it_is_created(
    tiny_fs: Path,
) -> None:
    results = tiny_fs / "results"
    r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert line == f"error: results dir {str(results)!r}: only 0 MiB free (need at least 50 MiB)"
    assert list(tiny_fs.iterdir()) == []  # not even the directory


# -- grids too big to enumerate -----------------------------------------------------------------


def _grid_file(tmp_path: Path, grid: dict[str, Any], seeds: Any = 2, **extra: Any) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(grid=grid, seeds=seeds, **extra)
    doc.pop("baseline", None)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The size check must come before a single cell is built."""
    import harness.config.experiment as experiment

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the grid was enumerated before its size was checked")

    monkeypatch.setattr(experiment, "_expand_grid", refuse)


def _lr_axis(n: int) -> list[float]:
    return [round(1e-5 * (i + 1), 8) for i in range(n)]


@pytest.mark.parametrize("command", [["ablate", "--dry-run"], ["ablate"]])
def test_a_grid_of_a_million_cells_is_refused_before_it_is_enumerated(
    tmp_path: Path, no_enumeration: None, command: list[str]
) -> None:
    grid = {"optim.lr": _lr_axis(1000), "ppo.gamma": [0.9 + i / 1e4 for i in range(1000)]}
    exp = _grid_file(tmp_path, grid)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, [*command, str(exp), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    assert _one_error_line(r.output) == (
        f"error: {exp}: grid: 1000000 cells (1000 x 1000) exceed the limit of 10000; shrink the "
        "grid or raise it with limits: {cells: 1000000} in the file"
    )
    assert not results.exists()


def test_adaptive_seeds_count_their_max_against_the_trial_limit(
    tmp_path: Path, no_enumeration: None
) -> None:
    adaptive = {"min": 3, "max": 500, "batch": 50, "decide": "ranking"}
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(100)}, seeds=adaptive)
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2, r.output
    assert _one_error_line(r.output) == (
        f"error: {exp}: grid: 100 cells x 500 seeds = 50000 trials exceed the limit of 20000; "
        "fewer cells or seeds, or raise it with limits: {trials: 50000} in the file"
    )


def test_the_limits_can_be_raised_in_the_file(tmp_path: Path) -> None:
    from harness.config.experiment import load_experiment

    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"cells": 5})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "6 cells (6) exceed the limit of 5" in r.output, r.output
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"trials": 23})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "= 24 trials exceed the limit of 23" in r.output, r.output
    exp = _grid_file(
        tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"cells": 6, "trials": 24}
    )
    assert len(load_experiment(exp).cells) == 6
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, limits={"cells": 0})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "limits.cells" in _one_error_line(r.output), r.output


# -- a worker killed from outside, a coordinator stopped with workers stuck -----------------------

REWARDS = """
import os, time

READY = {ready!r}

def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]

def _worker_pid():
    # A reward runs in the reward process's runner, a child of its keeper, which is a child of
    # the sweep worker: the worker is the parent's parent.
    with open(f"/proc/{{os.getppid()}}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def first_waits(prompt, completion, answer):
    # The first call of the whole sweep claims READY (with its worker's pid) and waits there for
    # ever: the test acts on a worker known to be mid-trial. Every other call returns at once.
    try:
        fd = os.open(READY, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return float(completion == answer)
    os.write(fd, str(_worker_pid()).encode())
    os.close(fd)
    while True:
        time.sleep(0.05)
"""


def _stuck_experiment(tmp_path: Path, name: str) -> tuple[Path, Path]:
    ready = tmp_path / "ready"
    module = tmp_path / "rewards.py"
    module.write_text(REWARDS.format(ready=str(ready)))
    return small_experiment(tmp_path, name, f"python:{module}:first_waits"), ready


def _wait_for(what: str, cond: Any, proc: subprocess.Popen[Any] | None, limit: float) -> None:
    """Wait (bounded) for ``cond()``; fails naming ``what`` if it never holds."""
    import threading
    import time

    end = time.monotonic() + limit
    while not cond():
        assert proc is None or proc.poll() is None, f"exited before {what}"
        assert time.monotonic() < end, f"no {what} within {limit} s"
        threading.Event().wait(0.05)


def _trials(results: Path, name: str) -> list[Any]:
    import optuna

    from harness.sweep.stores.storage import make_storage

    return optuna.load_study(study_name=name, storage=make_storage(None, results)).get_trials()


def _child_runs(results: Path, name: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    return {
        r.data.tags["optuna.trial_number"]: r
        for r in runs
        if r.data.tags.get("harness.role") == "child"
    }


@pytest.mark.slow
def test_sigterm_with_a_worker_stuck_in_a_reward_kills_it_after_the_grace_and_closes_its_run(
    tmp_path: Path,
) -> None:
    import signal

    import psutil

    exp, ready = _stuck_experiment(tmp_path, "stuck")
    results = tmp_path / "results"
    env = {**os.environ, "HARNESS_STOP_GRACE_S": "3"}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = start_ablate(exp, results, env, err)
        try:
            _wait_for(
                "worker in the reward", lambda: ready.is_file() and ready.read_text(), proc, 600
            )
            worker = int(ready.read_text())
            # the stuck worker and anything it started (not the coordinator's own helpers,
            # such as multiprocessing's resource tracker, which leave after it)
            family = [psutil.Process(worker)]
            family += family[0].children(recursive=True)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=300)  # the grace (3 s) plus closing, not for ever
        finally:
            if proc.poll() is None:
                proc.kill()
    text = err_path.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "SIGTERM: stopping the workers (waiting at most 3 s" in text, text[-3000:]
    killed = [ln for ln in text.splitlines() if ln.startswith("worker ") and " killed: " in ln]
    assert killed == [
        f"worker 0 (pid {worker}) killed: still running 3 s after the stop was asked; it was "
        "running trial 0 (c_clip=none seed=0)"
    ], text[-3000:]
    assert "interrupted: run the same command again to resume" in text
    _, alive = psutil.wait_procs(family, timeout=30)  # killed already: a bounded reap at most
    assert not alive
    trials = _trials(results, "stuck")
    assert [(t.state.name, t.user_attrs.get("outcome")) for t in trials] == [
        ("FAIL", "interrupted"),
        ("WAITING", None),
    ]
    assert trials[0].user_attrs["reason"].startswith("worker killed: still running 3 s")
    runs = _child_runs(results, "stuck")
    assert sorted(runs) == ["0"] and runs["0"].info.status == "KILLED"
    assert runs["0"].data.tags["run.reason"] == trials[0].user_attrs["reason"]


@pytest.mark.slow
def test_a_worker_killed_by_sigkill_is_named_with_its_trial_and_the_trial_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from harness.sweep.launching.launch import make_launcher, run_workers
    from harness.sweep.launching.worker import WorkerOptions

    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "1")  # the dead worker's trial is stale after 4 s
    exp, ready = _stuck_experiment(tmp_path, "oom")
    results = tmp_path / "results"
    study, spec = open_test_study(exp, results)
    events: list[dict[str, Any]] = []
    said: list[str] = []

    killed: list[int] = []

    def kill_when_stuck() -> None:
        # The worker that claims READY is stuck in its first reward: SIGKILL it (what the OOM
        # killer does) once READY names it; a bounded poll on that state, never a bare sleep.
        _wait_for("worker in the reward", lambda: ready.is_file() and ready.read_text(), None, 600)
        killed.append(int(ready.read_text()))
        os.kill(killed[0], signal.SIGKILL)

    import threading

    killer = threading.Thread(target=kill_when_stuck, daemon=True)
    killer.start()
    counts = run_workers(
        make_launcher("local"),
        2,
        WorkerOptions(study="oom", storage=None, results_dir=results),
        total=2,
        done_before=0,
        on_event=events.append,
        show_progress=False,
        say=said.append,
    )
    killer.join(timeout=1)
    assert killed, "the stuck worker was never seen"
    crashes = [e for e in events if e["event"] == "crash"]
    assert len(crashes) == 1, events
    victim = crashes[0]
    started = [e for e in events if e["event"] == "start" and e["worker"] == victim["worker"]]
    held = started[-1]
    assert held["pid"] == killed[0]
    assert [line for line in said if "was killed" in line] == [
        f"worker {victim['worker']} (pid {held['pid']}) was killed by SIGKILL while running "
        f"trial {held['trial']} ({held['cell']} seed=0); a running trial is retried once its "
        "heartbeat goes stale (by another worker, or by running the same command again)"
    ]
    assert counts["died"] == 1 and counts["completed"] == 2, counts
    trials = _trials(results, "oom")
    complete = sorted(t.user_attrs["cell"] for t in trials if t.state.name == "COMPLETE")
    assert complete == ["c_clip=3", "c_clip=none"]  # every cell once, the dead one's retried
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    runs = _child_runs(results, "oom")
    assert runs[str(held["trial"])].info.status == "KILLED"


# -- two coordinators on one study --------------------------------------------------------------

HOLDER = """
import sys
from pathlib import Path
from harness.sweep.launching.coordinator import coordinator_lock

with coordinator_lock(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin or kills this process
"""


def test_a_second_coordinator_of_a_study_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Two `harness ablate` of one adaptive study at once would both enqueue the missing seeds
    (each pair then runs twice): the second is refused before it opens the study, and a
    coordinator killed with SIGKILL leaves nothing locked."""
    import signal
    import sys

    import optuna

    from harness.sweep.launching.coordinator import coordinator_lock
    from harness.sweep.stores.storage import make_storage

    adaptive = {"min": 2, "max": 4, "batch": 2, "decide": "ranking"}
    exp = _grid_file(tmp_path, {"ppo.c_clip": [None, 3.0]}, seeds=adaptive, name="twice")
    results = tmp_path / "results"
    results.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(results), "twice"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        r = CliRunner().invoke(app, ["ablate", str(exp), "--results-dir", str(results)])
        assert r.exit_code == 2, r.output
        assert _one_error_line(r.output) == (
            f"error: study 'twice': already being run by pid {holder.pid} (lock "
            f"{results / '.twice.coordinator.lock'}); wait for it to end, or add workers to it "
            "with `harness worker --study twice`"
        )
        storage = make_storage(None, results)
        assert optuna.get_all_study_names(storage) == []  # nothing enqueued, no study opened
        with pytest.raises(Exception, match="already being run by pid"):
            with coordinator_lock(results, "twice"):
                pass
        with coordinator_lock(results, "another-study"):  # other studies are not affected
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with coordinator_lock(results, "twice"):  # the dead holder's lock went with it
        assert (results / ".twice.coordinator.lock").read_text() == f"{os.getpid()}\n"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1e9", "nan"])
def test_a_bad_stop_grace_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("HARNESS_STOP_GRACE_S", value)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    assert _one_error_line(r.output) == (
        f"error: HARNESS_STOP_GRACE_S: must be seconds in (0, 3600]; got {value!r}"
    )
    assert not results.exists()
