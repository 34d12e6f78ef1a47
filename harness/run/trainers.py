"""Trainers: "train this RunConfig, call on_metrics(step, dict) in the one vocabulary
(``harness/metrics/__init__.py``), honour should_stop, return a RunResult".

    harness   the harness's own PPO loop (``harness.run.loop.run``)
    trl       TRL's GRPOTrainer (``harness.run.trl_trainer.run_trl``), options mapped by
              ``harness.peers.trl``

Both are the run scaffold (``harness/run/scaffold.py``) around their own steps, so both take the
same hooks and keep the same contract (tests/run/test_trainer_contract.py).  ``RunConfig.trainer``
picks one; ``train`` checks the config against it and dispatches.  Sweeps, the tracker and the
report never know which trainer ran a cell.

What a trainer cannot express is refused when a config is built: loading this module loads each
trainer's check (``harness.peers.trl`` registers TRL's with ``harness.config.trainer_checks``), so
the commands that read configs import it before they read one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Unpack, get_args

import harness.peers.trl  # noqa: F401 - registers what trainer: trl cannot express
from harness.config.schema import TrainerName
from harness.config.trainer_checks import check_trainer

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.run.scaffold import Hooks, RunResult

TRAINERS: tuple[str, ...] = get_args(TrainerName)


class Trainer(Protocol):
    def __call__(self, cfg: RunConfig, **hooks: Unpack[Hooks]) -> RunResult: ...


def get_trainer(name: str) -> Trainer:
    if name == "harness":
        from harness.run.loop import run  # noqa: PLC0415 - factory: a trainer's module loads when it is chosen

        return run
    if name == "trl":
        from harness.run.trl_trainer import run_trl  # noqa: PLC0415 - factory: a trainer's module loads when it is chosen

        return run_trl
    raise ValueError(f"trainer must be one of {', '.join(TRAINERS)}; got {name!r}")


def train(cfg: RunConfig, **hooks: Unpack[Hooks]) -> RunResult:
    """Run ``cfg`` with the trainer it names (refused first, in one line, where that trainer cannot
    express it: a config built before the checks were loaded is checked here)."""
    check_trainer(cfg)
    return get_trainer(cfg.trainer)(cfg, **hooks)
