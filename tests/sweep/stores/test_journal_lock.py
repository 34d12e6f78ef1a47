"""The journal lock: a process killed while holding it never leaves a results dir locked (the
kernel releases an ``flock``), a wait on a live holder is bounded and says who it waits for, and
a sweep killed at exactly that moment resumes with every (cell, seed) complete once.

Every process here uses the journal through a *relative* path from its working directory, as
``harness ablate`` does by default (``results/optuna-journal.log``): with Optuna's symlink lock
that is what made a dead holder's lock permanent."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.sweep.stores.journal_lock import JournalLock, LockTimeout
from tests.hooks.kill_at import kill_group_at_marker

ROOT = Path(__file__).resolve().parents[3]
HOOKS = Path(__file__).resolve().parents[2] / "hooks"
SMOKE = ROOT / "experiments" / "smoke.yaml"
JOURNAL = "results/optuna-journal.log"

HOLDER = """
import os, sys, time
from harness.sweep.stores.journal_lock import JournalLock
lock = JournalLock({journal!r})
lock.acquire()
open("held", "w").write(str(os.getpid()))
time.sleep(3600)
"""

TAKER = """
import logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from harness.sweep.stores.journal_lock import JournalLock
lock = JournalLock({journal!r}, timeout_s={timeout})
t0 = time.monotonic()
lock.acquire()
print(f"acquired {{time.monotonic() - t0:.3f}}")
lock.release()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _start_holder(cwd: Path) -> subprocess.Popen[str]:
    (cwd / "results").mkdir(exist_ok=True)
    (cwd / JOURNAL).touch()
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(journal=JOURNAL)],
        cwd=cwd,
        env=_env(),
        text=True,
        stderr=subprocess.PIPE,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], bound: float = 120) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    while not path.read_text():  # written right after creation
        time.sleep(0.01)


def _take(cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TAKER.format(journal=JOURNAL, timeout=timeout)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_holder_killed_while_holding_the_lock_releases_it_at_once(tmp_path: Path) -> None:
    holder = _start_holder(tmp_path)
    _wait_for(tmp_path / "held", holder)
    pid = int((tmp_path / "held").read_text())
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # No grace period to sit out: the bound of 30 s is never approached.
    taken = _take(tmp_path, timeout=30)
    assert taken.returncode == 0, taken.stderr
    assert float(taken.stdout.split()[1]) < 5.0
    lines = [line for line in taken.stderr.splitlines() if "journal lock" in line]
    assert len(lines) == 1, taken.stderr
    assert f"from pid {pid} on " in lines[0] and "which died holding it" in lines[0]
    # Released cleanly this time: the next taker has nothing to say.
    again = _take(tmp_path, timeout=30)
    assert again.returncode == 0 and "journal lock" not in again.stderr, again.stderr


def test_a_wait_on_a_live_holder_is_bounded_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _start_holder(tmp_path)
    try:
        _wait_for(tmp_path / "held", holder)
        pid = int((tmp_path / "held").read_text())
        monkeypatch.chdir(tmp_path)  # the relative path, as a command run in that folder gives it
        lock = JournalLock(JOURNAL, timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(LockTimeout) as raised:
            lock.acquire()
        assert time.monotonic() - t0 < 10
        message = str(raised.value)
        assert "\n" not in message
        assert f"held by pid {pid} on " in message and "more than 0.5 s" in message
        assert str(tmp_path / JOURNAL) + ".flock" in message  # absolute: findable
    finally:
        holder.kill()
        holder.wait()


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_LOCK_TIMEOUT_S", "7.5")
    assert JournalLock("x.log").timeout_s == 7.5
    monkeypatch.setenv("HARNESS_LOCK_TIMEOUT_S", "nonsense")
    assert JournalLock("x.log").timeout_s == 120.0


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    lock = JournalLock(tmp_path / "j.log", timeout_s=60)
    inside = []
    overlaps = []

    def work() -> None:
        for _ in range(50):
            lock.acquire()
            try:
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                time.sleep(0.0005)
                inside.pop()
            finally:
                lock.release()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not overlaps and not inside


def test_a_stale_symlink_lock_of_an_earlier_version_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from harness.sweep.stores.storage import make_storage

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / JOURNAL).touch()
    legacy = tmp_path / (JOURNAL + ".lock")
    os.symlink(JOURNAL, legacy)  # exactly what Optuna's lock left: a relative, dangling target
    old = time.time() - 3600
    os.utime(legacy, (old, old), follow_symlinks=False)
    with caplog.at_level(logging.WARNING, logger="harness.sweep.stores.journal"):
        make_storage(None, Path("results"))
    assert not os.path.lexists(legacy)
    assert "removed a stale lock left by a killed process" in caplog.text


def _ablate() -> list[str]:
    return [sys.executable, "-m", "harness", "ablate", "exp.yaml", "--workers", "2", "--no-report"]


@pytest.mark.slow  # two multi-process sweeps; CI's slow suite runs it
def test_a_sweep_killed_while_holding_the_journal_lock_resumes_every_cell_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's power cut: kill -9 to the whole process group at the moment one of its
    processes holds the journal lock (after a trial completed), then the same command again."""
    import optuna

    from harness.sweep.stores.storage import make_storage

    doc = yaml.safe_load(SMOKE.read_text())
    doc["name"] = "locked"
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(doc))
    marker = tmp_path / "holding"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT)]),
        "HARNESS_HEARTBEAT_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    cmd = _ablate()
    kill_group_at_marker(
        cmd, {**env, "HARNESS_TEST_HOLD_LOCK": str(marker)}, marker,
        "a process to take the lock after a completion", cwd=tmp_path,
    )  # fmt: skip
    t0 = time.monotonic()
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert time.monotonic() - t0 < 600
    assert "It is taking longer than" not in again.stdout + again.stderr
    monkeypatch.chdir(tmp_path)
    study = optuna.load_study(study_name="locked", storage=make_storage(None, Path("results")))
    states = Counter(t.state.name for t in study.trials)
    assert states["RUNNING"] == 0 and states["WAITING"] == 0, states
    done = Counter(
        (t.user_attrs["cell"], t.user_attrs["seed"])
        for t in study.trials
        if t.state.name == "COMPLETE"
    )
    assert sorted(done) == [(c, s) for c in ("c_clip=3", "c_clip=none") for s in (0, 1)]
    assert set(done.values()) == {1}, done  # exactly once each


def test_the_warm_start_and_mlflow_store_locks_are_bounded_too(tmp_path: Path) -> None:
    """A live holder that hangs: the waiter gives up at its bound with one line naming it."""
    import fcntl

    from harness.core.locks import wait_flock

    path = tmp_path / "x.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    os.write(holder, b"4242 somehost\n")
    waiter = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(LockTimeout) as raised:
            wait_flock(
                waiter, timeout_s=0.3, what=f"warm-start cache {path}", logger=logging.getLogger()
            )
        assert str(raised.value).startswith(f"warm-start cache {path}: held by pid 4242 on ")
        os.close(holder)  # the holder's end (as its death would be) frees it at once
        wait_flock(waiter, timeout_s=5, what="x", logger=logging.getLogger())
    finally:
        os.close(waiter)
