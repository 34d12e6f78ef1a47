"""The Optuna journal and a full disk: a failed write leaves no partial record, an incomplete or
damaged record is repaired on open, and a disk that fills up mid-sweep stops the sweep with one
line, resumably (on a real, tiny tmpfs when this runs as root)."""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc as sa_exc
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

import harness.sweep.stores.journal as journal_mod
from harness.core.db import is_transient_db_error
from harness.core.fsutil import disk_full_message, is_disk_full
from harness.sweep.stores.storage import JOURNAL_FILE, make_storage
from tests.support.experiments import small_experiment, start_ablate
from tests.support.mounts import mounted

ROOT = Path(__file__).resolve().parents[3]
JOURNAL_LOGGER = "harness.sweep.stores.journal"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(results: Path, name: str = "s", n: int = 3) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=make_storage(None, results))
    for i in range(n):
        study.enqueue_trial({}, user_attrs={"cell": "a", "seed": i})
    return study


def _lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.splitlines()]


def _enospc_after(n_bytes: int) -> Any:
    """An ``os.write`` that has room for ``n_bytes`` more, then fails as a full disk does."""
    real = os.write
    room = [n_bytes]

    def write(fd: int, data: bytes) -> int:
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, data[: room[0]])  # a short write, as the kernel does near a full disk
        room[0] -= n
        return n

    return write


# -- a failed write ---------------------------------------------------------------------------


@pytest.mark.parametrize("written", [0, 17])
def test_a_failed_write_leaves_no_partial_record(
    tmp_results: Path, monkeypatch: pytest.MonkeyPatch, written: int
) -> None:
    study = _study(tmp_results)
    path = tmp_results / JOURNAL_FILE
    before = path.read_bytes()
    monkeypatch.setattr(journal_mod.os, "write", _enospc_after(written))
    with pytest.raises(OSError) as error:
        study.set_user_attr("k", "v" * 200)
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(path)
    assert path.read_bytes() == before  # the fragment was cut away
    monkeypatch.undo()

    study.set_user_attr("k", "after")  # the next write starts on a line of its own
    again = optuna.load_study(study_name="s", storage=make_storage(None, tmp_results))
    assert again.user_attrs == {"k": "after"} and len(again.trials) == 3
    assert len(_lines(path)) == len(before.splitlines()) + 1


def test_a_failed_fsync_keeps_the_whole_record_it_wrote(
    tmp_results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte was written (other processes may already have read the line): kept."""
    study = _study(tmp_results)
    path = tmp_results / JOURNAL_FILE

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(journal_mod.os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        study.set_user_attr("k", "v")
    monkeypatch.undo()
    assert _lines(path)[-1]["user_attr"] == {"k": "v"}


# -- repairs on open --------------------------------------------------------------------------


def test_an_incomplete_last_record_is_dropped_on_open_with_a_warning(
    tmp_results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _study(tmp_results)
    path = tmp_results / JOURNAL_FILE
    good = path.read_bytes()
    fragment = b'{"op_code":8,"worker_id":"w","trial_id":1,"user_attr":{"outcome":"inter'
    path.write_bytes(good + fragment)
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        study = optuna.load_study(study_name="s", storage=make_storage(None, tmp_results))
    assert path.read_bytes() == good
    assert [r.getMessage() for r in caplog.records] == [
        f"journal {path}: dropped an incomplete last record ({len(fragment)} bytes) left by a "
        "write that failed (full disk?) or by a killed process"
    ]
    assert [t.user_attrs for t in study.trials] == [{"cell": "a", "seed": i} for i in range(3)]
    study.set_user_attr("k", 1)  # and it takes writes again, each on its own line
    assert _lines(path)[-1]["user_attr"] == {"k": 1}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        make_storage(None, tmp_results)
    assert caplog.records == []  # a sound journal opens silently


def test_a_last_record_that_only_lacks_its_newline_is_kept(
    tmp_results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study = _study(tmp_results)
    path = tmp_results / JOURNAL_FILE
    study.set_user_attr("k", "whole")
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # the newline is all that is missing
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        again = optuna.load_study(study_name="s", storage=make_storage(None, tmp_results))
    assert path.read_bytes() == data and again.user_attrs == {"k": "whole"}
    assert "completed a last record that lacked its newline" in caplog.text


def test_a_journal_broken_by_an_append_onto_a_fragment_is_repaired(
    tmp_results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What an older harness left after a full disk: a fragment, then the next record appended
    onto the same line.  Stock Optuna cannot replay it; the repair keeps the whole record."""
    _study(tmp_results)
    path = tmp_results / JOURNAL_FILE
    with path.open("ab") as f:
        f.write(b'{"op_code":9,"worker_id":"w","trial_id":0,"system_attr":{"harness:hea')
    stock = JournalStorage(JournalFileBackend(str(path)))  # Optuna's own backend appends onto it
    stock_study = optuna.load_study(study_name="s", storage=stock)
    stock_study.set_user_attr("after", 1)  # lands on the fragment's line
    with pytest.raises(ValueError):  # written, but from now on nothing replays (JSONDecodeError)
        stock_study.set_user_attr("later", 2)
    with pytest.raises(ValueError):
        optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        study = optuna.load_study(study_name="s", storage=make_storage(None, tmp_results))
    assert study.user_attrs == {"after": 1, "later": 2} and len(study.trials) == 3
    assert "repaired damaged records left by failed writes (1 recovered, 0 fragments" in caplog.text
    assert all(isinstance(r, dict) for r in _lines(path))  # stock Optuna replays it again
    optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))


