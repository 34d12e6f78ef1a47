"""What the trainer a config names cannot express, refused when the config is built.

``trainer: trl`` hands a run to TRL's GRPOTrainer, which cannot express every option.  What it
cannot is known to the layer that maps the harness onto TRL (``harness.peers.trl``), which sits
above this one, so that layer registers its check here (:func:`register_trainer_check`) and the
config layer names no peer.  ``build_run_config`` then refuses an inexpressible config in one
line, with the blame of ``--set`` flags and grid values, before anything runs.

Where the trainers are chosen (``harness.run.trainers``) loads every trainer's check; the
commands that read configs load it first, and ``train`` checks again before a run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from harness.config.schema import RunConfig, TrainerName
from harness.core.configtools import ConfigError

# (dotted field, why the trainer cannot express its value); [] = the trainer can run the config.
Problems = list[tuple[str, str]]
TrainerCheck = Callable[[RunConfig], Problems]

_CHECKS: dict[str, TrainerCheck] = {}


def register_trainer_check(trainer: str, check: TrainerCheck) -> None:
    """Refuse, from now on, every config naming ``trainer`` for which ``check`` lists problems."""
    if trainer not in get_args(TrainerName):
        raise ValueError(f"no trainer {trainer!r} (trainers: {', '.join(get_args(TrainerName))})")
    _CHECKS[trainer] = check


def refusal(trainer: str, problems: Problems) -> str:
    """The one line that refuses ``problems``: every one at once, so that a user fixes them in
    one go, not one run at a time; the first field leads (a ``--set`` error names the flag of
    that field)."""
    where, why = problems[0]
    more = "".join(f"; also {w}: {y}" for w, y in problems[1:])
    return f"{where}: not expressible with trainer: {trainer} ({why}){more}"


def check_trainer(cfg: RunConfig) -> None:
    """Raise ``ConfigError`` (one line) when the trainer ``cfg`` names cannot express it."""
    check = _CHECKS.get(cfg.trainer)
    problems = check(cfg) if check is not None else []
    if problems:
        raise ConfigError(refusal(cfg.trainer, problems))
