"""The PPO actor's options: AReaL's ``PPOActorConfig`` field names, each with help and bounds.

Declared beside the math it configures, so ``PPOActor`` and the pure functions never import the
run configuration; ``harness.config.RunConfig`` nests it as ``ppo``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from harness.core.configtools import checked
from harness.core.fields import option
from harness.ppo.advantages import KLKind
from harness.ppo.corrections import (
    PRESETS,
    Correction,
    RejectionSampling,
    behaviour_correction,
    resolve,
)
from harness.ppo.corrections.areal import BEHAVE_CAP, BehaveMode
from harness.ppo.normalization import NormConfig
from harness.ppo.objectives import (
    OBJECTIVES,
    ClipOptions,
    LossOptions,
    lookup,
    renamed_keys,
    validate_selection,
)
from harness.ppo.objectives.loss_options import ISLevel, LossAggMode, check_behaviour_options
from harness.ppo.objectives.registry import options_of
from harness.ppo.objectives.vespo import FOLD_NEEDS, FOLDABLE
from harness.ppo.proximal import ProxLogpMethod

_CLIP = {f.name: f for f in fields(ClipOptions)}


def _clip_field(name: str) -> Any:
    """A PPO-clip option, with the default and declaration ``ClipOptions`` gives it."""
    f = _CLIP[name]
    return option(f.default, **f.metadata)


def _with_objective_blocks(cls: type) -> type:
    """One nested options block per registered objective, after ``policy_loss``
    (``ppo.cispo.ratio_max``); the declarations are the objectives' own."""
    annotations = dict(cls.__annotations__)
    cls.__annotations__.clear()
    for name, tp in annotations.items():
        cls.__annotations__[name] = tp
        if name == "policy_loss":
            for o in OBJECTIVES.values():
                if o.options is None:
                    continue
                cls.__annotations__[o.name] = o.options
                block = option(
                    help=f"Options of policy_loss {o.name!r} (left at defaults otherwise).",
                    factory=o.options,
                )
                setattr(cls, o.name, block)
    # Retired flat keys (ppo.cispo_ratio_max): configtools.from_dict names the new key.
    cls.RENAMED_KEYS = renamed_keys()  # type: ignore[attr-defined]
    return cls


