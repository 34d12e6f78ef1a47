"""The token covariance shared by Clip-Cov and KL-Cov (arXiv 2505.22617 §4)."""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.core.fields import option
from harness.ppo.objectives.frame import PolicyInputs, Stats


def ratio_option(help: str) -> Any:
    """The ``ratio`` option both declare: the share of valid tokens selected by covariance, in
    [0, 1], 2e-4 as in the paper and verl (0 switches the selection off here)."""
    return option(2e-4, help, ge=0, le=1)


def covariance(p: PolicyInputs) -> torch.Tensor:
    """cov_t = (A_t − mean(A))·(ℓθ_t − mean(sg ℓθ)), means over the tokens in the loss (−inf off
    them) — the centred per-token covariance of arXiv 2505.22617 §4 (verl ``clip_cov``/``kl_cov``)."""
    ml = p.m_loss
    n = max(int(ml.sum()), 1)
    a = p.adv.double()
    lt = p.logprobs.detach().double()
    zero = torch.zeros((), dtype=torch.float64)
    a_mean = torch.where(ml, a, zero).sum() / n
    l_mean = torch.where(ml, lt, zero).sum() / n
    cov = (a - a_mean) * (lt - l_mean)
    return torch.where(ml, cov, torch.full((), -math.inf, dtype=torch.float64))


def cov_stats(cov: torch.Tensor, cov_mask: torch.Tensor, k: int) -> Stats:
    """The stats both report on their ``k`` selected tokens ``cov_mask``: the mask, their count
    and the smallest covariance among them (NaN when none was selected)."""
    return {
        "cov_mask": cov_mask,
        "cov_selected": float(k),
        "cov_threshold": float(cov[cov_mask].min()) if k > 0 else math.nan,
    }


def n_selected(ratio: float, n_valid: int) -> int:
    """verl: max(⌊ratio·n⌋, 1) with ratio > 0 required; ratio 0 here switches the selection off."""
    if ratio <= 0 or n_valid == 0:
        return 0
    return max(int(ratio * n_valid), 1)
