"""How a run ends when its ``python:`` reward hangs, exits, returns what cannot be trained on, or
misbehaves in other ways; and how ``harness run`` ends on SIGTERM and SIGINT.  Every way out is
a closed MLflow run (FAILED or KILLED) with its reason and a line on the console."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.tiny import SMALL_SETS, set_flags

ROOT = Path(__file__).resolve().parents[2]

REWARDS = """
import ctypes, os, sys, time

READY = {ready!r}

def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]

def good(prompt, completion, answer):
    return float(completion == answer)

def spin(prompt, completion, answer):
    while True:
        pass

def sleeps(prompt, completion, answer):
    time.sleep(10**6)

def exits(prompt, completion, answer):
    sys.exit(0)

def hard_exit(prompt, completion, answer):
    os._exit(3)

def ctrl_c(prompt, completion, answer):
    raise KeyboardInterrupt

def too_big(prompt, completion, answer):
    return 1e39  # finite in float64, inf in float32

def huge_int(prompt, completion, answer):
    return 10**5000  # past str()'s digit limit, too

def a_list(prompt, completion, answer):
    return [1.0, 0.0]

def a_bool(prompt, completion, answer):
    return completion == answer

def hangs_after_ready(prompt, completion, answer):
    with open(READY, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(10**6)

def hangs_once(prompt, completion, answer):
    if completion == "hang":
        open(READY, "w").close()
        time.sleep(10**6)
    return 1.0

def forks(prompt, completion, answer):
    if os.path.exists(READY):
        return 1.0
    if os.fork() == 0:  # the forked copy writes its pid and lingers; it must not outlive the run
        with open(READY + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(READY + ".tmp", READY)
        time.sleep(10**6)
    deadline = time.monotonic() + 60
    while not os.path.exists(READY) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 1.0

def forks_and_returns(prompt, completion, answer):
    os.fork()  # both copies return into the reward process's loop: only the real one answers
    return 0.5

def loud(prompt, completion, answer):
    print("x" * (100 * 1024 * 1024))
    os.write(1, b"y" * (8 * 1024 * 1024))
    return 0.25

def mutates(prompt, completion, answer):
    # Overwrite the answer string's characters in place: in-process this would corrupt the
    # run's own copy (and every string interned with it).
    if answer:
        offset = sys.getsizeof(answer) - len(answer) - 1
        ctypes.memmove(id(answer) + offset, b"Z" * len(answer), len(answer))
    return 0.0
"""

SMALL = set_flags("steps=1", *SMALL_SETS)


def _module(tmp_path: Path) -> tuple[Path, Path]:
    ready = tmp_path / "ready"
    module = tmp_path / "rewards.py"
    module.write_text(REWARDS.format(ready=str(ready)))
    return module, ready


def _args(module: Path, func: str, results: Path, *extra: str) -> list[str]:
    return [
        "run", "--set", f"task=python:{module}:{func}", *SMALL, *extra,
        "--results-dir", str(results),
    ]  # fmt: skip


def _runs(results: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    return client.search_runs(client.get_experiment_by_name("harness-run").experiment_id)


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (gone, or a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    """Wait until ``predicate()`` holds, at most ``timeout`` seconds (then fail naming it)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.05)


# -- rewards that cannot give a usable number: a FAILED run with the reason, exit code 1 ------

FAILS = {
    "spin": "did not return within task_options.reward_timeout_s = 1.5 s",
    "sleeps": "did not return within task_options.reward_timeout_s = 1.5 s",
    "exits": "called sys.exit(0)",
    "hard_exit": "ended the reward process (exit code 3, e.g. os._exit(3))",
    "ctrl_c": "raised KeyboardInterrupt",
    "too_big": "returned 1e+39, outside the float32 range",
    "huge_int": "returned an integer of 16610 bits, beyond float range",
    "a_list": "returned [1.0, 0.0], not a number",
}


def test_a_reward_that_hangs_exits_or_returns_no_usable_number_is_a_failed_run(tmp_path):
    module, _ = _module(tmp_path)
    results = tmp_path / "results"
    for func, reason in FAILS.items():
        r = CliRunner().invoke(
            app, _args(module, func, results, "--set", "task_options.reward_timeout_s=1.5")
        )
        assert r.exit_code == 1, (func, r.output)
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert err[-1].startswith(f"error: run FAILED: task 'python:{module}:{func}': "), err
        assert reason in err[-1] and "Traceback" not in r.output, (func, err[-1])
    runs = _runs(results)
    assert len(runs) == len(FAILS) and {run.info.status for run in runs} == {"FAILED"}
    for run in runs:
        func = run.data.tags["mlflow.runName"].split(":")[-1].split("-seed")[0]
        assert FAILS[func] in run.data.tags["run.reason"], run.data.tags["run.reason"]


def test_a_bool_reward_counts_as_0_or_1_and_the_run_completes(tmp_path):
    module, _ = _module(tmp_path)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, _args(module, "a_bool", results))
    assert r.exit_code == 0, r.output
    (run,) = _runs(results)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["final/reward"] in (0.0, 1.0)


