"""Fixtures shared by the task-source tests: a CLI runner, the settings of a tiny two-step run,
an in-memory tracker in place of MLflow, and the assertion that a command failed with one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from harness import tracking
from harness.tracking import MemoryTracker

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def tiny_run() -> list[str]:
    """``--set`` values (without the flag) of a two-step run of the tiny model: a later value of
    the same key wins, so a test adds what it needs after these."""
    return [
        "steps=2",
        "rollout.prompts_per_step=2",
        "rollout.n_samples=2",
        "rollout.max_new_tokens=4",
        "eval.every=0",
        "eval.n_prompts=2",
        "threads=1",
        *(f"tiny.{k}={v}" for k, v in TINY.items()),
    ]


@pytest.fixture
def memory_tracker(monkeypatch: pytest.MonkeyPatch) -> MemoryTracker:
    """The tracker every run of the test logs to (instead of an MLflow store)."""
    tracker = MemoryTracker()
    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: tracker)
    return tracker


def _assert_one_line_error(result: Any, expect: str) -> None:
    err = result.stderr if result.stderr is not None else result.output
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], lines[0]


@pytest.fixture
def assert_one_line_error() -> Callable[[Any, str], None]:
    """``assert_one_line_error(result, expect)``: the CLI exited 2 with one ``error:`` line on
    stderr holding ``expect``, and no traceback."""
    return _assert_one_line_error
