"""DPPO (arXiv 2602.04879): a trust region on the sampled token's probability, not the ratio."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R

# SkyRL's bounds: 0.2 for the total variation, 0.05 recommended for the KL.
DEFAULT_DELTA = {"binary_tv": 0.2, "binary_kl": 0.05}
_EPS = 1e-8  # inside the binary KL's (1 − p) logs, as in the peers
_LOG_RATIO_CLAMP = 20.0  # SkyRL and verl clamp ℓθ − ℓμ to ±20 before the exp
# verl's actor config sets clip_ratio_c 3.0 (its dppo code falls back to 20 only without the key).
DEFAULT_RATIO_CAP = 3.0


@dataclass(frozen=True)
class DPPOOptions(R.Options):
    divergence: Literal["binary_tv", "binary_kl"] = R.option(
        "binary_tv",
        "DPPO: the divergence bounded per token (SkyRL's dppo_type): binary_tv = p_θ − p_μ "
        "of the sampled token, binary_kl = the KL between the two Bernoullis (p_μ, p_θ).",
    )
    delta_low: float | None = R.option(
        None,
        "DPPO: bound for tokens with A < 0 (moves that lower p); null = 0.2 for binary_tv, "
        "0.05 for binary_kl (SkyRL).",
        gt=0,
    )
    delta_high: float | None = R.option(
        None,
        "DPPO: bound for tokens with A > 0 (moves that raise p); null = 0.2 for binary_tv, "
        "0.05 for binary_kl (SkyRL).",
        gt=0,
    )
    anchor: Literal["behaviour", "proximal"] = R.option(
        "behaviour",
        "DPPO: the policy μ the divergence and the ratio are taken against: behaviour (the "
        "sampler's log-probs, as the paper, SkyRL and prime-rl) or proximal (π_prox: verl's "
        "old_log_prob under use_decoupled_loss).",
    )

    surrogate: Literal["ratio", "truncated_is"] = R.option(
        "ratio",
        "DPPO: the loss on kept tokens: ratio = −A·r (SkyRL, prime-rl; the gradient flows "
        "through r), truncated_is = −A·sg(min(r, ratio_cap))·log π (verl's dppo_tv / dppo_kl; "
        "the same gradient while r <= ratio_cap, a different loss value).",
    )
    ratio_cap: float | None = R.option(
        None,
        "DPPO: the cap c of surrogate truncated_is (verl's actor.clip_ratio_c); null = 3.0, "
        "verl's actor default.  Only with surrogate truncated_is.",
        gt=0,
    )
    kl_tau: float = R.option(
        0.0,
        "DPPO: coefficient of prime-rl's drift penalty kl_tau·(ℓθ − ℓμ)² on every valid token, "
        "dropped or not (prime-rl's default loss: 1e-3); 0 = none (SkyRL, verl).",
        ge=0,
    )

    def check(self) -> None:
        if self.surrogate == "ratio" and self.ratio_cap is not None:
            raise ValueError(
                "dppo.ratio_cap means nothing with dppo.surrogate 'ratio' (it caps "
                "truncated_is); leave it at null"
            )

    def cap(self) -> float:
        """c of surrogate truncated_is (verl's clip_ratio_c, 3.0 in its actor config)."""
        return DEFAULT_RATIO_CAP if self.ratio_cap is None else self.ratio_cap

    def deltas(self) -> tuple[float, float]:
        """(δ_low, δ_high), the divergence's default where null."""
        d = DEFAULT_DELTA[self.divergence]
        lo = d if self.delta_low is None else self.delta_low
        return lo, d if self.delta_high is None else self.delta_high


def binary_kl(
    p_mu: torch.Tensor, p_theta: torch.Tensor, l_mu: torch.Tensor, l_theta: torch.Tensor
) -> torch.Tensor:
    """D = p_μ(ℓμ − ℓθ) + (1 − p_μ)·log((1 − p_μ + ε)/(1 − p_θ + ε)), ε = 1e-8."""
    return p_mu * (l_mu - l_theta) + (1 - p_mu) * torch.log(
        (1 - p_mu + _EPS) / (1 - p_theta + _EPS)
    )


@R.register(
    "dppo",
    rank=6,
    summary="a trust region on the divergence (binary TV or KL) of the sampled token's "
    "probability instead of the ratio clip: −A·r inside it, 0 outside (arXiv 2602.04879)",
    options=DPPOOptions,
    silenced="tokens outside the trust region (dropped)",
    reweighted="kept tokens with r > ratio_cap under surrogate truncated_is "
    "(verl's pg_clipfrac_lower); 0 under ratio",
    stats={
        "policy/clipfrac": "tokens outside the trust region (SkyRL's clip_ratio)",
        "policy/clipfrac_low": "dropped tokens with A < 0 (prime-rl's is_masked_low)",
        "policy/clipfrac_high": "dropped tokens with A > 0 (prime-rl's is_masked_high)",
    },
    defaults_source="SkyRL; δ null = 0.2 for binary_tv, 0.05 for binary_kl",
    verl=R.Peer(
        "dppo_tv",
        options=None,
        by_option=("divergence", {"binary_tv": "dppo_tv", "binary_kl": "dppo_kl"}),
        note="verl reuses actor.clip_ratio_low/high as δ_low/δ_high and clip_ratio_c as the "
        "truncated_is cap, and anchors at old_log_prob: ppo.dppo.anchor proximal under "
        "use_decoupled_loss",
    ),
)
def dppo_terms(p: F.PolicyInputs, o: DPPOOptions, ctx: F.Context) -> F.Terms:
    """DPPO (Divergence PPO, arXiv 2602.04879): keep a token while the policy's move on the
    sampled token's probability stays inside a divergence bound; no ratio clip.

        ℓμ = anchor log-probs (``anchor``: behaviour ℓb, or proximal ℓp);  p = e^ℓ
        d = p_θ − p_μ                               (detached, like every mask below)
        D = p_μ(ℓμ − ℓθ) + (1 − p_μ)·log((1 − p_μ + 1e-8)/(1 − p_θ + 1e-8))
        binary_tv: drop ⇔ (A > 0 ∧ d > δ_high) ∨ (A < 0 ∧ d < −δ_low)
        binary_kl: drop ⇔ (A > 0 ∧ d > 0 ∧ D > δ_high) ∨ (A < 0 ∧ d < 0 ∧ D > δ_low)
        r = exp(clamp(ℓθ − ℓμ, −20, 20))
        surrogate ratio:        L = −A·r on kept tokens, 0 on dropped ones
        surrogate truncated_is: L = −A·sg(min(r, c))·ℓθ on kept tokens, 0 on dropped ones
        + kl_tau·(ℓθ − ℓμ)² on every valid token   (kl_tau 0 by default)
                                                    then ·w and ``loss_agg_mode``

    A move toward the advantage's sign is bounded; a move away from it never drops a token
    (the "safe" direction).  The gradient goes through r (−A·r·∇ℓθ): REINFORCE with the IS ratio
    inside the region, nothing outside.  δ null = 0.2 (binary_tv) or 0.05 (binary_kl).

    Peers.  SkyRL ``policy_loss_type: dppo`` (``dppo_type``, ``delta_low``/``delta_high``) is
    this function with ``anchor: behaviour`` (its μ is the rollout log-probs; SkyRL cites §5.2 of
    the paper for that choice, so it is the default here); a strict ``>`` drops, so a divergence
    equal to δ is kept.  prime-rl's default loss is binary_tv with ``anchor: behaviour`` and
    bounds 0.2, without the ±20 clamp (equal unless |ℓθ − ℓb| > 20), with ``kl_tau`` 1e-3:
    PrimeIntellect-ai/prime-rl ``src/prime_rl/trainer/rl/loss.py`` ``default_loss_fn`` (``pg_loss
    = keep_mask · adv_tau·A · importance_ratio``, ``kl_loss = loss_mask · log_importance_ratio²``,
    ``loss = (−pg_loss + kl_tau · kl_loss).sum()`` over the step's loss-token count =
    ``loss_agg_mode: token-mean``); prime-rl sends A = 0 tokens down the A < 0 branch, which
    changes its ``is_masked`` count only (their loss is 0).  verl ``loss_mode: dppo_tv | dppo_kl`` anchors at
    ``old_log_prob`` = ``anchor: proximal`` under ``use_decoupled_loss`` (in verl's bypass mode
    and here without the decoupled loss, ℓp = ℓb and both anchors agree); its surrogate is
    ``truncated_is`` with c = ``clip_ratio_c`` (verl-project/verl
    ``verl/trainer/ppo/core_algos.py`` ``compute_policy_loss_dppo_tv`` / ``_kl``:
    ``pg_losses = -advantages * clamp(ratio, max=clip_ratio_c).detach() * log_prob *
    valid_mask``; 3.0 in verl's actor config), whose gradient equals ``ratio``'s while r ≤ c
    but whose value differs; verl sends A = 0 tokens down the A < 0 branch (their loss is 0
    either way, only the drop count differs).  With ``anchor: behaviour`` and a behaviour weight
    (``behave_imp_weight_mode`` / ``rejection_sampling``) π_prox/π_behave is counted twice, as
    SkyRL warns for its own corrections.

    Stats: ``clip_mask`` = ``silenced_mask`` = the dropped valid tokens (``clip_low_mask`` with
    A < 0, ``clip_high_mask`` with A > 0); ``reweighted_mask`` = kept tokens with r > c under
    ``truncated_is`` (verl's ``pg_clipfrac_lower``), none under ``ratio``.
    """
    lo, hi = o.deltas()
    anchor = (p.old if o.anchor == "behaviour" else p.prox).detach()
    log_r = p.on_valid(p.logprobs - anchor)
    r = torch.exp(log_r.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    with torch.no_grad():
        l_theta = p.on_valid(p.logprobs.detach())
        l_mu = p.on_valid(anchor)
        p_theta, p_mu = l_theta.exp(), l_mu.exp()
        d = p_theta - p_mu
        pos, neg = p.adv > 0, p.adv < 0
        if o.divergence == "binary_tv":
            drop = (pos & (d > hi)) | (neg & (d < -lo))
        else:
            kl = binary_kl(p_mu, p_theta, l_mu, l_theta)
            drop = (pos & (d > 0) & (kl > hi)) | (neg & (d < 0) & (kl > lo))
        drop = drop & p.m
    # prime-rl's drift penalty: on every valid token, through the unclamped log-ratio.
    drift = o.kl_tau * log_r * log_r if o.kl_tau else None
    if o.surrogate == "ratio":
        pg = torch.where(drop, p.zero, -p.adv * r)
        return F.Terms(pg if drift is None else pg + drift, clip_mask=drop, silenced=drop)
    r_hat = r.detach().clamp(max=o.cap())
    lt = p.on_valid(p.logprobs)
    pg = torch.where(drop, p.zero, -p.adv * r_hat * lt)
    capped = (r.detach() > o.cap()) & p.m & ~drop
    if drift is not None:
        pg = pg + drift
    return F.Terms(pg, clip_mask=drop, silenced=drop, reweighted=capped, gate=r_hat)


dppo_loss = R.loss_function(dppo_terms)
