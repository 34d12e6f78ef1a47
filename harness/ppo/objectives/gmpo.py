"""GMPO (Geometric-Mean Policy Optimization): one clipped geometric-mean ratio per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class GMPOOptions(R.Options):
    log_clip: float = R.option(
        0.4,
        "GMPO: token log-ratio clipped to [-eps, eps_hi] (arXiv 2507.20673 uses 0.4; verl "
        "reuses clip_ratio).",
        gt=0,
    )
    log_clip_higher: float | None = R.option(
        None, "GMPO: upper log-space bound eps_hi; null = log_clip.", gt=0
    )


@R.register(
    "gmpo",
    rank=3,
    summary="geometric mean of the sequence's token ratios, clipped sign-aware in log space "
    "(arXiv 2507.20673)",
    options=GMPOOptions,
    silenced="tokens whose log-space clip binds",
    reweighted="0",
    gate="the clipped sequence ratio ρ_i",
    defaults_source="paper",
    verl=R.Peer("geo_mean", options=None),
    renamed={"gmpo_log_clip": "log_clip", "gmpo_log_clip_higher": "log_clip_higher"},
)
def gmpo_terms(p: F.PolicyInputs, o: GMPOOptions, ctx: F.Context) -> F.Terms:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): the geometric mean of the
    token ratios of a sequence, each clipped sign-aware in log space.

        δ = ℓθ − ℓp;  s = sgn(A);  δ′ = s·min(s·δ, s·clamp(δ, −ε, ε_hi))   (ε_hi = ε if None)
        ρ_i = exp(mean_{t∈m′_i} δ′_t);  Ā_i = mean_{t∈m′_i} A_t
        L_t = −Ā_i·ρ_i on every valid token of sequence i      then ·w and ``loss_agg_mode``

    Matches verl ``loss_mode="geo_mean"`` (``compute_policy_loss_geo_mean``), which always takes
    the mean over sequences — ``seq-mean-token-mean`` here; ``token-mean`` weights each sequence by
    its length.  The paper's range is (−0.4, 0.4) in log space (verl reuses ``clip_ratio``).  With
    equal ratios and one advantage per sequence, GMPO equals token PPO-clip with
    ε = 1 − e^(−ε_log), ε_hi = e^(ε_log_hi) − 1.  Stats: ``clip_mask`` = valid tokens whose
    log-ratio clip binds (A > 0 and δ > ε_hi, or A < 0 and δ < −ε: their gradient is zero, so they
    are also ``silenced_mask``; verl's clipfrac counts every δ outside the range), ``gate`` = ρ_i.
    """
    lo = o.log_clip
    hi = lo if o.log_clip_higher is None else o.log_clip_higher
    delta = p.log_ratio
    sgn = torch.sign(p.adv)
    delta_c = sgn * torch.minimum(sgn * delta, sgn * delta.clamp(-lo, hi))
    ml = p.m_loss
    n_i = ml.sum(dim=1, keepdim=True).clamp(min=1)
    rho = torch.exp(torch.where(ml, delta_c, p.zero).sum(dim=1, keepdim=True) / n_i)
    zero_a = torch.zeros((), dtype=p.adv.dtype)
    adv_i = torch.where(ml, p.adv, zero_a).sum(dim=1, keepdim=True) / n_i
    d = delta.detach()
    binds = ((p.adv > 0) & (d > hi)) | ((p.adv < 0) & (d < -lo))
    pg = (-adv_i * rho).expand_as(delta)
    return F.Terms(pg, clip_mask=binds, silenced=binds, gate=rho.expand_as(delta))


gmpo_loss = R.loss_function(gmpo_terms)