def test_reward_timeout_is_a_declared_bounded_option(tmp_path):
    module, _ = _module(tmp_path)
    results = tmp_path / "results"
    for value, words in (("0", "reward_timeout_s"), ("1e9", "reward_timeout_s")):
        r = CliRunner().invoke(
            app, _args(module, "good", results, "--set", f"task_options.reward_timeout_s={value}")
        )
        assert r.exit_code == 2, r.output
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a task that calls no user code refuses it rather than ignoring it
    r = CliRunner().invoke(
        app, ["run", "--set", "task=reverse", "--set", "task_options.reward_timeout_s=5", *SMALL]
    )
    assert r.exit_code == 2 and "reward_timeout_s" in r.stderr, r.output
    assert not (results / "mlflow.db").exists()


def test_a_built_in_reward_scale_beyond_float32_is_refused_before_training(tmp_path):
    results = tmp_path / "results"
    for task, key in (("add", "scale"), ("mixed-scale", "add_scale")):
        r = CliRunner().invoke(
            app,
            ["run", "--set", f"task={task}", "--set", f"task_options.{key}=1e39", *SMALL]
            + ["--results-dir", str(results)],
        )
        assert r.exit_code == 2, r.output
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"error: task_options.{key}: ") and "1e+06" in line, line
    assert not results.exists() or not any(results.iterdir())


# -- rewards that misbehave without failing: the run goes on, unharmed ------------------------


def test_a_reward_that_prints_100_mb_is_capped_on_the_console(tmp_path):
    module, _ = _module(tmp_path)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, _args(module, "loud", results))
    assert r.exit_code == 0, r.output[-2000:]
    assert len(r.stderr) < 200_000, len(r.stderr)
    assert "[reward loud: output past 64 KiB is dropped]" in r.stderr
    (run,) = _runs(results)
    assert run.info.status == "FINISHED"
    assert abs(run.data.metrics["final/reward"] - 0.25) < 1e-6


def test_a_reward_that_mutates_its_inputs_cannot_reach_the_runs_data(tmp_path):
    from harness.tasks import get_task

    module, _ = _module(tmp_path)
    task = get_task(f"python:{module}:mutates")
    try:
        held = [(e.prompt, e.answer) for e in task.eval_examples(4)]
        for ex in task.train[:3] + task.eval_examples(4):
            answer = ex.answer
            assert task.score(ex, "1") == 0.0
            assert ex.answer == answer and "Z" not in ex.answer
        assert [(e.prompt, e.answer) for e in task.eval_examples(4)] == held
        assert all(e.answer.isdigit() for e in task.train)
    finally:
        task.close()


def test_a_call_cut_short_by_a_signal_leaves_no_answer_behind(tmp_path):
    """Ctrl-C during a call (a signal sent once the reward is known to be running), then
    another call: it gets its own answer from a new process, not the first call's late one."""
    import threading

    from harness.tasks import get_task

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    module, ready = _module(tmp_path)
    task = get_task(f"python:{module}:hangs_once", reward_timeout_s=30)
    main = threading.main_thread().ident
    previous = signal.signal(signal.SIGUSR1, interrupt)

    def when_ready() -> None:
        _wait_for(ready.exists, "the reward to be called")
        signal.pthread_kill(main, signal.SIGUSR1)

    try:
        assert task.score(task.train[0], "1") == 1.0  # the process is up
        sender = threading.Thread(target=when_ready)
        sender.start()
        with pytest.raises(Interrupted):
            task.score(task.train[0], "hang")
        sender.join()
        assert task.score(task.train[1], "1") == 1.0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        task.close()


def test_a_reward_that_forks_and_returns_twice_gets_one_answer(tmp_path):
    from harness.tasks import get_task

    module, _ = _module(tmp_path)
    task = get_task(f"python:{module}:forks_and_returns")
    try:
        # each call forks once more; a second answer left in the pipe would shift every later
        # call's answer by one and the protocol would break
        assert [task.score(ex, "1") for ex in task.train[:5]] == [0.5] * 5
    finally:
        task.close()


def test_a_process_a_reward_forks_ends_with_its_task(tmp_path):
    from harness.tasks import get_task

    module, ready = _module(tmp_path)
    task = get_task(f"python:{module}:forks")
    try:
        assert task.score(task.train[0], "1") == 1.0
        lingering = int(ready.read_text())
        assert not _gone(lingering)
    finally:
        task.close()
    _wait_for(lambda: _gone(lingering), f"the forked process {lingering} to end", timeout=30)


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and Python
    # then installs no Ctrl-C handler: the harness must see SIGINT as a terminal's Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _harness(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
        **kw,
    )


@pytest.mark.slow  # a harness process of its own (the fast check: the test above)
def test_a_process_a_reward_forks_does_not_keep_the_run_alive(tmp_path):
    """The forked copy sleeps for ever holding the reward process's stdout; the harness still
    exits (its pipes closed, so communicate() returns) and the copy is killed with the run."""
    module, ready = _module(tmp_path)
    proc = _harness(_args(module, "forks", tmp_path / "results"))
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    lingering = int(ready.read_text())
    _wait_for(lambda: _gone(lingering), f"the forked process {lingering} to end", timeout=30)