def test_the_tail_is_repaired_only_under_the_lock(
    tmp_results: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A live writer holds the lock while its line is incomplete: opening waits for the lock,
    finds the line completed, and cuts nothing."""
    from harness.sweep.stores.journal_lock import JournalLock

    _study(tmp_results)
    path = tmp_results / JOURNAL_FILE
    record = json.dumps({"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"x": 1}})
    writer_lock = JournalLock(path)
    writer_lock.acquire()
    with path.open("ab") as f:
        f.write(record[:20].encode())
    waiting = threading.Event()
    real_acquire = JournalLock.acquire

    def acquire(self: Any) -> bool:
        waiting.set()  # the opener saw an incomplete tail and now waits for the lock
        return real_acquire(self)

    monkeypatch.setattr(JournalLock, "acquire", acquire)
    opened: list[Any] = []
    opener = threading.Thread(target=lambda: opened.append(make_storage(None, tmp_results)))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        opener.start()
        assert waiting.wait(60)
        with path.open("ab") as f:
            f.write(record[20:].encode() + b"\n")
        writer_lock.release()
        opener.join(60)
    assert opened and caplog.records == []
    assert _lines(path)[-1]["user_attr"] == {"x": 1}
    assert optuna.load_study(study_name="s", storage=opened[0]).user_attrs == {"x": 1}


# -- recognising a full disk ------------------------------------------------------------------


def _sqlite_full() -> sa_exc.OperationalError:
    err = sqlite3.OperationalError("database or disk is full")
    return sa_exc.OperationalError("INSERT INTO tags ...", {}, err)


def test_a_full_disk_is_recognised_in_every_store_and_never_retried() -> None:
    from mlflow.exceptions import MlflowException

    enospc = OSError(errno.ENOSPC, "No space left on device", "/r/optuna-journal.log")
    try:
        try:
            raise _sqlite_full()
        except sa_exc.OperationalError as e:
            raise MlflowException(str(e)) from e
    except MlflowException as e:
        mlflow_full = e
    cases = {
        "journal": enospc,
        "quota": OSError(errno.EDQUOT, "Disk quota exceeded"),
        "sqlite": _sqlite_full(),
        "mlflow": mlflow_full,
    }
    for name, err in cases.items():
        assert is_disk_full(err), name
    assert disk_full_message(enospc) == (
        "disk full (No space left on device writing /r/optuna-journal.log)"
    )
    assert disk_full_message(mlflow_full) == "disk full (database or disk is full)"
    assert not is_transient_db_error(_sqlite_full())  # no minute of retries before the line
    assert is_transient_db_error(sa_exc.OperationalError("SELECT 1", {}, Exception("gone")))
    for other in (OSError(errno.EACCES, "Permission denied"), ValueError("x"), KeyError("k")):
        assert not is_disk_full(other)


# -- a full disk mid-sweep, in process (no root needed) --------------------------------------


def _gated_rewards(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A python: task whose reward waits, the first time, until ``gate`` exists (after writing
    ``ready``): the test acts while a trial is known to be mid-training."""
    gate, ready = tmp_path / "gate", tmp_path / "ready"
    module = tmp_path / "gated_rewards.py"
    module.write_text(
        "import os, time\n"
        f"GATE, READY = {str(gate)!r}, {str(ready)!r}\n"
        "def examples():\n"
        "    return [{'prompt': f'{i}=', 'answer': str(i)} for i in range(40)]\n"
        "def gated(prompt, completion, answer):\n"
        "    if not os.path.exists(GATE):\n"
        "        open(READY, 'w').close()\n"
        "        while not os.path.exists(GATE):\n"
        "            time.sleep(0.02)\n"
        "    return float(completion == answer)\n"
    )
    return module, gate, ready


def _experiment(tmp_path: Path, name: str, task: str, seeds: int = 1) -> Path:
    # The gated reward waits on the test, which may be slow on a loaded machine.
    slow = {"task_options": {"reward_timeout_s": 600}}
    return small_experiment(tmp_path, name, task, seeds=seeds, base=slow)


def test_a_journal_that_refuses_the_result_stops_the_worker_resumably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run trained, then the journal refused its result (ENOSPC): the worker stops with a
    ``fatal`` event instead of going on, the journal replays, the MLflow run is closed KILLED
    with the reason, and a later worker re-runs the trial to COMPLETE exactly once."""
    from harness.config.experiment import load_experiment
    from harness.sweep.launching.worker import WorkerOptions, worker_loop
    from harness.sweep.scheduler.study import enqueue_missing, open_study
    from harness.tracking import MemoryTracker

    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "1")
    module, _, _ = _gated_rewards(tmp_path)
    (tmp_path / "gate").write_text("")  # no waiting in this test
    exp = load_experiment(_experiment(tmp_path, "refused", f"python:{module}:gated"))
    results = tmp_path / "results"
    tracker = MemoryTracker()  # the workers below run in this process and share it
    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    study, spec = open_study(
        exp,
        storage=make_storage(None, results),
        tracker=tracker,
        study_name=None,
        tracking_uri="memory",
        command="test",
    )
    assert enqueue_missing(study, spec) == (2, 0)
    real_append = journal_mod.SafeJournalFileBackend.append_logs
    full: list[bool] = []

    def append_logs(self: Any, logs: list[dict[str, Any]]) -> None:
        # The disk fills up as the trained run's id is recorded, and stays full.
        if full or any("run_id" in (log.get("user_attr") or {}) for log in logs):
            full.append(True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        real_append(self, logs)

    monkeypatch.setattr(journal_mod.SafeJournalFileBackend, "append_logs", append_logs)
    events: list[dict[str, Any]] = []
    opts = WorkerOptions(study="refused", storage=None, results_dir=results)
    counts = worker_loop(opts, emit=events.append)
    assert counts["disk_full"] == 1 and counts["completed"] == 0, counts
    fatal = [e for e in events if e["event"] == "fatal"]
    assert [e["reason"] for e in fatal] == [
        f"disk full (No space left on device writing {results / JOURNAL_FILE})"
    ]
    done = [e for e in events if e["event"] == "done"]
    assert [(e["outcome"], e["reason"]) for e in done] == [("interrupted", fatal[0]["reason"])]
    assert events[-1]["event"] == "exit"
    monkeypatch.setattr(journal_mod.SafeJournalFileBackend, "append_logs", real_append)

    _lines(results / JOURNAL_FILE)  # every record whole
    children = [r for r in tracker.runs.values() if r.tags.get("harness.role") == "child"]
    assert [(r.status, r.tags["run.status"], r.tags["run.reason"]) for r in children] == [
        ("KILLED", "interrupted", fatal[0]["reason"])
    ]

    counts = worker_loop(opts)  # space is back: the stale trial is retried, the rest runs
    assert counts["completed"] == 2 and "disk_full" not in counts, counts
    trials = optuna.load_study(study_name="refused", storage=make_storage(None, results)).trials
    complete = [
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in trials if t.state.name == "COMPLETE"
    ]
    assert sorted(complete) == [("c_clip=3", 0), ("c_clip=none", 0)]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    statuses = sorted(r.status for r in tracker.runs.values() if r.tags["harness.role"] == "child")
    assert statuses == ["FINISHED", "FINISHED", "KILLED"]


# -- a full disk mid-sweep, for real (a tiny tmpfs; root only) --------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Any:
    """A 64 MiB tmpfs (the results dir check wants 50 MiB free), unmounted afterwards."""
    yield from mounted(["-t", "tmpfs", "-o", "size=64m", "tmpfs"], tmp_path / "tiny")


def _fill(mnt: Path) -> Path:
    """Write a file until the filesystem refuses more (ENOSPC); returns it."""
    filler = mnt / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
    return filler


def _harness(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_disk_that_fills_mid_sweep_stops_it_with_one_line_and_it_resumes(
    tmp_path: Path, tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module, gate, ready = _gated_rewards(tmp_path)
    exp = _experiment(tmp_path, "full", f"python:{module}:gated")
    results = tiny_fs / "results"
    env = {**os.environ, "HARNESS_HEARTBEAT_S": "1"}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err_file:
        proc = start_ablate(exp, results, env, err_file)
        try:
            while not ready.exists():  # the first trial is mid-training, waiting on the gate
                assert proc.poll() is None, err_path.read_text()[-3000:]
                threading.Event().wait(0.05)
            filler = _fill(tiny_fs)
            gate.write_text("")
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = err_path.read_text()
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err and "heartbeat" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: disk full ("), err[-3000:]
    assert errors[0].endswith("run the same command again (a sweep resumes where it stopped)")
    assert len(err.splitlines()) < 20, err  # the progress table and that line, no flood
    journal = results / JOURNAL_FILE
    _lines(journal)  # no record was left half-written

    filler.unlink()
    with journal.open("ab") as f:  # and one that was, by a writer killed mid-write
        f.write(b'{"op_code":8,"worker_id":"w","trial_id":0,"user_attr":{"reason":"disk')
    from typer.testing import CliRunner

    from harness.cli import app

    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        status = CliRunner().invoke(app, ["status", "--results-dir", str(results)])
    assert status.exit_code == 0, status.output
    assert "full" in status.stdout and "dropped an incomplete last record" in caplog.text
    report = CliRunner().invoke(app, ["report", "full", "--results-dir", str(results)])
    # Exit 1 (report still written) when no run had completed before the disk filled.
    assert report.exit_code == (1 if "no run completed" in report.output else 0), report.output
    assert not isinstance(report.exception, Exception) or isinstance(report.exception, SystemExit)
    assert (results / "full" / "report.md").exists()

    resumed = _harness("ablate", str(exp), "--results-dir", str(results), env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trials = optuna.load_study(study_name="full", storage=make_storage(None, results)).trials
    complete = [
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in trials if t.state.name == "COMPLETE"
    ]
    assert sorted(complete) == [("c_clip=3", 0), ("c_clip=none", 0)]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("full").experiment_id])
    assert "RUNNING" not in {r.info.status for r in runs}
    parent = [r for r in runs if r.data.tags.get("harness.role") == "parent"]
    assert [(r.info.status, r.data.tags["harness.outcome"]) for r in parent] == [
        ("FINISHED", "complete")
    ]
    assert (results / "full" / "report.md").exists()
