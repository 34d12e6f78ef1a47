"""``harness run`` invoked in the test's own process (typer's ``CliRunner``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from harness.cli import app
from tests.support.tiny import set_flags


def invoke_run(results: Path, *sets: str, **invoke: Any) -> Result:
    """``harness run --set S1 --set S2 ... --results-dir RESULTS``; ``invoke`` goes to
    ``CliRunner.invoke`` (``env``, ``catch_exceptions``)."""
    args = ["run", *set_flags(*sets), "--results-dir", str(results)]
    return CliRunner().invoke(app, args, **invoke)