# -- SIGTERM and Ctrl-C while a reward never returns ------------------------------------------


@pytest.mark.parametrize(
    ("signum", "code", "reason"),
    [
        (signal.SIGTERM, 143, "terminated by SIGTERM"),
        pytest.param(signal.SIGINT, 130, "interrupted by SIGINT (Ctrl-C)", marks=pytest.mark.slow),
    ],
)
def test_a_signal_during_a_reward_that_never_returns_closes_the_run_killed(
    tmp_path, signum, code, reason
):
    module, ready = _module(tmp_path)
    results = tmp_path / "results"
    args = _args(module, "hangs_after_ready", results, "--set", "task_options.reward_timeout_s=600")
    proc = _harness(args)
    try:
        _wait_for(
            lambda: (ready.exists() and ready.read_text() != "") or proc.poll() is not None,
            "the reward to be called",
            timeout=600,  # a harness start and preflight: minutes on a loaded machine
        )
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1] == f"error: run KILLED: {reason}", lines[-3:]
    assert "Traceback" not in err
    (run,) = _runs(results)
    assert run.info.status == "KILLED"
    assert run.data.tags["run.reason"] == reason
    assert run.data.tags["run.status"] == "interrupted"
    child = int(ready.read_text())
    _wait_for(lambda: _gone(child), f"the reward process {child} to end", timeout=30)


# -- every way out of tracked_run closes the run with its reason ------------------------------


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (SystemExit(0), "FAILED", "SystemExit: 0"),
        (KeyboardInterrupt(), "KILLED", "interrupted by SIGINT (Ctrl-C)"),
        ("SIGTERM", "KILLED", "terminated by SIGTERM"),
        ("SIGHUP", "KILLED", "terminated by SIGHUP"),
    ],
)
def test_every_way_a_run_ends_closes_it_with_the_reason(monkeypatch, error, status, reason):
    import harness.run.tracked as tracked
    from harness.config import RunConfig
    from harness.tracking import MemoryTracker

    if isinstance(error, str):
        error = tracked.Terminated(signal.Signals[error])

    def train(*args, **kwargs):
        raise error

    monkeypatch.setattr(tracked, "train", train)
    tracker = MemoryTracker()
    with pytest.raises(type(error)):
        tracked.tracked_run(RunConfig(), tracker, experiment="e", run_name="r")
    (run,) = tracker.runs.values()
    assert run.status == status
    assert run.tags["run.reason"] == reason


def test_sigterm_in_harness_run_raises_where_the_run_waits_and_restores_the_handler():
    import threading

    from harness.run.tracked import Terminated, signals_interrupt

    before = signal.getsignal(signal.SIGTERM)
    waiting = threading.Event()
    with pytest.raises(Terminated, match="terminated by SIGTERM"), signals_interrupt():
        threading.Thread(
            target=lambda: waiting.wait(60) and os.kill(os.getpid(), signal.SIGTERM)
        ).start()
        waiting.set()
        # The kernel may deliver the signal to the sending thread; the main thread then runs the
        # handler at its next bytecode, so it waits in short sleeps rather than in one long wait.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is before


DRAWS = """
import random

import numpy as np
import torch

AT_IMPORT = random.random()


def at_import(prompt, completion, answer):
    return AT_IMPORT


def py(prompt, completion, answer):
    return random.random()


def numpy(prompt, completion, answer):
    return float(np.random.rand())


def torch_(prompt, completion, answer):
    return float(torch.rand(()))
"""


def test_the_reward_process_draws_from_the_runs_seed(tmp_path):
    """A fresh interpreter seeds itself from the OS: the reward process seeds `random`, NumPy and
    torch with the run's seed, so a sampling reward scores a run and its rerun the same."""
    import random

    import numpy as np
    import torch

    from harness.tasks.reward_process import RewardProcess

    module = tmp_path / "draws.py"
    module.write_text(DRAWS)

    def draws(seed: int) -> dict[str, list[float]]:
        torch.manual_seed(seed)  # what open_run does with cfg.seed
        out = {}
        for name in ("at_import", "py", "numpy", "torch_"):
            child = RewardProcess(f"python:{module}:{name}", str(module), name, 30.0)
            try:
                out[name] = [child.call(name, "p", "c", "a") for _ in range(2)]
            finally:
                child.close()
        return out

    with torch.random.fork_rng():  # the test's own torch state is left as it was
        got, again, other = draws(7), draws(7), draws(8)
    rng = random.Random(7)
    assert got["at_import"] == [pytest.approx(rng.random())] * 2
    rng = random.Random(7)
    assert got["py"] == pytest.approx([rng.random(), rng.random()])
    assert got["numpy"] == pytest.approx(list(np.random.RandomState(7).rand(2)))
    gen = torch.Generator().manual_seed(7)
    assert got["torch_"] == pytest.approx([float(torch.rand((), generator=gen)) for _ in range(2)])
    assert again == got  # the same seed, the same draws in a new process
    assert all(other[k] != got[k] for k in got)  # another seed, other draws
