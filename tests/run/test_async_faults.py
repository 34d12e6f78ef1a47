"""Faults of asynchronous runs (``rollout.async``) on the threads clock, where the sampler runs in
its own thread beside the learner: Ctrl-C and SIGTERM stop both sides and the run is recorded
interrupted as a synchronous one is; a sampler that crashes (its prompt source, its decode step)
makes a FAILED run whose reason names it, on the console and in the tracker; non-finite logits in
the sampler make a diverged run, as in the synchronous loop; a sampler stuck in a decode step ends
the run after a bounded wait that names what it waited for. Whatever ends the run, no sampler
thread outlives it, and the steps recorded before the end are kept.

Every test waits on states (a run's first logged step, a marker the sampler sets), never on
sleeps, and each sampler fault is injected in this process by wrapping the real function."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

import harness.run.async_rollouts as async_rollouts
import harness.run.scaffold as scaffold
import harness.sampling.local as local_sampling
import harness.sampling.local_steps as local_steps
from harness.cli import app
from harness.config import build_run_config
from harness.run.async_rollouts import ThreadedRollouts
from harness.run.trainers import train
from harness.tracking import MemoryTracker
from tests.support.tiny import FAST_RUN, TINY, set_flags

SAMPLER = ThreadedRollouts.THREAD_NAME
ASYNC = {"max_staleness": 2, "clock": "threads", "weight_updates": "in_flight"}
ASYNC_SETS = [f"rollout.async.{k}={v}" for k, v in ASYNC.items()]


def _samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER]


@pytest.fixture(autouse=True)
def no_sampler_left() -> Iterator[None]:
    """No test starts beside another's sampler thread, and none leaves one behind."""
    assert _samplers() == []
    yield
    assert _samplers() == [], "a sampler thread outlived its run"


def _wait_for(what: str, cond: Any, limit: float = 600.0) -> None:
    """Poll ``cond`` (bounded: a safety net for a loaded 2-core machine, not a timing)."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"waited {limit:g} s for {what}"
        time.sleep(0.02)


def _harness_run(tmp_path: Any, *sets: str, steps: int = 3) -> Any:
    """``harness run`` of the tiny model on the threads clock, in this process; ``sets`` last."""
    args = set_flags(*FAST_RUN, *ASYNC_SETS, f"steps={steps}", *sets)
    return CliRunner().invoke(app, ["run", *args, "--results-dir", str(tmp_path / "results")])


def _cfg(clock: str | None, steps: int = 3) -> Any:
    """The tiny run, synchronous (``clock`` None) or asynchronous on ``clock``."""
    rollout: dict[str, Any] = {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4}
    if clock is not None:
        rollout["async"] = {**ASYNC, "clock": clock}
    eval_ = {"every": 0, "n_prompts": 2}
    base = {"steps": steps, "task": "reverse", "tiny": TINY, "threads": 1}
    return build_run_config({**base, "rollout": rollout, "eval": eval_})


def _logged_steps(run: Any) -> list[int]:
    return [s for s, _ in run.metrics.get("objective/reward", [])]


def _last_line(text: str) -> str:
    return [ln for ln in text.splitlines() if ln.strip()][-1]


# -- Ctrl-C and SIGTERM -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "code", "reason"),
    [
        (signal.SIGTERM, 143, "terminated by SIGTERM"),
        (signal.SIGINT, 130, "interrupted by SIGINT (Ctrl-C)"),
    ],
    ids=["SIGTERM", "ctrl-c"],
)
def test_a_signal_mid_run_stops_both_sides_and_keeps_the_steps_recorded(
    tmp_path, memory_tracker: MemoryTracker, sig: int, code: int, reason: str
) -> None:
    """The signal is sent once the run logged its first step (200 steps: it cannot finish
    first); it lands wherever the learner is (waiting for its batch, training, logging)."""
    done = threading.Event()

    def send() -> None:
        def logged() -> bool:
            return done.is_set() or any(
                _logged_steps(r) for r in list(memory_tracker.runs.values())
            )

        _wait_for("the run's first logged step", logged)
        if not done.is_set():
            os.kill(os.getpid(), sig)

    # Python's own Ctrl-C handler, as in a terminal: a shell starts background jobs with SIGINT
    # ignored, and Python then leaves it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        result = _harness_run(tmp_path, steps=200)
    finally:
        done.set()
        sender.join(timeout=60)
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == code, result.output[-3000:]
    assert _last_line(result.stderr) == f"error: run KILLED: {reason}", result.stderr[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    (run,) = memory_tracker.runs.values()
    assert run.status == "KILLED"
    assert run.tags["run.status"] == "interrupted" and run.tags["run.reason"] == reason
    steps = _logged_steps(run)
    assert 1 <= len(steps) < 200 and steps == list(range(len(steps))), steps
    for name, values in run.metrics.items():  # every metric of every recorded step is there
        if name.startswith(("objective/", "async/")):
            assert [s for s, _ in values] == steps, name
    assert _samplers() == []  # joined before the run was recorded: not merely ending


@pytest.mark.parametrize("clock", [None, "virtual", "threads"], ids=["sync", "virtual", "threads"])
def test_a_stop_asked_between_steps_interrupts_the_run_as_a_synchronous_one(clock) -> None:
    """A sweep worker's stop (SIGTERM sets it; the run asks before each step): the run ends
    'interrupted at step 2' with both steps kept, on every clock alike."""
    stop = threading.Event()
    seen: list[int] = []

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        seen.append(step)
        if step == 1:
            stop.set()

    result = train(_cfg(clock, steps=50), on_metrics=on_metrics, should_stop=stop.is_set)
    assert (result.status, result.reason, result.steps_done) == (
        "interrupted",
        "interrupted at step 2",
        2,
    )
    assert seen == [0, 1]
    assert len(result.history["objective/reward"]) == 2
    assert _samplers() == []


# -- a sampler that crashes -------------------------------------------------------------------


class _DryPrompts:
    """The run's task, whose prompt source raises once ``after`` prompts were drawn."""

    def __init__(self, task: Any, after: int) -> None:
        self._task, self._left = task, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def sample(self, rng: Any, n: int) -> Any:
        if n > self._left:
            raise ValueError("the prompt source ran dry")
        self._left -= n
        return self._task.sample(rng, n)


