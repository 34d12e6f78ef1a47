"""The PPO actor's options: AReaL's ``PPOActorConfig`` field names, each with help and bounds.

Declared beside the math it configures, so ``PPOActor`` and the pure functions never import the
run configuration; ``harness.config.RunConfig`` nests it as ``ppo``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from harness.core.configtools import meta
from harness.ppo.loss import RejectionSampling, validate_clip_options
from harness.ppo.normalization import NormConfig
from harness.ppo.objectives import OBJECTIVE_OPTIONS, validate_objective

_h = meta


@dataclass
class PPOActorConfig:
    """PPO actor options, under AReaL's ``PPOActorConfig`` names."""

    eps_clip: float = field(
        default=0.2, metadata=_h("Lower clip ε: ratio clipped to [1-ε, 1+ε_hi].", gt=0)
    )
    eps_clip_higher: float | None = field(
        default=None, metadata=_h("Upper clip ε_hi (DAPO clip-higher); null = eps_clip.", ge=0)
    )
    c_clip: float | None = field(
        default=None,
        metadata=_h("Dual clip: caps the loss at c·|A| where A < 0; must be > 1.", gt=1),
    )
    behave_imp_weight_mode: Literal[
        "disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate"
    ] = field(
        default="disabled",
        metadata=_h(
            "Behaviour importance weight π_prox/π_behave (AReaL v1.0.0.post1-v1.0.3 modes)."
        ),
    )
    behave_imp_weight_cap: float | None = field(
        default=None, metadata=_h("Cap for the behaviour weight (> 1); null = no bound.", gt=1)
    )
    rejection_sampling: RejectionSampling | None = field(
        default=None,
        metadata=_h(
            "AReaL v1.0.4+ behaviour weighting {level, action, metric, agg, upper, lower}."
        ),
    )
    use_decoupled_loss: bool = field(
        default=False,
        metadata=_h(
            "Decoupled PPO: clip against π_prox recomputed before the update, not π_behave."
        ),
    )
    recompute_logprob: bool = field(
        default=False, metadata=_h("Recompute the old log-probs with the training forward pass.")
    )
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="token", metadata=_h("'sequence' = GSPO (geometric-mean sequence ratio).")
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = field(default="token-mean", metadata=_h("How per-token losses become one number."))
    policy_loss: Literal["ppo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"] = field(
        default="ppo",
        metadata=_h(
            "Policy objective: ppo (PPO-clip, clip-higher, dual clip, GSPO), cispo (MiniMax-M1), "
            "sapo (soft gate), gmpo (geometric mean), clip_cov / kl_cov (arXiv 2505.22617)."
        ),
    )
    cispo_ratio_max: float = field(
        default=5.0,
        metadata=_h(
            "CISPO: absolute cap on the IS weight sg(r) (TRL's epsilon_high under loss_type "
            "'cispo'; 5.0 as TRL recommends after ScaleRL, arXiv 2510.13786).",
            gt=1,
        ),
    )
    cispo_ratio_min: float | None = field(
        default=None,
        metadata=_h(
            "CISPO: floor on the IS weight (MiniMax-M1's 1 - eps_low^IS); null = none, as in TRL.",
            ge=0,
            lt=1,
        ),
    )
    sapo_temperature_pos: float = field(
        default=1.0,
        metadata=_h(
            "SAPO: gate temperature where A > 0 (TRL default 1.0, arXiv 2511.20347).", gt=0
        ),
    )
    sapo_temperature_neg: float = field(
        default=1.05,
        metadata=_h(
            "SAPO: gate temperature where A <= 0 (TRL default 1.05, arXiv 2511.20347).", gt=0
        ),
    )
    gmpo_log_clip: float = field(
        default=0.4,
        metadata=_h(
            "GMPO: token log-ratio clipped to [-eps, eps_hi] (arXiv 2507.20673 uses 0.4; verl "
            "reuses clip_ratio).",
            gt=0,
        ),
    )
    gmpo_log_clip_higher: float | None = field(
        default=None, metadata=_h("GMPO: upper log-space bound eps_hi; null = gmpo_log_clip.", gt=0)
    )
    clip_cov_ratio: float = field(
        default=2e-4,
        metadata=_h(
            "Clip-Cov: share of valid tokens whose gradient is detached (paper/verl 2e-4; "
            "0 = plain PPO-clip).",
            ge=0,
            le=1,
        ),
    )
    clip_cov_lb: float = field(
        default=1.0, metadata=_h("Clip-Cov: candidates have covariance > this (verl default 1).")
    )
    clip_cov_ub: float = field(
        default=5.0, metadata=_h("Clip-Cov: candidates have covariance < this (verl default 5).")
    )
    kl_cov_ratio: float = field(
        default=2e-4,
        metadata=_h(
            "KL-Cov: share of valid tokens, largest covariance first, given the KL penalty "
            "(paper/verl 2e-4; 0 = unclipped policy gradient).",
            ge=0,
            le=1,
        ),
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata=_h("KL-Cov: coefficient of the |log-ratio| penalty (verl ppo_kl_coef, 1).", ge=0),
    )
    ppo_n_minibatches: int = field(
        default=4,
        metadata=_h("Optimizer steps per PPO update (token-balanced split).", ge=1, le=10_000),
    )
    ppo_epochs: int = field(
        default=1, metadata=_h("Passes over the batch per update.", ge=1, le=10_000)
    )
    adv_norm: NormConfig | None = field(
        default=None, metadata=_h("Normalization of token advantages (masked); null = none.")
    )
    reward_norm: NormConfig | None = field(
        default=None,
        metadata=_h("Normalization of sequence rewards; groups = the samples of one prompt."),
    )
    kl_ctl: float = field(
        default=0.0,
        metadata=_h(
            "KL-in-reward coefficient against a frozen reference copy (0 = no reference).", ge=0
        ),
    )
    kl_estimator: Literal["k1", "k2", "k3"] = field(default="k1", metadata=_h("KL estimator."))
    discount: float = field(default=1.0, metadata=_h("GAE γ.", ge=0, le=1))
    gae_lambda: float = field(default=1.0, metadata=_h("GAE λ.", ge=0, le=1))
    reward_scaling: float = field(default=1.0, metadata=_h("R ← (R + bias)·scaling."))
    reward_bias: float = field(default=0.0, metadata=_h("Added to R before scaling."))
    reward_clip: float = field(
        default=20.0, metadata=_h("R clipped to ±reward_clip.", gt=0, inf="no clipping")
    )
    entropy_coef: float = field(default=0.0, metadata=_h("Entropy bonus coefficient."))
    temperature: float = field(
        default=1.0, metadata=_h("Sampling temperature; training log-probs use the same.", gt=0)
    )

    def __post_init__(self) -> None:
        validate_clip_options(
            self.eps_clip,
            self.eps_clip_higher,
            self.c_clip,
            self.behave_imp_weight_mode,
            self.behave_imp_weight_cap,
            self.rejection_sampling,
            self.importance_sampling_level,
            self.loss_agg_mode,
        )
        validate_objective(
            self.policy_loss,
            self.importance_sampling_level,
            **{name: getattr(self, name) for name in OBJECTIVE_OPTIONS},
        )
        weighting = self.behave_imp_weight_mode != "disabled" or self.rejection_sampling is not None
        if weighting and not self.use_decoupled_loss:
            warnings.warn(
                "behaviour importance weights only have an effect with use_decoupled_loss=true "
                "(otherwise π_prox = π_behave and the weight is 1)",
                UserWarning,
                stacklevel=2,
            )


# AReaL users type PPOConfig for these knobs; AReaL's own PPOConfig is the whole experiment.
PPOConfig = PPOActorConfig
