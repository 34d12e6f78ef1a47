"""M2PO (arXiv 2510.01161): PPO-clip after a second-moment mask on the stale log-ratios."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R
from harness.ppo.objectives.ppo import ppo_clip_terms


@dataclass(frozen=True)
class M2POOptions(R.Options):
    threshold: float = R.option(
        0.04,
        "M2PO: bound τ on the second moment of ℓb − ℓp: the largest (ℓb − ℓp)² are dropped "
        "until the mean of the rest is below τ (AReaL's m2_threshold; 0.04 as in its "
        "gsm8k_m2po example).",
        gt=0,
    )


def m2_keep(second_moment: torch.Tensor, valid: torch.Tensor, threshold: float) -> torch.Tensor:
    """The tokens M2PO keeps: of the n valid tokens, drop the k largest ``second_moment`` values,
    k the smallest in [0, n − 1] that brings the mean of the remaining n − k below ``threshold``
    (strictly); if none does, keep only the smallest one.  Ties drop in index order."""
    values = second_moment[valid].double()
    n = values.numel()
    keep = valid.clone()
    if n == 0:
        return keep
    ordered, order = torch.sort(values, descending=True, stable=True)
    # the sum of ordered[k:] for every k, summed from the small end (no cancellation)
    tail = ordered.flip(0).cumsum(0).flip(0)
    means = tail / torch.arange(n, 0, -1, dtype=tail.dtype, device=tail.device)
    below = (means < threshold).nonzero()
    k = int(below[0]) if below.numel() else n - 1
    kept = torch.ones(n, dtype=torch.bool, device=valid.device)
    kept[order[:k]] = False
    keep[valid] = kept
    return keep


@R.register(
    "m2po",
    rank=8,
    summary="PPO-clip after dropping the tokens with the largest (ℓb − ℓp)² until their mean (the "
    "second moment of the stale log-ratio) is below τ; dropped tokens leave the loss and its "
    "denominator (arXiv 2510.01161)",
    options=M2POOptions,
    clip=True,
    silenced="tokens the second-moment mask dropped, or where the clip or the "
    "dual clip binds on a kept token",
    reweighted="0 (nothing is re-weighted)",
    stats={
        "policy/clipfrac": "kept tokens where the PPO clip binds (dropped tokens count as "
        "unclipped, as in AReaL)"
    },
    defaults_source="AReaL's gsm8k_m2po example",
    areal=R.Peer(
        "ppo",
        options={"threshold": "m2_threshold"},
        note="AReaL applies the mask per micro-batch; here per loss call (one minibatch)",
    ),
)
def m2po_terms(p: F.PolicyInputs, o: M2POOptions, ctx: F.Context) -> F.Terms:
    """M2PO (Second-Moment Trust Policy Optimization, arXiv 2510.01161), as AReaL computes it
    (``actor.m2_threshold``):

        M2_t = (ℓb − ℓp)²  on the valid tokens of the loss call     (detached)
        drop the k largest M2_t, k the smallest with mean(rest) < τ (k ≤ n − 1)
        m′ = m ∧ kept                      (narrows the loss mask BEFORE the loss)
        L = PPO-clip on m′ (``eps_clip``, ``eps_clip_higher``, ``c_clip``)   then ·w and
            ``loss_agg_mode``, whose token counts are taken over m′

    So a dropped token leaves the denominator too (token-mean divides by Σm′), unlike a token
    rejected by ``rejection_sampling``, which stays in it; the clip statistics are taken over m′
    (a dropped token is not "clipped"), ``silenced_mask`` over m (dropped ∪ clipped).  ℓp = ℓb
    without ``use_decoupled_loss``, so the mask only acts on stale rollouts under the decoupled
    loss (AReaL's example: ``use_decoupled_loss: true``, one minibatch, rejection sampling with
    ratio upper 5).

    Peers.  The paper writes M2 with π_θ/π_behave over the whole batch; AReaL uses π_prox (equal
    to π_θ at the first minibatch) and the micro-batch of the loss call, which here is the
    minibatch.  The paper's objective has no clip; AReaL keeps PPO-clip (its example sets
    ``eps_clip: 0.0``, which leaves r ≡ 1 in value with the full −A∇r gradient at one minibatch;
    the harness needs ε > 0, and a large ε, e.g. 10, is the unclipped objective).  Token level
    only: GSPO's sequence ratio would be taken over m, not m′.
    """
    with torch.no_grad():
        second_moment = (p.old.detach() - p.prox) ** 2
        keep = m2_keep(second_moment, p.m, o.threshold)
    pg, clip_mask, dual_clip_mask = ppo_clip_terms(p, ctx.clip)
    clip_mask, dual_clip_mask = clip_mask & keep, dual_clip_mask & keep
    silenced = (clip_mask | dual_clip_mask | ~keep) & p.m
    return F.Terms(
        pg, keep=keep, clip_mask=clip_mask, dual_clip_mask=dual_clip_mask, silenced=silenced
    )


m2po_loss = R.loss_function(m2po_terms)
