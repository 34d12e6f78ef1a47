"""verl's bypass mode: no proximal recompute; the ratio and ρ are against the sampler's log-probs."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "bypass",
        "bypass: clip exp(ℓθ − ℓb) directly, no recompute, no IS weight",
        "r = exp(ℓθ − ℓb); ρ = 1 (with policy_loss cispo, ratio_max C: −sg(min(r, C))·A·ℓθ = "
        "verl bypass + reinforce + rollout_is=token, threshold C)",
        Correction(bypass=True),
        peers={"verl": "`bypass_mode=true`, `loss_type=ppo_clip`, no rollout_is / rollout_rs"},
        requires={"use_decoupled_loss": False, "recompute_logprob": False},
        rank=9,
    )
)

preset(
    Preset(
        "bypass_pg_is",
        "bypass REINFORCE with sequence-level truncated IS against the current policy",
        "ρ_i = min(exp(clamp(Σ_t M(sg(ℓθ) − ℓb), ±20)), 2), broadcast to the row; L = −A·ρ_i·ℓθ",
        Correction(bypass=True, weight="sequence_product", clip_max=2.0, log_clamp=20.0),
        peers={
            "verl": "`RolloutCorrectionConfig.bypass_pg_is()`: `bypass_mode=true`, "
            "`loss_type=reinforce`, `rollout_is=sequence`, `rollout_is_threshold=2.0`",
        },
        requires={
            "policy_loss": "reinforce",
            "use_decoupled_loss": False,
            "recompute_logprob": False,
        },
        rank=10,
    )
)
