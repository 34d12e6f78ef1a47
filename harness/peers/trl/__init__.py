"""How a harness ``RunConfig`` becomes TRL 1.16 ``GRPOConfig`` arguments — the mapping as data.

``TRL_MAPPING`` (:mod:`.mapping`) is the table of ``docs/trl.md`` (``python -m harness.peers.trl``
writes it): one row per harness option with the ``GRPOConfig`` field it becomes and how faithful
that is:

    exact      same math (up to float rounding)
    approx     same intent, a documented difference (named in the run's ``trl.approximations`` tag)
    must       only some values are expressible; any other value is a one-line error
    none       TRL cannot express the option; any non-default value is a one-line error

``trl_problems(cfg)`` (:mod:`.problems`) lists every (field, reason) TRL cannot express;
``grpo_kwargs(cfg)`` (:mod:`.kwargs`) returns the algorithm's ``GRPOConfig`` keyword arguments
(the trainer adds the runtime ones: output dir, device, logging).  The package never imports TRL.
Importing it registers ``trl_problems`` with the config layer
(``harness.config.trainer_checks``), so every config naming ``trainer: trl`` built from then on
is refused, in one line, where TRL cannot express it.
Source read: ``trl/trainer/grpo_trainer.py`` (``_compute_loss``, ``_generate_and_score_completions``)
and ``grpo_config.py`` at TRL 1.16.0.
"""

from __future__ import annotations

from harness.config.trainer_checks import register_trainer_check
from harness.peers.trl.kwargs import grpo_kwargs
from harness.peers.trl.mapping import TRL_MAPPING, TRL_VERSION, MapRow, markdown
from harness.peers.trl.problems import TRL_STD_EPS, VLLM_ONLY, approximations, trl_problems

register_trainer_check("trl", trl_problems)

__all__ = [
    "TRL_MAPPING",
    "TRL_STD_EPS",
    "TRL_VERSION",
    "VLLM_ONLY",
    "MapRow",
    "approximations",
    "grpo_kwargs",
    "markdown",
    "trl_problems",
]
