"""prime-rl's IPO loss: a symmetric trust region on the sampled token's probability."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class IPOOptions(R.Options):
    threshold: float = R.option(
        0.1,
        "IPO: a token leaves the policy-gradient term when |p_θ − p_b| of its sampled token "
        "exceeds this (prime-rl's ipo_threshold, default 0.1).",
        gt=0,
        le=1,
    )
    kl_tau: float = R.option(
        1e-3,
        "IPO: coefficient of the drift penalty kl_tau·(ℓθ − ℓb)² on every valid token, kept or "
        "not (prime-rl's kl_tau, default 1e-3); 0 = none.",
        ge=0,
    )
    adv_tau: float = R.option(
        1.0,
        "IPO: factor on A in the policy-gradient term only (prime-rl's adv_tau, default 1).",
        gt=0,
    )


@R.register(
    "ipo",
    rank=12,
    summary="prime-rl's ipo: −A·r on tokens with \\|p_θ − p_b\\| ≤ threshold, 0 elsewhere, plus "
    "kl_tau·(log r)² on every token (r against the sampler)",
    options=IPOOptions,
    silenced="tokens outside the trust region (prime-rl's is_masked)",
    reweighted="0 (the drift penalty acts on every token)",
    stats={
        "policy/clipfrac": "tokens outside the trust region (prime-rl's is_masked)",
        "policy/ipo_drift": "mean over valid tokens of (ℓθ − ℓb)², the drift term before kl_tau",
    },
    defaults_source="prime-rl (IPOLossConfig: ipo_threshold 0.1, kl_tau 1e-3, adv_tau 1)",
)
def ipo_terms(p: F.PolicyInputs, o: IPOOptions, ctx: F.Context) -> F.Terms:
    """prime-rl's ``ipo`` loss type: the DPPO skeleton with a symmetric trust region.

        log r = ℓθ − ℓb,  r = exp(log r)            (against the sampler, no clamp)
        d = p_θ − p_b,  p = e^ℓ                      (a mask: no gradient through it)
        keep ⇔ |d| ≤ threshold
        L = −keep·adv_tau·A·r + kl_tau·(log r)²     then ·w and ``loss_agg_mode``

    Unlike DPPO the drop does not look at the sign of A: a token whose probability moved by
    more than the threshold in either direction stops receiving policy gradient, while the
    quadratic drift penalty keeps pulling every valid token back toward the sampler.

    Source: PrimeIntellect-ai/prime-rl ``src/prime_rl/trainer/rl/loss.py``
    (``pg_loss_fn`` with ``trust_region="ipo"``, reached through ``ipo_loss_fn`` /
    ``IPOLossConfig``): ``probs_diff = exp(trainer_logprobs) − exp(inference_logprobs)``,
    ``is_masked = abs(probs_diff) > ipo_threshold``, ``pg_loss = keep_mask · (adv_tau ·
    advantages) · importance_ratio``, ``kl_loss = loss_mask · log_importance_ratio²``,
    ``loss = (−pg_loss + kl_tau · kl_loss).sum()``, divided by the step's count of loss tokens
    (= ``loss_agg_mode: token-mean`` with dropped tokens kept in the denominator).  Older
    prime-rl releases spelled the option ``eps`` (0.3, with ``max_importance_ratio`` and no KL
    term); this follows the ``ipo_threshold`` / ``kl_tau`` release.  prime-rl's ``is_masked``
    metric is ``policy/clipfrac`` here.
    """
    log_r = p.on_valid(p.logprobs - p.old.detach())
    r = torch.exp(log_r)
    with torch.no_grad():
        d = p.on_valid(p.logprobs.detach().exp() - p.old.detach().exp())
        drop = (d.abs() > o.threshold) & p.m
        n = max(int(p.m.sum()), 1)
        drift = float((log_r.detach() ** 2).sum()) / n
    pg = torch.where(drop, p.zero, -o.adv_tau * p.adv * r)
    return F.Terms(
        pg + o.kl_tau * log_r * log_r,
        clip_mask=drop,
        silenced=drop,
        extra={"ipo_drift": drift},
    )


ipo_loss = R.loss_function(ipo_terms)
