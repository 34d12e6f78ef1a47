"""The split CLI: `harness --help` loads only the thin command modules (never their bodies in
``harness.cli.commands``), and a search's best point is chosen once (``top_of_front``) for
`export --best`, the end of a search and its report."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from harness.sweep.scheduler.study import top_of_front


def test_importing_the_cli_loads_no_heavy_library() -> None:
    code = (
        "import sys, harness.cli; "
        "bad = {'torch', 'transformers', 'optuna', 'mlflow', 'numpy', 'rich'} & set(sys.modules); "
        "assert not bad, bad; "
        "print(sorted(m for m in sys.modules if m.startswith('harness.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    ).stdout
    loaded = set(ast.literal_eval(out))  # the printed list of module names
    # The thin modules Typer reads, and the light core modules they import (errors, umask, the
    # allocator, redaction, the exit past leftover threads); no command's body
    # (harness.cli.commands) until the command runs.
    assert loaded == {
        "harness.cli",
        "harness.cli.export",
        "harness.cli.options",
        "harness.cli.report",
        "harness.cli.run",
        "harness.cli.sweep",
        "harness.cli.ui",
        "harness.core",
        "harness.core.configtools",
        "harness.core.fields",
        "harness.core.db",
        "harness.core.exiting",
        "harness.core.fsutil",
        "harness.core.perf",
        "harness.core.redact",
    }


def _trial(number: int, *values: float) -> SimpleNamespace:
    return SimpleNamespace(number=number, values=list(values))


def test_the_top_of_a_pareto_front_is_the_best_by_the_first_objective() -> None:
    front = [_trial(3, 0.2, 9.0), _trial(7, 0.8, 1.0), _trial(5, 0.5, 4.0)]
    maximize = SimpleNamespace(direction="maximize")
    minimize = SimpleNamespace(direction="minimize")
    assert top_of_front(front, maximize).number == 7  # type: ignore[arg-type]
    assert top_of_front(front, minimize).number == 3  # type: ignore[arg-type]
    assert top_of_front([_trial(1, 0.4)], maximize).number == 1  # type: ignore[arg-type]
