"""CISPO (MiniMax-M1): clip the importance weight, not the update."""

from __future__ import annotations

from dataclasses import dataclass

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class CISPOOptions(R.Options):
    ratio_max: float = R.option(
        5.0,
        "CISPO: absolute cap on the IS weight sg(r) (TRL's epsilon_high under loss_type "
        "'cispo'; 5.0 as TRL recommends after ScaleRL, arXiv 2510.13786).",
        gt=1,
    )
    ratio_min: float | None = R.option(
        None,
        "CISPO: floor on the IS weight (MiniMax-M1's 1 - eps_low^IS); null = none, as in TRL.",
        ge=0,
        lt=1,
    )


@R.register(
    "cispo",
    rank=1,
    summary="clips the importance weight, not the update: −sg(min(r, ε_max))·A·log π; no token "
    "loses its gradient (MiniMax-M1, arXiv 2506.13585)",
    options=CISPOOptions,
    levels=("token", "sequence"),
    silenced="0 (no token loses its gradient)",
    reweighted="tokens whose IS weight was capped",
    gate="the capped IS weight r̂",
    defaults_source="TRL/ScaleRL",
    trl=R.Peer(
        "cispo",
        options={"ratio_max": "epsilon_high"},
        fixed={"ratio_min": (None, "TRL's cispo has no floor on the IS weight")},
        aggregations=("token-mean",),
    ),
    verl=R.Peer("cispo", options=None),
    renamed={"cispo_ratio_max": "ratio_max", "cispo_ratio_min": "ratio_min"},
)
def cispo_terms(p: F.PolicyInputs, o: CISPOOptions, ctx: F.Context) -> F.Terms:
    """CISPO (MiniMax-M1, arXiv 2506.13585 eq. 4): clip the importance weight, not the update.

        r̂ = clamp(r, ratio_min, ratio_max)            (ratio_min None = no floor, as in TRL)
        L = −sg(r̂)·A·ℓθ                               then ·w and ``loss_agg_mode``

    so every valid token with A ≠ 0 keeps a REINFORCE-style gradient r̂·A·∇ℓθ; the cap only
    re-weights it.  Matches TRL 1.16 ``loss_type="cispo"`` (``clamp(coef_1,
    max=epsilon_high).detach() * advantages * per_token_logps``, ε_max = ``epsilon_high`` an
    absolute bound on r, 5.0 recommended after ScaleRL arXiv 2510.13786); TRL always aggregates
    it like ``dapo`` (= ``token-mean`` here over one generation batch).  At sequence level r is
    GSPO's sequence ratio (TRL allows it too).  Stats: ``reweighted_mask`` = tokens whose weight was
    capped (TRL's ``cispo_clip_ratio`` counts only r > ε_max with A > 0), ``gate`` = r̂; no token is
    silenced and ``clip_mask`` is all False.
    """
    r = p.ratio.detach()
    r_hat = r.clamp(min=o.ratio_min, max=o.ratio_max)
    return F.Terms(-r_hat * p.adv * p.logprobs, reweighted=r_hat != r, gate=r_hat)


cispo_loss = R.loss_function(cispo_terms)
