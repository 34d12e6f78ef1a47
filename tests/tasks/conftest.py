"""Fixtures shared by the task-source tests: a CLI runner and the assertion that a command failed
with one line (the tiny two-step run and the in-memory tracker are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


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
