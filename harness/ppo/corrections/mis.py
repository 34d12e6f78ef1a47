"""Masked importance sampling: ρ = w inside [C_min, C_max], 0 outside (TRL's *_mask, IcePop)."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "token_mis",
        "token-level masked IS (TRL token_mask)",
        "ρ_t = w_t if w_t ≤ 3 else 0",
        Correction(weight="token", clip_max=3.0, zero_outside=True),
        peers={"TRL": "`vllm_importance_sampling_mode=token_mask`, `clip_max=3.0`"},
        rank=2,
    )
)

preset(
    Preset(
        "seq_mis",
        "sequence-level masked IS (TRL's default mode sequence_mask)",
        "ρ_i = ∏_t w_t if ∏_t w_t ≤ 3 else 0",
        Correction(weight="sequence_product", clip_max=3.0, zero_outside=True),
        peers={"TRL": "`vllm_importance_sampling_mode=sequence_mask`, `clip_max=3.0` (default)"},
        rank=3,
    )
)

preset(
    Preset(
        "icepop",
        "token IcePop: ratios outside [0.5, 5] get weight 0, the others are weighted",
        "ρ_t = w_t if 0.5 ≤ w_t ≤ 5 else 0 (w_t = exp(clamp(ℓp − ℓb, ±20)))",
        Correction(weight="token", clip_min=0.5, clip_max=5.0, zero_outside=True, log_clamp=20.0),
        peers={
            "verl": '`rollout_is=token`, `rollout_is_threshold="0.5_5.0"` (*_token_icepop)',
            "TRL": "`vllm_importance_sampling_mode=token_mask`, `clip_min=0.5`, `clip_max=5.0`",
        },
        rank=4,
    )
)
