"""Fixtures the sweep's UI tests share: one smoke sweep per module, and `harness ui --start`
serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.ui_servers import Served, start_ui, stop_ui


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """The smoke grid (2 cells x 2 seeds), swept once for this module."""
    results = tmp_path_factory.mktemp("ui") / "results"
    r = CliRunner().invoke(
        app,
        ["ablate", "experiments/smoke.yaml", "--workers", "2", "--results-dir", str(results)],
    )
    assert r.exit_code == 0, r.output
    return results


@pytest.fixture(scope="module")
def served(swept: Path) -> Iterator[Served]:
    s = start_ui(swept)
    try:
        yield s
    finally:
        stop_ui(s)
