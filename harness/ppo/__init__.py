"""PPO math core: pure functions of tensors plus explicit options (AReaL semantics).

Nothing here imports MLflow, Optuna or transformers.
"""

from harness.ppo.actor import PPOActor
from harness.ppo.advantages import gae, kl_estimate, shape_rewards
from harness.ppo.config import PPOActorConfig, PPOConfig
from harness.ppo.corrections import BEHAVE_MODES, RejectionSampling, behaviour_weights
from harness.ppo.normalization import NormConfig, normalize
from harness.ppo.objectives import (
    LOSS_AGG_MODES,
    OBJECTIVES,
    POLICY_LOSSES,
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    ppo_actor_loss,
    sapo_loss,
)

__all__ = [
    "BEHAVE_MODES",
    "LOSS_AGG_MODES",
    "NormConfig",
    "OBJECTIVES",
    "POLICY_LOSSES",
    "PPOActor",
    "PPOActorConfig",
    "PPOConfig",
    "RejectionSampling",
    "behaviour_weights",
    "cispo_loss",
    "clip_cov_loss",
    "gmpo_loss",
    "kl_cov_loss",
    "sapo_loss",
    "gae",
    "kl_estimate",
    "normalize",
    "ppo_actor_loss",
    "shape_rewards",
]
