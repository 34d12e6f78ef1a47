"""DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556 eq. 9): drop the negative-advantage
rows the current policy has moved far from, judged per micro-batch against sg(ℓθ)."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset, row_filter
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "opsm",
        "off-policy sequence mask (DeepSeek-V3.2), δ = 0.5",
        "keep_i ⟺ A_i ≥ 0 ∨ mean_t M(ℓb − sg(ℓθ)) ≤ 0.5 (evaluated in the loss, per micro-batch)",
        Correction(
            filters=(
                row_filter("k1", upper=0.5, reference="current", negative_advantage_only=True),
            )
        ),
        peers={"TRL": "`off_policy_mask_threshold=0.5`"},
        rank=8,
    )
)
