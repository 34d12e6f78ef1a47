"""Trainers: "train this RunConfig, call on_metrics(step, dict) in the one vocabulary
(``harness/metrics/__init__.py``), honour should_stop, return a RunResult".

    harness   the harness's own PPO loop (``harness.run.loop.run``)
    trl       TRL's GRPOTrainer (``harness.run.trl_trainer.run_trl``), options mapped by
              ``harness.config.trl_map``

``RunConfig.trainer`` picks one; ``train`` dispatches.  Sweeps, the tracker and the report never
know which trainer ran a cell.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.run.loop import RunResult

TRAINERS = ("harness", "trl")


class Trainer(Protocol):
    def __call__(
        self,
        cfg: RunConfig,
        *,
        on_metrics: Callable[[int, dict[str, float]], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        results_dir: Path | str = "results",
    ) -> RunResult: ...


def get_trainer(name: str) -> Trainer:
    if name == "harness":
        from harness.run.loop import run

        return run
    if name == "trl":
        from harness.run.trl_trainer import run_trl

        return run_trl
    raise ValueError(f"trainer must be one of {', '.join(TRAINERS)}; got {name!r}")


def train(
    cfg: RunConfig,
    *,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    results_dir: Path | str = "results",
) -> RunResult:
    """Run ``cfg`` with the trainer it names."""
    return get_trainer(cfg.trainer)(
        cfg, on_metrics=on_metrics, should_stop=should_stop, results_dir=results_dir
    )
