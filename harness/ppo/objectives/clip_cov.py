"""Clip-Cov (arXiv 2505.22617): PPO-clip plus a few high-covariance tokens detached."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R
from harness.ppo.objectives.covariance import cov_stats, covariance, n_selected, ratio_option
from harness.ppo.objectives.ppo import ppo_clip_terms


@dataclass(frozen=True)
class ClipCovOptions(R.Options):
    ratio: float = ratio_option(
        "Clip-Cov: share of valid tokens whose gradient is detached (paper/verl 2e-4; "
        "0 = plain PPO-clip)."
    )
    cov_lb: float = R.option(1.0, "Clip-Cov: candidates have covariance > this (verl default 1).")
    cov_ub: float = R.option(5.0, "Clip-Cov: candidates have covariance < this (verl default 5).")

    def check(self) -> None:
        if not self.cov_lb < self.cov_ub:
            raise ValueError(
                f"clip_cov.cov_lb ({self.cov_lb}) must be < clip_cov.cov_ub ({self.cov_ub})"
            )


@R.register(
    "clip_cov",
    rank=4,
    summary="PPO-clip, plus a random few tokens with covariance(log π, A) in a band detached "
    "(arXiv 2505.22617)",
    options=ClipCovOptions,
    clip=True,
    silenced="tokens the clip, the dual clip or the covariance draw silenced",
    reweighted="0",
    stats={
        "policy/cov_selected": "tokens detached per optimizer step",
        "policy/cov_candidates": "tokens inside the band (cov_lb, cov_ub) and not clipped",
        "policy/cov_threshold": "the smallest covariance among the detached tokens",
    },
    defaults_source="verl",
    verl=R.Peer(
        "clip_cov",
        options={"ratio": "clip_cov_ratio", "cov_lb": "clip_cov_lb", "cov_ub": "clip_cov_ub"},
    ),
    renamed={"clip_cov_ratio": "ratio", "clip_cov_lb": "cov_lb", "clip_cov_ub": "cov_ub"},
)
def clip_cov_terms(p: F.PolicyInputs, o: ClipCovOptions, ctx: F.Context) -> F.Terms:
    """Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617 §4.2):
    PPO-clip, plus the gradient of a few high-covariance tokens detached.

        L_t = PPO-clip loss (eps_clip, eps_clip_higher, c_clip)
        candidates = valid tokens the clip does not already silence with cov_lb < cov_t < cov_ub
        k = max(⌊ratio·Σm⌋, 1) (0 when ratio = 0); draw min(k, #candidates) uniformly without
        replacement (``generator``), L_t = 0 on them          then ·w and ``loss_agg_mode``

    Matches verl ``loss_mode="clip_cov"`` (``compute_policy_loss_clip_cov``, defaults ratio 2e-4,
    bounds 1 and 5), except that verl requires ratio > 0 and has no dual clip.  With ratio 0 it
    is PPO-clip.  Stats: ``cov_mask`` (the drawn tokens), ``silenced_mask`` (clip ∪ dual clip ∪
    drawn), floats ``cov_selected``, ``cov_candidates`` and ``cov_threshold`` (the smallest drawn
    covariance, NaN when none was drawn).
    """
    pg, clip_mask, dual_clip_mask = ppo_clip_terms(p, ctx.clip)
    cov = covariance(p)
    cand = p.m_loss & ~clip_mask & ~dual_clip_mask & (cov > o.cov_lb) & (cov < o.cov_ub)
    idx = torch.nonzero(cand.flatten()).flatten()
    k = min(n_selected(o.ratio, int(p.m_loss.sum())), int(idx.numel()))
    cov_mask = torch.zeros_like(p.m)
    if k > 0:
        # The draw runs on the CPU generator of the run (determinism), then moves to the data.
        perm = torch.randperm(int(idx.numel()), generator=ctx.generator).to(idx.device)
        cov_mask.view(-1)[idx[perm[:k]]] = True
    pg = torch.where(cov_mask, pg * 0, pg)  # zero value and gradient (verl multiplies by 0)
    return F.Terms(
        pg,
        clip_mask=clip_mask,
        dual_clip_mask=dual_clip_mask,
        silenced=clip_mask | dual_clip_mask | cov_mask,
        extra={**cov_stats(cov, cov_mask, k), "cov_candidates": float(idx.numel())},
    )


clip_cov_loss = R.loss_function(clip_cov_terms)
