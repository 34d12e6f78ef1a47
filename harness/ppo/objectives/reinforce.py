"""REINFORCE: the plain policy gradient −A·log π, no ratio and no clip."""

from __future__ import annotations

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@R.register(
    "reinforce",
    rank=10,
    summary="REINFORCE −A·log π: no ratio, no clip; the trust region is the correction's ρ "
    "alone (verl bypass_mode with rollout_correction.loss_type reinforce)",
    silenced="0 (nothing is silenced)",
    reweighted="0 (the correction's ρ is reported as policy/behave_weight_*)",
    # verl's gpg loss is −A·log π (times rollout_is_weights); under bypass its bypass_mode
    # loss with rollout_correction.loss_type reinforce is the same.
    verl=R.Peer("gpg"),
)
def reinforce_terms(p: F.PolicyInputs, o: None, ctx: F.Context) -> F.Terms:
    """REINFORCE (Williams 1992) as verl's bypass-mode loss.

        L = −A·ℓθ                                   then ·ρ and ``loss_agg_mode``

    The gradient is −ρ·A·∇ℓθ: without a correction, the on-policy policy gradient; with
    ``ppo.correction`` under ``bypass`` (ρ from sg(ℓθ) against ℓb), verl's
    ``compute_policy_loss_reinforce`` (verl-project/verl ``verl/trainer/ppo/core_algos.py``:
    ``pg_losses = -advantages * log_prob * rollout_is_weights``, then ``agg_loss``), which
    verl's ``bypass_mode`` loss dispatches to when ``rollout_correction.loss_type`` is
    ``reinforce``; outside bypass mode verl's ``loss_mode: gpg`` (``compute_policy_loss_gpg``:
    ``pg_losses = -log_prob * advantages``, × ``rollout_is_weights``).  With
    ``correction: bypass_pg_is`` this is verl's ``bypass_pg_is`` preset
    (sequence TIS, threshold 2); with ``{bypass: true, weight: token, clip_max: C, log_clamp:
    20}`` it is verl's token form, which equals ``policy_loss: cispo`` (ratio_max C) under
    ``correction: bypass``.  Nothing is clipped, silenced or re-weighted by the objective.
    """
    lt = p.on_valid(p.logprobs)
    return F.Terms(-p.adv * lt)


reinforce_loss = R.loss_function(reinforce_terms)
