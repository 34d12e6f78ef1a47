"""Truncated importance sampling: ρ = min(w, C), per token or per sequence (the product)."""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "token_tis",
        "token-level truncated IS",
        "ρ_t = min(exp(clamp(ℓp − ℓb, ±20)), 2)",
        Correction(weight="token", clip_max=2.0, log_clamp=20.0),
        peers={
            "verl": "`rollout_is=token`, `rollout_is_threshold=2.0` (decoupled_token_is)",
            "TRL": "`vllm_importance_sampling_mode=token_truncate`, `clip_max=2.0` (up to "
            "the ±20 log clamp, beyond e²⁰ only)",
            "SkyRL": "`tis_ratio_type=token`, `token_tis_ratio_clip_high=2.0`",
        },
        rank=0,
    )
)

preset(
    Preset(
        "seq_tis",
        "sequence-level truncated IS (product of the row's ratios)",
        "ρ_i = min(exp(clamp(Σ_t M(ℓp − ℓb), ±20)), 2), broadcast to the row",
        Correction(weight="sequence_product", clip_max=2.0, log_clamp=20.0),
        peers={
            "verl": "`rollout_is=sequence`, `rollout_is_threshold=2.0` (decoupled_seq_is)",
            "TRL": "`vllm_importance_sampling_mode=sequence_truncate`, `clip_max=2.0` (up to the "
            "±20 log clamp)",
            "SkyRL": "`tis_ratio_type=sequence`, `sequence_tis_ratio_clip_high=2.0`",
        },
        rank=1,
    )
)