def _prompts_run_dry(monkeypatch: pytest.MonkeyPatch) -> str:
    real = scaffold.get_task
    # 6 groups at version 0 (η = 2, two per step), the 7th and 8th only once step 0's update
    # is published: the sampler crashes mid-run, after at least one step was recorded.
    monkeypatch.setattr(scaffold, "get_task", lambda *a, **k: _DryPrompts(real(*a, **k), 7))
    return "ValueError: the prompt source ran dry"


def _engine_dies(monkeypatch: pytest.MonkeyPatch) -> str:
    real = local_steps.LocalStepSampler.step
    calls = {"n": 0}

    def step(self: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 8:  # step 0's batch takes 5 decode steps (prefill + 4 tokens)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self)

    monkeypatch.setattr(local_steps.LocalStepSampler, "step", step)
    return "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("inject", [_prompts_run_dry, _engine_dies], ids=["prompts", "engine"])
def test_a_sampler_crash_makes_a_failed_run_with_its_reason(
    tmp_path, memory_tracker: MemoryTracker, monkeypatch: pytest.MonkeyPatch, inject: Any
) -> None:
    cause = inject(monkeypatch)
    result = _harness_run(tmp_path, steps=20)
    assert result.exit_code == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    line = _last_line(result.stderr)
    m = re.fullmatch(
        r"error: run FAILED: RuntimeError: asynchronous rollouts: the sampler thread failed "
        r"\(step (\d+) was waiting for its batch\): (.*)",
        line,
    )
    assert m is not None and m.group(2) == cause, line
    (run,) = memory_tracker.runs.values()
    assert run.status == "FAILED"
    assert run.tags["run.status"] == "failed"
    assert run.tags["run.reason"] == line.removeprefix("error: run FAILED: ")
    # The steps before the one that found the sampler dead are all recorded.
    failed_at = int(m.group(1))
    assert failed_at >= 1 and _logged_steps(run) == list(range(failed_at))


# -- non-finite logits in the sampler ---------------------------------------------------------


def _nan_logits_from(monkeypatch: pytest.MonkeyPatch, draw: int) -> None:
    """From the ``draw``-th sampled (not greedy) token on, the sampler's logits are NaN: what
    weights gone non-finite give. Both the step-level and the batch sampler draw through it."""
    real = local_sampling.draw_token
    calls = {"n": 0}

    def draw_token(logits: Any, t: int, **kw: Any) -> Any:
        if not kw["greedy"]:
            calls["n"] += 1
            if calls["n"] >= draw:
                logits = logits.float() * float("nan")
        return real(logits, t, **kw)

    monkeypatch.setattr(local_sampling, "draw_token", draw_token)
    monkeypatch.setattr(local_steps, "draw_token", draw_token)


def test_non_finite_logits_in_the_sampler_thread_diverge_the_run(
    tmp_path, memory_tracker: MemoryTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the summary's reason on one line
    _nan_logits_from(monkeypatch, draw=7)  # step 0 draws 4 tokens per cohort
    result = _harness_run(tmp_path, steps=20)
    assert result.exit_code == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    (run,) = memory_tracker.runs.values()
    assert run.status == "FAILED" and run.tags["run.status"] == "diverged"
    reason = run.tags["run.reason"]
    m = re.fullmatch(
        r"diverged at step (\d+): non-finite probabilities while sampling "
        r"\(non-finite logits at new token \d\)",
        reason,
    )
    assert m is not None, reason
    assert reason in result.output and "— diverged" in result.output, result.output[-3000:]
    assert int(m.group(1)) >= 1 and _logged_steps(run) == list(range(int(m.group(1))))
    assert run.tags["diverged_step"] == m.group(1)


@pytest.mark.parametrize("clock", [None, "virtual", "threads"], ids=["sync", "virtual", "threads"])
def test_non_finite_logits_diverge_every_clock_alike(
    monkeypatch: pytest.MonkeyPatch, clock: str | None
) -> None:
    """From the first sampled token on: step 0 diverges with the same reason on every clock."""
    _nan_logits_from(monkeypatch, draw=1)
    result = train(_cfg(clock))
    assert (result.status, result.steps_done) == ("diverged", 0)
    assert result.reason == (
        "diverged at step 0: non-finite probabilities while sampling "
        "(non-finite logits at new token 0)"
    )


# -- a sampler stuck in a decode step ---------------------------------------------------------


def test_a_stuck_sampler_ends_the_run_after_bounded_waits_that_name_what_they_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampler's first decode step never returns (a hung engine): the learner gives up on
    step 0's batch after BATCH_WAIT_S, closing gives up on the thread after STOP_WAIT_S, notes
    it on the run's error (which stays the reason) and releases the sampler all the same, and
    the thread, once its decode step returns, sees the stop and ends."""
    monkeypatch.setattr(async_rollouts, "BATCH_WAIT_S", 2.0)
    monkeypatch.setattr(async_rollouts, "STOP_WAIT_S", 1.0)
    stuck, release = threading.Event(), threading.Event()
    real = local_steps.LocalStepSampler.step

    def step(self: Any) -> Any:
        stuck.set()
        release.wait(600)
        return real(self)

    monkeypatch.setattr(local_steps.LocalStepSampler, "step", step)
    closed: list[Any] = []
    monkeypatch.setattr(local_steps.LocalStepSampler, "close", lambda self: closed.append(self))
    try:
        with pytest.raises(RuntimeError) as caught:
            train(_cfg("threads"))
        assert stuck.is_set()
        assert len(closed) == 1  # the sampler is released even so: no engine outlives the run
        assert re.fullmatch(
            r"asynchronous rollouts: waited 2 s for the sampler thread to finish step 0's 2 "
            r"groups \(have 0 finished, \d+ running\)",
            str(caught.value),
        ), str(caught.value)
        assert caught.value.__notes__ == [
            "asynchronous rollouts: the sampler thread did not stop within 1 s of the end of "
            "the run"
        ]
        assert len(_samplers()) == 1  # still in its decode step
    finally:
        release.set()
    (thread,) = _samplers() or [None]
    if thread is not None:
        thread.join(timeout=600)  # its step returns, then it reads the stop flag
    assert _samplers() == []
