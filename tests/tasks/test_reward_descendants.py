"""Processes a ``python:`` reward starts end with it, whatever session they put themselves in:
``subprocess.Popen(..., start_new_session=True)`` and a daemon's double fork left the reward
process's group, so killing the group (all the harness did) left them running after the run.
Each test waits on a process's state in ``/proc``, never on a sleep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.tasks import get_task
from harness.tasks.base import RewardError
from tests.tasks.test_reward_lifecycle import ROOT, _args, _gone, _runs, _wait_for

REWARDS = """
import os, subprocess, sys, time

PIDS = {pids!r}


def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]


def _note(pid, session):
    # Written whole or not at all: the test reads the file as soon as it exists.
    with open(PIDS + ".tmp", "w") as fh:
        fh.write(f"{{pid}} {{session}}")
    os.rename(PIDS + ".tmp", PIDS)


def _sleeper():
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(10**6)"], start_new_session=True
    )


def new_session(prompt, completion, answer):
    if not os.path.exists(PIDS):
        _note(_sleeper().pid, os.getsid(0))
    return 1.0


def daemon(prompt, completion, answer):
    # The classic double fork: the middle process exits at once, so the daemon is an orphan
    # in a session of its own before the call even returns.
    if os.path.exists(PIDS):
        return 1.0
    session = os.getsid(0)
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            _note(os.getpid(), session)
            time.sleep(10**6)
        os._exit(0)
    os.waitpid(middle, 0)
    while not os.path.exists(PIDS):
        time.sleep(0.01)
    return 1.0


def then_exit(prompt, completion, answer):
    _note(_sleeper().pid, os.getsid(0))
    os._exit(3)


def then_hang(prompt, completion, answer):
    _note(_sleeper().pid, os.getsid(0))
    time.sleep(10**6)
"""


def _module(tmp_path: Path) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    module = tmp_path / "starts.py"
    module.write_text(REWARDS.format(pids=str(pids)))
    return module, pids


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def _started(pids: Path) -> tuple[int, int]:
    """The pid the reward noted, and the session of the reward process that started it."""
    pid, session = pids.read_text().split()
    return int(pid), int(session)


@pytest.mark.parametrize("func", ["new_session", "daemon"])
def test_a_process_a_reward_starts_in_its_own_session_ends_with_the_task(tmp_path, func):
    module, pids = _module(tmp_path)
    task = get_task(f"python:{module}:{func}")
    try:
        assert task.score(task.train[0], "1") == 1.0
        started, reward_session = _started(pids)
        assert not _gone(started)
        assert _session(started) != reward_session  # it left the reward process's session
    finally:
        task.close()
    _wait_for(lambda: _gone(started), f"the process {started} to end", timeout=30)


@pytest.mark.parametrize(
    ("func", "reason"),
    [
        ("then_exit", "ended the reward process (exit code 3, e.g. os._exit(3))"),
        ("then_hang", "did not return within task_options.reward_timeout_s = 1 s"),
    ],
)
def test_a_reward_that_ends_or_is_stopped_takes_what_it_started_with_it(tmp_path, func, reason):
    module, pids = _module(tmp_path)
    task = get_task(f"python:{module}:{func}", reward_timeout_s=1)
    try:
        with pytest.raises(RewardError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            task.score(task.train[0], "1")
        started, _ = _started(pids)
        # Before the task is closed: the failed call itself ends what the reward started.
        _wait_for(lambda: _gone(started), f"the process {started} to end", timeout=30)
    finally:
        task.close()


HARNESS_STAND_IN = """
import sys, time
from harness.tasks import get_task

task = get_task(sys.argv[1])
task.score(task.train[0], "1")
print("scored", flush=True)
time.sleep(10**6)
"""


def test_when_the_harness_is_killed_what_the_reward_started_ends_too(tmp_path):
    """SIGKILL leaves the harness no chance to close anything: the reward process's keeper,
    told by the kernel that its parent died, kills what is below it."""
    module, pids = _module(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS_STAND_IN, f"python:{module}:daemon"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "scored\n"  # blocks until the reward has returned
        started, _ = _started(pids)
        assert not _gone(started)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    _wait_for(lambda: _gone(started), f"the process {started} to end", timeout=30)


def test_harness_run_leaves_no_process_a_reward_started_in_its_own_session(tmp_path):
    module, pids = _module(tmp_path)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, _args(module, "daemon", results))
    assert r.exit_code == 0, r.output[-3000:]
    (run,) = _runs(results)
    assert run.info.status == "FINISHED"
    started, _ = _started(pids)
    _wait_for(lambda: _gone(started), f"the process {started} to end", timeout=30)
