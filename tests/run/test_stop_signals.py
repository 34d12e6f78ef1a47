"""SIGTERM/SIGHUP in ``harness run`` where Python drops the handler's exception.

Python runs a signal's handler in whatever Python code the main thread is executing; inside a
gc callback (``gc.callbacks``, where SQLAlchemy registers one) the ``Terminated`` it raises is
printed and dropped.  The stop must survive that: the run ends KILLED before its next step with
the signal's reason, one line (no traceback) says why it did not stop at once, and a second
signal still raises where the run waits.  The task module below registers a gc callback that is
slow once, in the learner's update, as a database round trip in a callback is; the test sends
SIGTERM while the main thread is inside it (a state the module announces with a marker file).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.run.tracked import StopRequest, Terminated, close_failed_run, signals_interrupt
from harness.tracking import MemoryTracker
from tests.support.tiny import FAST_RUN, set_flags

SLOW_GC_CALLBACK = """
import gc, os, sys, threading, time

IN_GC = {in_gc!r}
HANGING = {hanging!r}


def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]


def good(prompt, completion, answer):
    return float(completion == answer)


def hangs_after_gc(prompt, completion, answer):
    # In the reward process: once the harness has been inside the slow callback, never return.
    if os.path.exists(IN_GC):
        with open(HANGING, "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(10**6)
    return 0.0


def _in_update():
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "update" and code.co_filename.endswith("learner.py"):
            return True
        frame = frame.f_back
    return False


def _slow(phase, info):
    # Once, on the harness's main thread, inside the learner's update: a callback that waits
    # (as for a database) until the test's signal has run its handler in here.
    if phase != "start" or os.path.exists(IN_GC):
        return
    if threading.current_thread() is not threading.main_thread() or not _in_update():
        return
    with open(IN_GC, "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)


gc.callbacks.append(_slow)
"""


def _module(tmp_path: Path) -> tuple[Path, Path, Path]:
    in_gc, hanging = tmp_path / "in-gc", tmp_path / "hanging"
    module = tmp_path / "slow_gc_task.py"
    module.write_text(SLOW_GC_CALLBACK.format(in_gc=str(in_gc), hanging=str(hanging)))
    return module, in_gc, hanging


def _wait_for(predicate, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.02)


def _signal_when(markers: list[Path], done: threading.Event) -> threading.Thread:
    """A thread that sends SIGTERM to this process once each marker exists, in order (it gives
    up when ``done`` is set: the run ended first, which the test's asserts then report)."""

    def send() -> None:
        for marker in markers:
            while not (marker.exists() and marker.read_text()):
                if done.wait(0.02):
                    return
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


@pytest.fixture
def restored_gc_callbacks():
    before = list(gc.callbacks)
    yield
    gc.callbacks[:] = before


def _run(module: Path, func: str, results: Path, markers: list[Path]):
    done = threading.Event()
    sender = _signal_when(markers, done)
    args = [
        "run",
        *set_flags(
            *FAST_RUN,
            f"task=python:{module}:{func}",
            "steps=200",  # ends in minutes if the stop is lost: the test then fails on the code
            "eval.every=1",  # an eval (a reward call) after every update
            "task_options.reward_timeout_s=120",
        ),
        "--results-dir",
        str(results),
    ]
    try:
        result = CliRunner().invoke(app, args)
    finally:
        done.set()
        sender.join(timeout=10)
    return result


def _killed_by_sigterm(result, tracker: MemoryTracker) -> None:
    assert result.exit_code == 143, result.output[-3000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines[-1] == "error: run KILLED: terminated by SIGTERM", lines[-3:]
    assert "Traceback" not in result.output, result.output[-3000:]
    (run,) = tracker.runs.values()
    assert run.status == "KILLED"
    assert run.tags["run.reason"] == "terminated by SIGTERM"


DROPPED = (
    "SIGTERM arrived while Python ran a callback that cannot raise (a gc callback, a finalizer): "
    "the run stops before its next step (SIGTERM again stops it now)"
)


def test_a_sigterm_a_gc_callback_drops_still_ends_the_run_before_its_next_step(
    tmp_path, memory_tracker, restored_gc_callbacks
):
    module, in_gc, _ = _module(tmp_path)
    result = _run(module, "good", tmp_path / "results", [in_gc])
    _killed_by_sigterm(result, memory_tracker)
    assert DROPPED in result.stderr.splitlines()  # the signal did land in the callback
    (run,) = memory_tracker.runs.values()
    steps = len(run.metrics.get("objective/reward", []))
    assert 1 <= steps < 200, steps  # it trained, then stopped at a step boundary


def test_a_second_sigterm_ends_the_run_where_it_waits_after_the_first_was_dropped(
    tmp_path, memory_tracker, restored_gc_callbacks
):
    """The first SIGTERM lands in the callback; the step then waits in a reward that never
    returns (before the step boundary could stop it): the second SIGTERM ends the run there."""
    module, in_gc, hanging = _module(tmp_path)
    result = _run(module, "hangs_after_gc", tmp_path / "results", [in_gc, hanging])
    _killed_by_sigterm(result, memory_tracker)
    assert DROPPED in result.stderr.splitlines()
    child = int(hanging.read_text())
    _wait_for(lambda: not Path(f"/proc/{child}").exists(), f"the reward process {child} to end")


# -- the StopRequest on its own ------------------------------------------------------------


def test_a_dropped_signal_is_kept_in_the_record_and_the_next_one_raises(capfd):
    inside = threading.Event()

    def slow(phase: str, info: dict) -> None:
        if phase == "start" and threading.current_thread() is threading.main_thread():
            inside.set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.01)

    def send() -> None:
        inside.wait(60)
        os.kill(os.getpid(), signal.SIGHUP)

    with signals_interrupt() as stop:
        assert stop.check() is False
        gc.callbacks.append(slow)
        try:
            sender = threading.Thread(target=send)
            sender.start()
            gc.collect()  # the handler runs inside `slow`; gc drops what it raises
        finally:
            gc.callbacks.remove(slow)
            sender.join()
        assert stop.signum == signal.SIGHUP
        with pytest.raises(Terminated, match="terminated by SIGHUP"):
            stop.check()
        with pytest.raises(Terminated, match="terminated by SIGHUP"):
            signal.raise_signal(signal.SIGTERM)  # not ignored: the first one's reason
    err = capfd.readouterr().err
    assert "SIGHUP arrived while Python ran a callback that cannot raise" in err
    assert "Traceback" not in err


def test_a_signal_while_the_run_is_recorded_does_not_cut_the_recording():
    """Closing the run (tags, then the status) is not interrupted: a signal there is recorded
    and the run still ends KILLED, not RUNNING."""

    class Signalling(MemoryTracker):
        def set_tags(self, run_id, tags):
            signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
            super().set_tags(run_id, tags)

    tracker = Signalling()
    rid = tracker.start_run(experiment="e", run_name="r")
    with signals_interrupt() as stop:
        close_failed_run(tracker, rid, Terminated(signal.SIGTERM))
    assert stop.signum == signal.SIGTERM
    assert tracker.runs[rid].status == "KILLED"
    assert tracker.runs[rid].tags["run.reason"] == "terminated by SIGTERM"


def test_off_the_main_thread_only_a_record_is_yielded():
    got: list[StopRequest] = []
    before = signal.getsignal(signal.SIGTERM)

    def enter() -> None:
        with signals_interrupt() as stop:
            got.append(stop)
            got.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=enter)
    worker.start()
    worker.join()
    assert isinstance(got[0], StopRequest) and got[0].signum is None
    assert got[1] is before
