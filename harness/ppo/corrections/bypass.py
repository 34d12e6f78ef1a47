"""verl's bypass mode: no proximal recompute; the PPO ratio is against the sampler's log-probs."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "bypass",
        "bypass: clip exp(ℓθ − ℓb) directly, no recompute, no IS weight",
        "r = exp(ℓθ − ℓb); ρ = 1 (with policy_loss cispo: −sg(min(r, C))·A·ℓθ = verl bypass_pg_is)",
        Correction(bypass=True),
        peers={"verl": "`bypass_mode=true`, `loss_type=ppo_clip`, no rollout_is / rollout_rs"},
        requires={"use_decoupled_loss": False, "recompute_logprob": False},
        rank=9,
    )
)