@dataclass
@checked()
@_with_objective_blocks
class PPOActorConfig:
    """PPO actor options, under AReaL's ``PPOActorConfig`` names."""

    eps_clip: float = _clip_field("eps_clip")
    eps_clip_higher: float | None = _clip_field("eps_clip_higher")
    c_clip: float | None = _clip_field("c_clip")
    behave_imp_weight_mode: BehaveMode = option(
        "disabled", "Behaviour importance weight π_prox/π_behave (AReaL v1.0.0.post1-v1.0.3 modes)."
    )
    behave_imp_weight_cap: float | None = option(None, **BEHAVE_CAP)
    rejection_sampling: RejectionSampling | None = option(
        None, "AReaL v1.0.4+ behaviour weighting {level, action, metric, agg, upper, lower}."
    )
    correction: Correction | str | None = option(
        None,
        "Training-inference mismatch correction: a block {weight, clip_min, clip_max, "
        "zero_outside, log_clamp, batch_normalize, filters, sequential, denominator, bypass} "
        "or a preset name (" + ", ".join(PRESETS) + "), or a block {preset: NAME, ...} "
        "whose keys override the preset's (so does --set ppo.correction.KEY after a preset "
        "name); without use_decoupled_loss it recomputes π_prox itself (TRL); "
        "docs/corrections.md.",
    )
    use_decoupled_loss: bool = option(
        False, "Decoupled PPO: clip against π_prox recomputed before the update, not π_behave."
    )
    prox_logp_method: ProxLogpMethod = option(
        "recompute",
        "How the decoupled loss gets π_prox (AReaL's actor.prox_logp_method): 'recompute' = "
        "a no-grad forward at the weights the update starts from; 'loglinear' = no forward, "
        "ℓp = ℓb + α·(sg(ℓθ) − ℓb) with α = (k−1)/k for a batch sampled k updates ago "
        "(needs use_decoupled_loss and a rollout staleness of 2 or more); "
        "docs/ppo-semantics.md.",
    )
    recompute_logprob: bool = option(
        False, "Recompute the old log-probs with the training forward pass."
    )
    importance_sampling_level: ISLevel = option(
        "token", "'sequence' = GSPO (geometric-mean sequence ratio)."
    )
    loss_agg_mode: LossAggMode = option(
        "token-mean",
        "How per-token losses become one number (prompt-mean = SkyRL's: mean over each "
        "prompt's tokens, then over the minibatch's prompts).",
    )
    top_entropy_quantile: float = option(
        1.0,
        "TRL's top_entropy_quantile ρ: the policy loss keeps only the tokens whose entropy "
        "reaches the (1−ρ) quantile of the minibatch's valid tokens (0.2 = the 80/20 rule; "
        "1 = off); denominators still count every valid token.",
        ge=0,
        le=1,
    )
    truncated_completions: Literal["keep", "mask", "zero_reward"] = option(
        "keep",
        "Completions without EOS: keep; mask = drop them from the loss (TRL "
        "mask_truncated_completions; their reward still enters the group statistics); "
        "zero_reward = set their normalized reward to 0, tokens stay in the loss (AReaL "
        "mask_no_eos_with_zero).",
    )
    overlong_reward_penalty: bool = option(
        False,
        "DAPO soft overlong punishment (AReaL's): add min(−(|y|−(L_max−L_c))/L_c·f, 0) to "
        "the reward before shaping (L_max = rollout.max_new_tokens).",
    )
    overlong_tokens: int | None = option(
        None,
        "L_c: the last tokens before max_new_tokens where the penalty ramps (needed with "
        "overlong_reward_penalty).",
        ge=1,
        le=100_000,
    )
    overlong_penalty_factor: float | None = option(
        None, "f: the penalty at max_new_tokens (needed with overlong_reward_penalty).", ge=0
    )
    policy_loss: str = option(
        "ppo",
        "Policy objective (one of the registered objectives; its options are the block "
        "ppo.<name>): " + ", ".join(OBJECTIVES) + ".",
    )
    ppo_n_minibatches: int = option(
        4, "Optimizer steps per PPO update (token-balanced split).", ge=1, le=10_000
    )
    ppo_epochs: int = option(1, "Passes over the batch per update.", ge=1, le=10_000)
    adv_norm: NormConfig | None = option(
        None, "Normalization of token advantages (masked); null = none."
    )
    reward_norm: NormConfig | None = option(
        None, "Normalization of sequence rewards; groups = the samples of one prompt."
    )
    kl_ctl: float = option(
        0.0, "KL-in-reward coefficient against a frozen reference copy (0 = no reference).", ge=0
    )
    kl_estimator: KLKind = option("k1", "KL estimator.")
    discount: float = option(1.0, "GAE γ.", ge=0, le=1)
    gae_lambda: float = option(1.0, "GAE λ.", ge=0, le=1)
    reward_scaling: float = option(1.0, "R ← (R + bias)·scaling.")
    reward_bias: float = option(0.0, "Added to R before scaling.")
    reward_clip: float = option(20.0, "R clipped to ±reward_clip.", gt=0, inf="no clipping")
    entropy_coef: float = option(0.0, "Entropy bonus coefficient.")
    temperature: float = option(1.0, "Sampling temperature; training log-probs use the same.", gt=0)

    def __post_init__(self) -> None:
        check_behaviour_options(
            self.behave_imp_weight_mode, self.behave_imp_weight_cap, self.rejection_sampling
        )
        validate_selection(
            self.policy_loss,
            self.importance_sampling_level,
            self.loss_agg_mode,
            {name: getattr(self, name) for name in _CLIP},
            {o.name: getattr(self, o.name, None) for o in OBJECTIVES.values()},
        )
        check_overlong(
            self.overlong_reward_penalty, self.overlong_tokens, self.overlong_penalty_factor
        )
        self.correction = resolve(self.correction)
        c = self.correction
        if c is not None:
            if self.rejection_sampling is not None or self.behave_imp_weight_mode != "disabled":
                raise ValueError(
                    "give either correction or rejection_sampling / behave_imp_weight_mode, "
                    "not both"
                )
            if c.bypass and (self.use_decoupled_loss or self.recompute_logprob):
                raise ValueError(
                    "correction.bypass needs use_decoupled_loss=false and "
                    "recompute_logprob=false (bypass means no proximal recompute)"
                )
        vespo = getattr(self, "vespo", None)
        if self.policy_loss == "vespo" and vespo is not None and vespo.behaviour_weight == "fold":
            if c is None or c.weight not in FOLDABLE:
                raise ValueError(FOLD_NEEDS + (f" (got {c.weight!r})" if c else " (it is null)"))
        # AReaL's own weightings read π_prox only under its decoupled loss (otherwise π_prox =
        # π_behave and every weight is 1): refused rather than silently inert.  ppo.correction
        # recomputes π_prox itself (recomputes_proximal), as TRL does.
        if not self.use_decoupled_loss:
            if self.rejection_sampling is not None:
                raise ValueError(
                    "rejection_sampling: acts only with use_decoupled_loss=true (without it "
                    "π_prox = π_behave and every weight is 1); set use_decoupled_loss=true or "
                    "use ppo.correction, which recomputes π_prox itself"
                )
            if self.behave_imp_weight_mode != "disabled":
                raise ValueError(
                    f"behave_imp_weight_mode: {self.behave_imp_weight_mode!r} acts only with "
                    "use_decoupled_loss=true (without it π_prox = π_behave and every weight is "
                    "1); set use_decoupled_loss=true, or behave_imp_weight_mode: disabled"
                )

        if self.prox_logp_method == "loglinear":
            # AReaL interpolates π_prox only under its decoupled loss; anything else would leave
            # the option inert, or silently drop a forward pass the user asked for.
            if not self.use_decoupled_loss:
                raise ValueError(
                    "prox_logp_method: 'loglinear' acts only with use_decoupled_loss=true "
                    "(without it there is no π_prox to interpolate); set use_decoupled_loss=true "
                    "or prox_logp_method: recompute"
                )
            if self.recompute_logprob:
                raise ValueError(
                    "prox_logp_method: 'loglinear' skips the forward pass that "
                    "recompute_logprob=true asks for; set recompute_logprob=false or "
                    "prox_logp_method: recompute"
                )

    def loss_options(self) -> LossOptions:
        """What the loss reads, from these options (checked when they were built): AReaL's
        ``rejection_sampling`` or legacy ``behave_imp_weight_mode`` become the one
        ``Correction`` the loss applies; ``ppo.correction`` is taken as it is."""
        spec = lookup(self.policy_loss)
        return LossOptions(
            spec,
            ClipOptions(**{name: getattr(self, name) for name in _CLIP}),
            options_of(self, spec.name),
            self.importance_sampling_level,
            self.loss_agg_mode,
            behaviour_correction(
                self.behave_imp_weight_mode,
                self.behave_imp_weight_cap,
                self.rejection_sampling,
                resolve(self.correction),
            ),
        )

    @property
    def interpolates_proximal(self) -> bool:
        """π_prox interpolated from ℓb and the live ℓθ (AReaL ``loglinear``): no forward pass."""
        return self.use_decoupled_loss and self.prox_logp_method == "loglinear"

    @property
    def recomputes_proximal(self) -> bool:
        """π_prox is the learner recomputed at the old parameters, π_behave the sampler: with
        the decoupled loss (unless π_prox is interpolated instead), or with a correction that
        reads π_prox (TRL's semantics)."""
        if self.interpolates_proximal:
            return False
        c = self.correction
        corr = isinstance(c, Correction) and "proximal" in c.references()
        return self.use_decoupled_loss or corr


def check_overlong(on: bool, tokens: int | None, factor: float | None) -> None:
    """AReaL asserts both numbers when the penalty is on; set while it is off they would be
    silently ignored in a sweep, so that is an error too."""
    for name, value in (("overlong_tokens", tokens), ("overlong_penalty_factor", factor)):
        if on and value is None:
            raise ValueError(f"{name} must be set when overlong_reward_penalty is true")
        if not on and value is not None:
            raise ValueError(
                f"{name} means nothing with overlong_reward_penalty false; leave it at null"
            )


# AReaL users type PPOConfig for these knobs; AReaL's own PPOConfig is the whole experiment.
PPOConfig = PPOActorConfig
