"""Probability-space gates: a token leaves the loss when a statistic of the sampled token's
probabilities under the learner (p_p) and the sampler (p_b) leaves a band.

OpenRLHF's ``is_correction_gating`` (``ratio | binary_kl | tv`` with ``is_correction_mode:
mask``) keeps a survivor's token IS weight w = exp(ℓp − ℓb), unclipped, and gives a gated token
weight 0 without taking it out of the denominators; its trust-region gates (binary_kl, tv) take a
single upper bound δ.  ROLL's band on the signed difference p_p − p_b is the ``roll`` family
(``harness.ppo.corrections.roll``).  OpenRLHF applies the gate under ``policy_loss_type: ppo``
only; here it composes with every objective, as every correction does.
The OpenRLHF thresholds of the trust-region presets (0.2 for tv, 0.05 for binary_kl) are the
harness's choice: OpenRLHF's default threshold is the ratio band [0.5, 5], which it refuses for a
divergence gate; 0.2 and 0.05 are the δ SkyRL recommends for DPPO's binary TV and KL.
"""

from __future__ import annotations

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction, Filter

# OpenRLHF's ``is_correction_gating`` of each filter metric.
_GATING = {"ratio": "ratio", "tv": "tv", "binary_kl_directed": "binary_kl"}


def _gate(summary: str, formula: str, gate: Filter, rank: int) -> Preset:
    """``openrlhf_<gating>``: ρ = w_t on the tokens ``gate`` keeps, OpenRLHF's settings for it."""
    gating = _GATING[gate.metric]
    threshold = f"[{gate.lower or 0}, {gate.upper}]"
    return preset(
        Preset(
            f"openrlhf_{gating}",
            summary,
            formula,
            Correction(weight="token", filters=(gate,)),
            peers={
                "OpenRLHF": "`is_correction_level=token`, `is_correction_mode=mask`, "
                f"`is_correction_gating={gating}`, `is_correction_threshold={threshold}` "
                "(`openrlhf/models/loss.py` PolicyLoss)"
            },
            rank=rank,
        )
    )


_gate(
    "OpenRLHF's ratio gate: tokens whose w leaves [0.5, 5] get weight 0, survivors weigh w",
    "ρ_t = w_t if 0.5 ≤ w_t ≤ 5 else 0 (unclipped; pre-filter denominators)",
    Filter(metric="ratio", lower=0.5, upper=5.0),
    rank=40,
)
_gate(
    "OpenRLHF's TV trust region: tokens with abs(p_p − p_b) > 0.2 get weight 0, survivors weigh w",
    "ρ_t = w_t if abs(p̃_p − p̃_b) ≤ 0.2 else 0, p̃ = clamp(p, 1e-6, 1 − 1e-6)",
    Filter(metric="tv", upper=0.2),
    rank=41,
)
_gate(
    "OpenRLHF's binary-KL trust region: tokens with KL(Bern(p_b)‖Bern(p_p)) > 0.05 get "
    "weight 0, survivors weigh w",
    "ρ_t = w_t if p̃_b log(p̃_b/p̃_p) + (1 − p̃_b) log((1 − p̃_b)/(1 − p̃_p)) ≤ 0.05 else 0",
    Filter(metric="binary_kl_directed", upper=0.05),
    rank=42,
)
