"""SAPO (Soft Adaptive Policy Optimization): a smooth gate instead of the hard clip."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class SAPOOptions(R.Options):
    temperature_pos: float = R.option(
        1.0, "SAPO: gate temperature where A > 0 (TRL default 1.0, arXiv 2511.20347).", gt=0
    )
    temperature_neg: float = R.option(
        1.05, "SAPO: gate temperature where A <= 0 (TRL default 1.05, arXiv 2511.20347).", gt=0
    )


@R.register(
    "sapo",
    rank=2,
    summary="smooth gate −(4/τ)σ(τ(r−1))·A, τ by the sign of A (arXiv 2511.20347)",
    options=SAPOOptions,
    levels=("token", "sequence"),
    silenced="0 (nothing is silenced)",
    reweighted="tokens whose gradient weight 4σ(1−σ) is below 0.5",
    gate="the gradient weight 4σ(1−σ) (1 = unclipped)",
    defaults_source="TRL",
    trl=R.Peer(
        "sapo",
        options={
            "temperature_pos": "sapo_temperature_pos",
            "temperature_neg": "sapo_temperature_neg",
        },
        aggregations=("seq-mean-token-mean",),
    ),
    verl=R.Peer("sapo", options=None),
    renamed={"sapo_temperature_pos": "temperature_pos", "sapo_temperature_neg": "temperature_neg"},
)
def sapo_terms(p: F.PolicyInputs, o: SAPOOptions, ctx: F.Context) -> F.Terms:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a smooth gate, no hard clip.

        τ = temperature_pos where A > 0, else temperature_neg
        L = −(4/τ)·σ(τ·(r − 1))·A                       then ·w and ``loss_agg_mode``

    dL/dr = −4σ(1−σ)·A: the gradient weight g = 4σ(1−σ) relative to the unclipped −A·r is exactly
    1 at r = 1 and decays smoothly (a soft trust region).  As τ → 0, L = −(2/τ)·A − (r − 1)·A +
    O(τ²): the unclipped objective plus a constant.  Matches TRL 1.16 ``loss_type="sapo"``
    (``sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures``, defaults τ+ 1.0 / τ− 1.05); TRL
    aggregates it like ``grpo`` (= ``seq-mean-token-mean`` here).  Stats: ``gate`` = g,
    ``reweighted_mask`` = tokens whose gradient the gate damped by more than half (g < 0.5, i.e.
    |τ(r − 1)| > 1.763); nothing is silenced.
    """
    tau = torch.full_like(p.ratio.detach(), o.temperature_neg)
    tau = tau.masked_fill(p.adv > 0, o.temperature_pos)
    s = torch.sigmoid(tau * (p.ratio - 1))
    g = (4 * s * (1 - s)).detach()
    return F.Terms(-(4 / tau) * s * p.adv, reweighted=g < 0.5, gate=g)


sapo_loss = R.loss_function(sapo_terms)
