"""What a ``python:`` reward's process sends back: numpy values are rewards like Python's own,
and a reply is bounded in time as a whole (not by its first byte), in size, and in shape, so a
reward that writes half a frame to its reply pipe and sleeps, or announces gigabytes, or sends
garbage, ends the call with a reason instead of hanging the run.  The child's reasons are cut
before they cross the pipe (a 300 MB exception message is not sent whole)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.tasks.base import RewardError
from tests.support import bounded

np = pytest.importorskip("numpy")

REWARDS = """
import os, struct, sys, time
import numpy as np

def examples():
    return [{"prompt": f"{i}=", "answer": str(i)} for i in range(4)]

def np_bool(prompt, completion, answer):
    return np.bool_(completion == answer)

def np_float32(prompt, completion, answer):
    return np.float32(0.25)

def np_int64(prompt, completion, answer):
    return np.int64(3)

def _reply_pipe():
    # The reward process's loop called this reward: its reply connection is a local there.
    return sys._getframe(2).f_locals["send"].fileno()

def half_a_frame(prompt, completion, answer):
    os.write(_reply_pipe(), struct.pack("!i", 100) + b"ab")
    time.sleep(10**6)

def announces_2_gib(prompt, completion, answer):
    os.write(_reply_pipe(), struct.pack("!i", 2**31 - 1))
    time.sleep(10**6)

def announces_2_gib_long(prompt, completion, answer):
    os.write(_reply_pipe(), struct.pack("!i", -1) + struct.pack("!Q", 2**40))
    time.sleep(10**6)

def garbage(prompt, completion, answer):
    os.write(_reply_pipe(), struct.pack("!i", 8) + b"\\x00" * 8)
    time.sleep(10**6)

class _Runs:
    def __reduce__(self):
        return (exec, ("import os; os.environ['HARNESS_REPLY_RAN'] = '1'",))

def runs_code(prompt, completion, answer):
    import pickle
    frame = pickle.dumps(("ok", _Runs()))
    os.write(_reply_pipe(), struct.pack("!i", len(frame)) + frame)
    time.sleep(10**6)

def huge_message(prompt, completion, answer):
    raise ValueError("x" * (50 * 1024 * 1024))
"""


@pytest.fixture
def rewards(tmp_path: Path) -> Path:
    module = tmp_path / "rewards.py"
    module.write_text(REWARDS)
    return module


def within(seconds: float) -> Any:
    """Fail rather than hang when the block runs past ``seconds`` (a timer interrupts the
    parent's blocking read of a reply)."""
    return bounded.within(seconds, "still waiting for the reward")


def _score(module: Path, func: str, completion: str, **options: Any) -> float:
    from harness.tasks import get_task

    task = get_task(f"python:{module}:{func}", **options)
    try:
        example = next(e for e in task.train if e.answer == "1")
        return task.score(example, completion)
    finally:
        task.close()


def test_numpy_bools_and_numbers_are_rewards():
    from harness.tasks.reward_child import reward_value

    assert reward_value(np.True_) == 1.0 and reward_value(np.False_) == 0.0
    assert reward_value(np.bool_(True)) == 1.0
    assert reward_value(np.float32(0.25)) == 0.25 and reward_value(np.float16(-2)) == -2.0
    assert reward_value(np.int64(3)) == 3.0 and reward_value(np.uint8(7)) == 7.0
    assert reward_value(np.float64("nan")) == "returned nan, not a finite number"
    for refused in (np.array([1.0]), np.complex64(1), np.str_("1")):
        assert "not a number" in str(reward_value(refused)), refused


@pytest.mark.parametrize(
    "func,completion,expect",
    [("np_bool", "1", 1.0), ("np_bool", "2", 0.0), ("np_float32", "", 0.25), ("np_int64", "", 3.0)],
)
def test_a_reward_returning_numpy_values_scores_through_its_process(
    func, completion, expect, rewards
):
    with within(120):
        assert _score(rewards, func, completion) == expect


def test_half_a_reply_then_silence_is_bounded_by_the_timeout(rewards):
    start = time.monotonic()
    with within(120), pytest.raises(RewardError) as err:
        _score(rewards, "half_a_frame", "1", reward_timeout_s=0.5)
    assert "did not return within task_options.reward_timeout_s = 0.5 s" in str(err.value)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize(
    "func,expect",
    [
        ("announces_2_gib", "sent a reply of 2,147,483,647 bytes (a reply is at most 65,536)"),
        (
            "announces_2_gib_long",
            "sent a reply of 1,099,511,627,776 bytes (a reply is at most 65,536)",
        ),
        ("garbage", "the reward process sent something other than a reply"),
        ("runs_code", "the reward process sent something other than a reply"),
    ],
)
def test_a_reply_too_long_or_not_a_reply_is_a_reason_at_once(func, expect, rewards, monkeypatch):
    """Refused when its header (or its bytes) arrive, not at the timeout (600 s here); a reply
    that names a function to call is not unpickled into a call in the run's process."""
    monkeypatch.delenv("HARNESS_REPLY_RAN", raising=False)
    with within(120), pytest.raises(RewardError) as err:
        _score(rewards, func, "1", reward_timeout_s=600)
    assert expect in str(err.value) and "\n" not in str(err.value), err.value
    assert "HARNESS_REPLY_RAN" not in os.environ


def test_an_exception_message_is_cut_before_it_crosses_the_pipe(rewards, monkeypatch):
    from harness.tasks import reward_process
    from harness.tasks.reward_child import REASON_CHARS, describe_exit

    reason = describe_exit(ValueError("x" * 1_000_000 + "\nsecond line"))
    assert reason == f"raised ValueError: {'x' * REASON_CHARS}..."
    assert describe_exit(SystemExit("y" * 1_000_000)).startswith("called sys.exit('yyy")
    assert len(describe_exit(SystemExit("y" * 1_000_000))) < REASON_CHARS + 30
    assert describe_exit(ValueError("short\nsecond")) == "raised ValueError: short"

    frames: list[int] = []
    real = reward_process._read_frame

    def counted(fd: int, deadline: float) -> bytes:
        frame = real(fd, deadline)
        frames.append(len(frame))
        return frame

    monkeypatch.setattr(reward_process, "_read_frame", counted)
    with within(120), pytest.raises(RewardError) as err:
        _score(rewards, "huge_message", "1", reward_timeout_s=60)
    assert "huge_message(prompt='1=', completion='1') raised ValueError: xxx" in str(err.value)
    assert len(str(err.value)) <= 500 and max(frames) < 2 * REASON_CHARS, frames
