"""``harness export``: one cell's settings in another framework's own names and format.

    trl     a Python snippet: ``args = GRPOConfig(...)`` (TRL 1.16; ``harness/peers/trl/``)
            and, with LoRA, ``peft_config = LoraConfig(...)`` for ``GRPOTrainer``
    verl    Hydra overrides (``actor_rollout_ref.actor.clip_ratio_low=...``, one per line,
            shell-quoted where the shell would otherwise read them)
    areal   YAML under AReaL's keys (``actor.eps_clip``, ``actor.adv_norm.mean_level``, ...)
    prime-rl  TOML for prime-rl's ``rl`` entry point (``max_async_level``, ``[orchestrator]``,
            ``[trainer.optim]``); its loss is its own and not mapped

``rollout.async`` and ``rollout.staleness`` reach each target through
:mod:`harness.peers.export.asynchrony` (AReaL ``max_head_offpolicyness``, prime-rl
``max_async_level`` / ``strict_async_level``, TRL ``AsyncGRPOConfig.max_staleness``, verl's
fully-async ``async_training.*``).

An option the target lacks is a ``#`` comment line naming it and why — never dropped silently.
Only settings of the algorithm, its budget and how the model is trained (precision, gradient
checkpointing, LoRA) are exported; not paths, devices (beyond what TRL must be told) or trackers.

Everything user-controlled that reaches the text (file names, cell labels, LoRA module names) is
escaped for the target: comments are one line whatever they quote (:func:`comment`), TRL values
are Python literals (``repr``), AReaL values go through ``yaml.safe_dump``, and verl strings are
refused unless they are plain module names (Hydra would interpolate ``${...}`` inside quotes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.peers.export.areal import export_areal
from harness.peers.export.common import comment, one_line
from harness.peers.export.primerl import export_primerl
from harness.peers.export.trl import export_trl
from harness.peers.export.verl import VERL_VERSION, export_verl

if TYPE_CHECKING:
    from harness.config import RunConfig

#: Each target's exporter, in the order ``--to`` lists them.
EXPORTERS: dict[str, Callable[[RunConfig], str]] = {
    "trl": export_trl,
    "verl": export_verl,
    "areal": export_areal,
    "prime-rl": export_primerl,
}
TARGETS = tuple(EXPORTERS)

__all__ = [
    "EXPORTERS",
    "TARGETS",
    "VERL_VERSION",
    "comment",
    "export_areal",
    "export_primerl",
    "export_trl",
    "export_verl",
    "one_line",
]
