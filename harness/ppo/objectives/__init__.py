"""The policy objectives (``ppo.policy_loss``): one module per objective, registered on import.

Every module of this package is imported here, so a new objective is one new file that calls
``registry.register`` (plus its tests); nothing else names it.  ``registry.py`` says what a
declaration holds and what is derived from it; ``frame.py`` is the loss every objective runs in,
``loss_options.py`` what it reads besides the tensors.
"""

from __future__ import annotations

from harness.core.plugins import import_members
from harness.ppo.objectives.frame import Terms, objective_loss
from harness.ppo.objectives.loss_options import LOSS_AGG_MODES, ClipOptions, LossOptions
from harness.ppo.objectives.registry import (
    OBJECTIVES,
    Objective,
    Options,
    Peer,
    lookup,
    register,
    renamed_keys,
    validate_selection,
)

import_members(
    __name__, __path__, skip={"registry", "frame", "loss_options", "docs", "covariance", "__main__"}
)

from harness.ppo.objectives.cispo import cispo_loss  # noqa: E402
from harness.ppo.objectives.clip_cov import clip_cov_loss  # noqa: E402
from harness.ppo.objectives.gmpo import gmpo_loss  # noqa: E402
from harness.ppo.objectives.kl_cov import kl_cov_loss  # noqa: E402
from harness.ppo.objectives.ppo import ppo_actor_loss, ppo_clip_terms  # noqa: E402
from harness.ppo.objectives.sapo import sapo_loss  # noqa: E402

# The objectives registered at import (a snapshot; ``OBJECTIVES`` is the live registry).
POLICY_LOSSES = tuple(OBJECTIVES)

__all__ = [
    "LOSS_AGG_MODES",
    "OBJECTIVES",
    "POLICY_LOSSES",
    "ClipOptions",
    "LossOptions",
    "Objective",
    "Options",
    "Peer",
    "Terms",
    "cispo_loss",
    "clip_cov_loss",
    "gmpo_loss",
    "kl_cov_loss",
    "lookup",
    "objective_loss",
    "ppo_actor_loss",
    "ppo_clip_terms",
    "register",
    "renamed_keys",
    "sapo_loss",
    "validate_selection",
]
