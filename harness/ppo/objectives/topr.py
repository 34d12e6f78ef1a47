"""TOPR (Tapered Off-Policy REINFORCE), as ROLL ships it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.corrections.compute import row_mean
from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class TOPROptions(R.Options):
    positive_weight: float = R.option(
        1.0, "TOPR: weight of the positive rows' term (ROLL's topr_positive_weight, 1).", ge=0
    )
    negative_weight: float = R.option(
        1.0, "TOPR: weight of the other rows' term (ROLL's topr_negative_weight, 1).", ge=0
    )


@R.register(
    "topr",
    rank=14,
    summary="TOPR: −A·log π on rows with A > 0 (no ratio), −sg(clip(r, 0, 1))·A·log π on the "
    "others (arXiv 2503.14286; ROLL pg_variant topr)",
    options=TOPROptions,
    silenced="0 (nothing is silenced)",
    reweighted="tokens of the other rows whose ratio the taper cut (r > 1)",
    gate="the per-token weight: 1 on positive rows, min(r, 1) on the others",
    defaults_source="ROLL (topr_positive_weight 1, topr_negative_weight 1)",
)
def topr_terms(p: F.PolicyInputs, o: TOPROptions, ctx: F.Context) -> F.Terms:
    """TOPR (Le Roux et al., arXiv 2503.14286, Eq. 8): supervised updates on the good
    trajectories, truncated importance sampling on the others.

        positive row (A_i > 0):  L = −w₊·A·ℓθ
        other rows:              L = −w₋·sg(clamp(r, 0, 1))·A·ℓθ,  r = exp(ℓθ − ℓp)
                                                    then ·w and ``loss_agg_mode``

    A_i = the row's mean advantage over its valid tokens.

    Source: alibaba/ROLL ``roll/pipeline/rlvr/actor_pg_worker.py`` and
    ``roll/pipeline/agentic/agentic_actor_pg_worker.py`` (``_compute_topr_loss``:
    ``positive_loss = -advantages * log_probs * positive_token_mask``, ``negative_loss =
    -clamp(ratio, 0, 1).detach() * advantages * log_probs * negative_token_mask``, weights
    ``topr_positive_weight`` / ``topr_negative_weight``).  ROLL splits the rows on the episode
    score (``scores > 0``), which the loss here does not see; it splits on the sign of the
    row's advantage instead.  The two agree whenever the baseline makes a positive-reward row's
    advantage positive and a non-positive one's non-positive, e.g. rewards in {0, 1} with any
    group-mean baseline (a row of an all-correct or all-wrong group has A = 0 and no loss in
    either branch); with graded rewards a below-mean positive reward is a negative row here and
    a positive one in ROLL.
    """
    lt = p.on_valid(p.logprobs)
    positive = (row_mean(p.adv, p.m) > 0).expand_as(p.m)
    r = torch.exp(p.on_valid(p.logprobs.detach() - p.prox))
    taper = r.clamp(0.0, 1.0)
    gate = torch.where(positive, torch.ones_like(taper), taper)
    weight = torch.where(positive, o.positive_weight, o.negative_weight)
    cut = ~positive & (r > 1.0) & p.m
    return F.Terms(-weight * gate * p.adv * lt, reweighted=cut, gate=gate)


topr_loss = R.loss_function(topr_terms)
