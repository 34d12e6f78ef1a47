"""Kimi k1.5's policy gradient with a squared log-ratio penalty, as ROLL ships it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R


@dataclass(frozen=True)
class Kimi15Options(R.Options):
    tau: float = R.option(
        0.1,
        "kimi15: coefficient τ of the penalty (τ/2)·(ℓθ − ℓp)² (ROLL's kimi15_tau, default 0.1).",
        ge=0,
    )


@R.register(
    "kimi15",
    rank=13,
    summary="Kimi k1.5: −A·log π + (τ/2)·(log π − log π_old)², no ratio and no clip "
    "(arXiv 2501.12599; ROLL pg_variant kimi15)",
    options=Kimi15Options,
    silenced="0 (nothing is silenced)",
    reweighted="0 (the penalty acts on every token)",
    defaults_source="ROLL (kimi15_tau 0.1)",
)
def kimi15_terms(p: F.PolicyInputs, o: Kimi15Options, ctx: F.Context) -> F.Terms:
    """Kimi k1.5's online mirror-descent surrogate (arXiv 2501.12599, Eq. 3):

        L = −A·ℓθ + (τ/2)·(ℓθ − ℓp)²                then ·w and ``loss_agg_mode``

    with ℓp the log-probs the update starts from (π_prox: ℓb unless the actor recomputes).  The
    gradient is −A·∇ℓθ + τ·(ℓθ − ℓp)·∇ℓθ: REINFORCE pulled back toward the old policy in
    proportion to how far the token's log-prob has moved.

    Source: alibaba/ROLL ``roll/pipeline/rlvr/actor_pg_worker.py`` and
    ``roll/pipeline/agentic/agentic_actor_pg_worker.py`` (``_compute_kimi15_loss``:
    ``kimi15_loss = -advantages * log_probs + tau * 0.5 * (log_probs - old_log_probs).pow(2)``,
    ``tau = kimi15_tau`` default 0.1, then ``agg_loss`` by ``loss_agg_mode``); ROLL's
    ``old_log_probs`` are the training engine's recompute before the update (``ppo.
    recompute_logprob`` or the decoupled loss here).
    """
    lt = p.on_valid(p.logprobs)
    prox = p.on_valid(p.prox)
    d = lt - prox
    return F.Terms(-p.adv * lt + 0.5 * o.tau * d * d)


kimi15_loss = R.loss_function(kimi15_terms)
