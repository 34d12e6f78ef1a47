"""Truncated importance sampling: ρ = min(w, C), per token or per sequence (the product)."""

from __future__ import annotations

from harness.ppo.corrections.registry import level_presets


def _peers(level: str, prefix: str) -> dict[str, str]:
    """verl's, TRL's and SkyRL's settings at C = 2 (TRL has no log clamp: it differs where the
    ±20 clamp binds)."""
    beyond = ", beyond e²⁰ only" if level == "token" else ""
    return {
        "verl": f"`rollout_is={level}`, `rollout_is_threshold=2.0` (decoupled_{prefix}_is)",
        "TRL": f"`vllm_importance_sampling_mode={level}_truncate`, `clip_max=2.0` (up to the ±20 "
        f"log clamp{beyond})",
        "SkyRL": f"`tis_ratio_type={level}`, `{level}_tis_ratio_clip_high=2.0`",
    }


level_presets(
    "tis",
    token=("token-level truncated IS", "ρ_t = min(exp(clamp(ℓp − ℓb, ±20)), 2)"),
    sequence=(
        "sequence-level truncated IS (product of the row's ratios)",
        "ρ_i = min(exp(clamp(Σ_t M(ℓp − ℓb), ±20)), 2), broadcast to the row",
    ),
    rank=0,
    peers=_peers,
    clip_max=2.0,
    log_clamp=20.0,
)
