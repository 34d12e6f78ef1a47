"""LUSPO (arXiv 2602.05261): GSPO whose sequence losses are summed over tokens, not averaged."""

from __future__ import annotations

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R
from harness.ppo.objectives.ppo import ppo_clip


@R.register(
    "luspo",
    rank=9,
    summary="GSPO's clipped sequence-ratio loss scaled by the sequence's length: "
    "(1/B)·Σ_i n_i·ℓ_i, so a long sequence is not down-weighted per token (arXiv 2602.05261)",
    clip=True,
    levels=("sequence", "token"),
    aggregations=("seq-mean-token-sum",),
    silenced="tokens where the clip or the dual clip binds (at sequence "
    "level every token of a clipped sequence)",
    reweighted="0 (nothing is re-weighted)",
    defaults_source="TRL; set importance_sampling_level: sequence as TRL recommends",
    trl=R.Peer("luspo", aggregations=("seq-mean-token-sum",)),
    # verl spells it as its PPO / GSPO loss under loss_agg_mode seq-mean-token-sum
    verl=R.Peer("vanilla", levels={"sequence": "gspo"}),
)
def luspo_terms(p: F.PolicyInputs, options: None, ctx: F.Context) -> F.Terms:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261): GSPO with each
    sequence's loss weighted by its length.

        s_i = exp(mean_{m′}(ℓθ − ℓp))  per sequence (``importance_sampling_level: sequence``)
        ℓ_i = max(−s_i·Ā_i, −clamp(s_i, 1 − ε, 1 + ε_hi)·Ā_i)   (and the dual clip if c_clip)
        loss = (1/B′)·Σ_i Σ_t m′·w·ℓ_i = (1/B′)·Σ_i n_i·ℓ_i     (``seq-mean-token-sum``, the
                                                                  only aggregation it allows)

    GSPO's ``seq-mean-token-mean`` gives every sequence the same weight whatever its length;
    summing its tokens instead makes the gradient per token independent of the length.  At token
    level (which TRL allows with a warning) it is the token PPO-clip loss summed per sequence.

    Peers.  TRL 1.16 ``loss_type="luspo"`` (``(per_token_loss * mask).sum(-1).mean()``, its
    clip ε/ε_hi = ``epsilon``/``epsilon_high``): the same loss, except that TRL's B counts
    every row and B′ here only the rows with a valid token (equal unless a completion has no
    valid token); TRL's ``delta`` (an upper clamp on the unclipped ratio) is the dual clip
    ``c_clip`` under the conditions ``harness.peers.trl`` states.  verl: ``loss_mode: gspo``
    (``vanilla`` at token level) with ``loss_agg_mode: seq-mean-token-sum``.  The per-token advantage
    enters as its sequence mean at sequence level (TRL's advantages are per sequence already).
    Stats as PPO-clip.
    """
    return ppo_clip(p, ctx.clip)


luspo_loss = R.loss_function(luspo_terms)
