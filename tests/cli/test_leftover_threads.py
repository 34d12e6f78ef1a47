"""A non-daemon thread that user code leaves running does not keep a harness process alive.

Python joins every non-daemon thread at exit, without a bound.  A ``python:`` task module that
starts one at import (each process that builds the task imports it: ``harness run``, a sweep's
coordinator and its workers) would keep ``harness run`` alive after its run was recorded, and a
sweep's worker alive after its last trial, so that ``ablate`` never wrote its report.  Each ends
now, with its status, its output flushed and its run recorded, after one line naming the thread
(harness/core/exiting.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.study_reads import mlflow_runs, trials
from tests.support.tiny import FAST_RUN, TINY, set_flags

ROOT = Path(__file__).resolve().parents[2]

LINGERING = """
import threading

threading.Thread(target=threading.Event().wait, name="never-ends").start()  # not a daemon


def examples():
    return [{"prompt": f"{i}=", "answer": str(i)} for i in range(40)]


def score(prompt, completion, answer):
    return float(completion == answer)
"""


def _noted(stderr: str) -> bool:
    """The one line naming the thread(s) left (a module imported twice started two)."""
    return any(
        line.startswith("note: ")
        and "not started by the harness (a task module's, a library's) still run (never-ends"
        in line
        and line.endswith("2 s after it finished; exiting without them")
        for line in stderr.splitlines()
    )


def _harness(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness ARGS``, failing (not hanging) when it outlives ``timeout``; its
    process group (a sweep's workers too) is killed then."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"still running after {timeout:g} s:\n{err[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the command left in its group
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# -- the exit itself (a plain interpreter: seconds) --------------------------------------------

EXITS = """
import atexit, sys, threading, time
sys.path.insert(0, {root!r})
from harness.core.exiting import exit_despite_threads

atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target={target}, name="lingering").start()
print("output before the exit", end="")  # unflushed: the exit must flush it
exit_despite_threads(3)
print(" | returned")
"""


def _exits(tmp_path: Path, target: str) -> subprocess.CompletedProcess:
    code = EXITS.format(root=str(ROOT), target=target)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_a_thread_that_never_ends_is_left_after_the_grace_with_the_status(tmp_path):
    done = _exits(tmp_path, "threading.Event().wait")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "output before the exit" + "atexit ran\n"
    assert done.stderr.strip() == (
        "note: 1 thread(s) not started by the harness (a task module's, a library's) still run "
        "(lingering) 2 s after it finished; exiting without them"
    )


def test_a_thread_that_ends_within_the_grace_is_waited_for(tmp_path):
    done = _exits(tmp_path, "lambda: time.sleep(0.2)")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "output before the exit | returned\natexit ran\n"
    assert done.stderr == ""


def test_the_command_line_exits_with_its_status_despite_a_lingering_thread(tmp_path):
    """The ``harness`` entry point (not CliRunner, which keeps its process): a command that
    succeeds exits 0 with its output, one that refuses its input exits 2 with its one line."""
    code = (
        f"import sys, threading; sys.path.insert(0, {str(ROOT)!r}); "
        "threading.Thread(target=threading.Event().wait, name='never-ends').start(); "
        "from harness.cli import app; app()"
    )

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )

    ok = harness("fields", "--help")
    assert ok.returncode == 0, ok.stderr
    assert "List every run-config field" in ok.stdout
    assert _noted(ok.stderr)
    bad = harness("fields", "--bogus")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines()[0].startswith("error: No such option: --bogus")
    assert _noted(bad.stderr)


# -- harness run and ablate with a task module that starts such a thread ----------------------


@pytest.mark.slow  # a harness process of its own: a minute on a loaded machine
def test_harness_run_ends_and_records_its_run(tmp_path):
    (tmp_path / "lingering.py").write_text(LINGERING)
    results = tmp_path / "results"
    args = ["run", *set_flags(*FAST_RUN, "task=python:lingering.py:score")]
    done = _harness([*args, "--results-dir", str(results)], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "completed" in done.stdout and "wall time (s)" in done.stdout  # the summary, flushed
    assert _noted(done.stderr)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("harness-run").experiment_id)
    assert run.info.status == "FINISHED"
    assert "final/reward" in run.data.metrics


@pytest.mark.slow  # a sweep: a coordinator and a worker process
def test_ablate_finishes_and_writes_its_report(tmp_path):
    (tmp_path / "lingering.py").write_text(LINGERING)
    exp = tmp_path / "lingering.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "lingering",
                "base": {
                    "task": "python:lingering.py:score",
                    "tiny": TINY,
                    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
                    "eval": {"every": 0, "n_prompts": 2},
                    "threads": 1,
                },
                "grid": {"ppo.c_clip": [None, 3.0]},
                "seeds": 1,
                "steps": 2,
                "baseline": {"ppo.c_clip": None},
                "metric": "final/reward",
            }
        )
    )
    results = tmp_path / "results"
    args = ["ablate", str(exp), "--workers", "1", "--results-dir", str(results)]
    done = _harness(args, tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _noted(done.stderr)  # the worker's (and the coordinator's, if it imported the module)
    assert (results / "lingering" / "report.md").is_file()
    ts = trials(results, "lingering")
    assert len(ts) == 2 and all(t.state.name == "COMPLETE" for t in ts)
    _, runs = mlflow_runs(results, "lingering")
    assert {r.info.status for r in runs} == {"FINISHED"}
