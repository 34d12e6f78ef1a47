"""The docs' examples as a user runs them: a page's fenced code blocks, the ``harness`` commands
in a shell block, and those commands run through the CLI on the tiny model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from harness.cli import app
from tests.support.tiny import set_flags

DOCS = Path(__file__).resolve().parents[2] / "docs"


def doc_block(start: str, pages: tuple[str, ...] = ("tasks.md",)) -> str:
    """The fenced code block of the ``docs/`` ``pages`` whose first line is ``start``."""
    text = "".join((DOCS / page).read_text() for page in pages)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        if block.startswith(start):
            return block
    names = ", ".join(f"docs/{page}" for page in pages)
    raise AssertionError(f"{names}: no code block starting with {start!r}")


def harness_run_commands(block: str) -> list[list[str]]:
    """The ``harness run ...`` lines of a shell block, each as argv without ``harness``."""
    return [ln.split()[1:] for ln in block.splitlines() if ln.startswith("harness run")]


def assert_commands_train(
    commands: list[list[str]], sets: list[str], tracker: Any, *, steps: int = 2
) -> list[Any]:
    """Each command, with ``--set`` ``sets`` after its own flags (a later value wins: a short
    run), exits 0 through the CLI and ends a FINISHED run of ``steps`` rewards in [0, 1] in
    ``tracker``; returns those runs in order."""
    for argv in commands:
        r = CliRunner().invoke(app, [*argv, *set_flags(*sets)])
        assert r.exit_code == 0, (argv, r.output)
    runs = list(tracker.runs.values())
    assert len(runs) == len(commands), [run.params.get("task") for run in runs]
    for run in runs:
        assert run.status == "FINISHED"
        rewards = [v for _, v in run.metrics["objective/reward"]]
        assert len(rewards) == steps and all(0.0 <= v <= 1.0 for v in rewards)
    return runs
