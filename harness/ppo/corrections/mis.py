"""Masked importance sampling: ρ = w inside [C_min, C_max], 0 outside (TRL's *_mask, IcePop)."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, level_presets, preset
from harness.ppo.corrections.spec import Correction


def _peers(level: str, prefix: str) -> dict[str, str]:
    """TRL at C = 3, its default (sequence_mask is its default mode)."""
    default = " (default)" if level == "sequence" else ""
    return {"TRL": f"`vllm_importance_sampling_mode={level}_mask`, `clip_max=3.0`{default}"}


level_presets(
    "mis",
    token=("token-level masked IS (TRL token_mask)", "ρ_t = w_t if w_t ≤ 3 else 0"),
    sequence=(
        "sequence-level masked IS (TRL's default mode sequence_mask)",
        "ρ_i = ∏_t w_t if ∏_t w_t ≤ 3 else 0",
    ),
    rank=2,
    peers=_peers,
    clip_max=3.0,
    zero_outside=True,
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
