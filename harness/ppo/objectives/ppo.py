"""PPO-clip (AReaL's ``ppo_actor_loss_fn``): asymmetric clip, dual clip, GSPO's sequence ratio."""

from __future__ import annotations

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R
from harness.ppo.objectives.loss_options import ClipOptions


def ppo_clip_terms(
    p: F.PolicyInputs, clip: ClipOptions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss L (before the behaviour weight), clip_mask and dual_clip_mask
    (the equations are ``ppo_terms``'s)."""
    eps_clip, eps_clip_higher, c_clip = clip.eps_clip, clip.eps_clip_higher, clip.c_clip
    adv, ratio = p.adv, p.ratio
    eps_hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_hi)
    pg1 = -adv * ratio
    pg2 = -adv * clipped_ratio
    clip_mask = pg1.detach() < pg2.detach()
    pg = torch.maximum(pg1, pg2)
    if c_clip is not None:
        pg3 = torch.sign(adv) * c_clip * adv
        dual_clip_mask = pg3.detach() < pg.detach()
        pg = torch.minimum(pg, pg3)
    else:
        dual_clip_mask = torch.zeros_like(p.m)
    return pg, clip_mask, dual_clip_mask


def ppo_clip(p: F.PolicyInputs, clip: ClipOptions) -> F.Terms:
    """PPO-clip's ``Terms``: its loss, stats as its clip and dual clip masks
    (``ppo_clip_terms``)."""
    pg, clip_mask, dual_clip_mask = ppo_clip_terms(p, clip)
    return F.Terms(pg, clip_mask=clip_mask, dual_clip_mask=dual_clip_mask)


@R.register(
    "ppo",
    rank=0,
    summary="PPO-clip −min(rA, clip(r)A); clip-higher, dual clip, GSPO "
    "(`importance_sampling_level: sequence`)",
    clip=True,
    levels=("token", "sequence"),
    silenced="tokens where the clip or the dual clip binds",
    reweighted="0 (nothing is re-weighted)",
    defaults_source="DAPO clip-higher 0.28, dual clip 3",
    trl=R.Peer("", note="the clip losses above"),
    verl=R.Peer("vanilla", levels={"sequence": "gspo"}),
    areal=R.Peer("ppo"),
)
def ppo_terms(p: F.PolicyInputs, options: None, ctx: F.Context) -> F.Terms:
    """AReaL's PPO actor loss (``ppo_actor_loss_fn``, main; docs/ppo-semantics.md "Ratio and clip").

    Inputs are [B, T] (a 1-D tensor is one sequence).  ℓθ = ``logprobs`` (carries the gradient),
    ℓp = proximal, ℓb = old/behaviour, m = ``loss_mask``:

        N0 = max(Σm, 1)                              (taken before any filtering)
        m′, w = behaviour weights (if enabled)       (w detached; see below)
        r  = exp(ℓθ − ℓp) on m, else 0               (token level)
        r  = exp(mean_{m′}(ℓθ − ℓp)) per sequence, Ā = mean_{m′}(A)   (sequence level = GSPO,
             as fixed in areal-project/AReaL#1346: padding never enters the means)
        r̃  = clamp(r, 1 − ε, 1 + ε_hi)               (ε_hi = ε when eps_clip_higher is None)
        L  = max(−A·r, −A·r̃);   clip_mask = −A·r < −A·r̃
        L  = min(L, c·|A|) if c_clip;  dual_clip_mask = c·|A| < L   (binds only where A < 0)
        L  = L·w                                     (after the dual clip)
        loss = Σ m′·L / N0                           (token-mean; other ``loss_agg_mode``s below)

    ``behave_imp_weight_mode`` (AReaL v1.0.0.post1–v1.0.3) and ``rejection_sampling`` (v1.0.4+)
    are two spellings of the behaviour weight.  The legacy modes never narrow the loss mask (the
    weight is 0 on dropped tokens, so the loss value is the same), and their cap may be None (no
    bound).  Giving both is an error.

    ``loss_agg_mode`` (beyond AReaL, whose loss is always the global token mean; verl's names):
      * ``token-mean``: Σ m′L / N0 (AReaL).
      * ``seq-mean-token-mean``: mean over non-empty sequences of Σ_t m′L / max(Σ_t m, 1).
      * ``seq-mean-token-sum``: mean over non-empty sequences of Σ_t m′L.
      * ``seq-mean-token-sum-norm``: Σ m′L / (#non-empty sequences · T), T the padded width
        (Dr. GRPO's constant normalizer).

    Returns (loss, stats).  Per-token stats (detached): ``loss`` (unmasked L), ``importance_weight``
    (r), ``approx_kl`` (ℓθ − ℓp, a log-ratio), ``clip_mask``, ``clip_low_mask`` (A<0, r<1−ε),
    ``clip_high_mask`` (A>0, r>1+ε_hi), ``dual_clip_mask`` (all ∧ m); with weighting on also
    ``behave_imp_weight`` (w), ``behave_mask`` ((w>0) ∧ m′), ``behave_approx_kl`` (ℓp − ℓb on
    behave_mask) and the float ``filtered_fraction``; and ``silenced_mask`` (clip ∪ dual clip),
    ``reweighted_mask`` (none).
    """
    return ppo_clip(p, ctx.clip)


ppo_actor_loss = R.loss_function(ppo_terms)
