"""How the decoupled loss gets π_prox: a recompute (a forward pass at the weights the update starts
from) or AReaL's log-linear interpolation between the behaviour and the current log-probs.

Source: AReaL (inclusionAI/AReaL) ``areal/trainer/ppo/actor.py``
(``compute_prox_logp_approximations``, ``_resolve_proximal_logp``) and
``docs/algorithms/prox_approx.md``; the option is ``actor.prox_logp_method``.
"""

from __future__ import annotations

from typing import Literal

import torch

ProxLogpMethod = Literal["recompute", "loglinear"]


def loglinear_alpha(versions: torch.Tensor, current_version: int) -> torch.Tensor:
    """The interpolation weight of each token from policy versions.

    With v_θ = ``current_version`` (the updates the learner has made), v_b = ``versions`` (the
    version that sampled each token; negative = not generated, e.g. prompt or padding) and
    AReaL's assumption that the proximal policy is one version behind the learner,
    v_prox = v_θ − 1:

        α = clamp((v_prox − v_b) / (v_θ − v_b), 0, 1)   where v_θ − v_b > 0 and v_b ≥ 0,
        α = 0                                           elsewhere.

    A batch sampled k updates ago (v_b = v_θ − k) therefore gets α = (k − 1)/k: 0 at k ≤ 1,
    1/2 at k = 2, 7/8 at k = 8.  AReaL ``areal/trainer/ppo/actor.py``,
    ``compute_prox_logp_approximations``.
    """
    v_b = versions.to(torch.float64)
    v_theta = float(current_version)
    gap = v_theta - v_b
    ok = (gap > 0) & (versions >= 0)
    alpha = torch.where(ok, (v_theta - 1.0 - v_b) / torch.where(ok, gap, 1.0), 0.0)
    return alpha.clamp(0.0, 1.0)


def loglinear_proximal(
    behaviour_logprobs: torch.Tensor,
    current_logprobs: torch.Tensor,
    versions: torch.Tensor,
    current_version: int,
) -> torch.Tensor:
    """π_prox by log-linear interpolation instead of a forward pass (AReaL ``loglinear``):

        ℓp ≈ ℓb + α·(sg(ℓθ) − ℓb) = (1 − α)·ℓb + α·sg(ℓθ),   α = ``loglinear_alpha``,

    i.e. a geometric mean of the behaviour and current token probabilities.  ℓθ is detached
    (π_prox is a constant of the loss, as a recompute would be), so with ratio r = exp(ℓθ − ℓp)
    the loss's gradient still flows through ℓθ only.  The result has the inputs' dtype (never
    below float32).  AReaL ``areal/trainer/ppo/actor.py``, ``compute_prox_logp_approximations``
    (method ``loglinear``), resolved per micro-batch from that micro-batch's ℓθ in
    ``_resolve_proximal_logp``.
    """
    dtype = torch.promote_types(
        torch.promote_types(behaviour_logprobs.dtype, current_logprobs.dtype), torch.float32
    )
    lb = behaviour_logprobs.detach().to(dtype)
    lt = current_logprobs.detach().to(dtype)
    alpha = loglinear_alpha(versions, current_version).to(dtype)
    return lb + alpha * (lt - lb)


__all__ = ["ProxLogpMethod", "loglinear_alpha", "loglinear_proximal"]
