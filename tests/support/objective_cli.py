"""The short CLI training run each objective's tests end with: one objective, two steps."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from harness.cli import app
from tests.support.tiny import TINY_SETS

SMALL = [
    "steps=2",
    "task=reverse",
    *TINY_SETS,
    "warm_start.steps=0",
    "rollout.prompts_per_step=4",
    "rollout.n_samples=2",
    "rollout.max_new_tokens=4",
    "ppo.ppo_n_minibatches=2",
    "eval.every=0",
    "eval.n_prompts=4",
    "threads=1",
]


def assert_trains_through_the_cli(tmp_path: Path, *objective: str) -> None:
    """``harness run`` with the ``objective`` settings on a tiny model exits 0 and completes."""
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in [*objective, *SMALL]:
        args += ["--set", s]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "completed" in r.output.lower()
