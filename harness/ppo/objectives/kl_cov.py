"""KL-Cov (arXiv 2505.22617): no clip; a KL penalty on the top-covariance tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R
from harness.ppo.objectives.covariance import cov_stats, covariance, n_selected, ratio_option


@dataclass(frozen=True)
class KLCovOptions(R.Options):
    ratio: float = ratio_option(
        "KL-Cov: share of valid tokens, largest covariance first, given the KL penalty "
        "(paper/verl 2e-4; 0 = unclipped policy gradient)."
    )
    coef: float = R.option(
        1.0, "KL-Cov: coefficient of the |log-ratio| penalty (verl ppo_kl_coef, 1).", ge=0
    )


@R.register(
    "kl_cov",
    rank=5,
    summary="no clip; a KL penalty coef·\\|log r\\| on the top-covariance tokens (arXiv 2505.22617)",
    options=KLCovOptions,
    silenced="0 (nothing is silenced)",
    reweighted="the KL-penalised tokens",
    stats={
        "policy/cov_selected": "tokens penalised per optimizer step",
        "policy/cov_threshold": "the top-k covariance cut-off",
        "policy/cov_penalty_kl": "mean \\|log π_θ − log π_prox\\| on the penalised tokens",
    },
    defaults_source="verl",
    verl=R.Peer("kl_cov", options={"ratio": "kl_cov_ratio", "coef": "ppo_kl_coef"}),
    renamed={"kl_cov_ratio": "ratio", "kl_cov_coef": "coef"},
)
def kl_cov_terms(p: F.PolicyInputs, o: KLCovOptions, ctx: F.Context) -> F.Terms:
    """KL-Cov (arXiv 2505.22617 §4.2): no clip; a KL penalty on the top-covariance tokens.

        L_t = −A_t·r_t                                  on every valid token
        L_t = −A_t·r_t + coef·|δ_t| on the k = max(⌊ratio·Σm⌋, 1) tokens with the largest cov_t
        (k = 0 when ratio = 0)                          then ·w and ``loss_agg_mode``

    Matches verl ``loss_mode="kl_cov"`` (``compute_policy_loss_kl_cov``, defaults ratio 2e-4,
    ``ppo_kl_coef`` 1).  Ties in cov are broken by ``torch.topk``.  Stats: ``cov_mask`` (=
    ``reweighted_mask``, the penalised tokens), floats ``cov_selected``, ``cov_threshold`` (the
    k-th largest covariance, NaN when k = 0) and ``cov_penalty_kl`` (mean |δ| on them).
    """
    pg = -p.adv * p.ratio
    cov = covariance(p)
    k = n_selected(o.ratio, int(p.m_loss.sum()))
    cov_mask = torch.zeros_like(p.m)
    if k > 0:
        cov_mask.view(-1)[torch.topk(cov.flatten(), k).indices] = True
    pg = torch.where(cov_mask, pg + o.coef * p.log_ratio.abs(), pg)
    abs_kl = p.log_ratio.detach()[cov_mask].abs()
    return F.Terms(
        pg,
        reweighted=cov_mask,
        extra={
            **cov_stats(cov, cov_mask, k),
            "cov_penalty_kl": float(abs_kl.mean()) if k > 0 else math.nan,
        },
    )


kl_cov_loss = R.loss_function(kl_cov_terms)
