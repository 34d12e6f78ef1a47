"""ROLL's train–infer correction (alibaba/ROLL ``train_infer_correction``) as ROLL applies it in
the actor's loss: its filters narrow ``response_mask``, and ``agg_loss`` then divides by counts
taken before them (``denominator: roll``).

ROLL's loss-side path (``loss_func`` with ``enable_old_logprobs_recompute: false``) is handed
``batch_num_tokens`` N = Σ M and ``global_valid_samples`` G = #{i: Σ_t M_it > 0}, both counted on
``response_mask`` M before the filter, multiplies the filter into it (M′ = M·keep, n′_i = Σ_t
M′_it) and aggregates the per-token loss L:

    token-mean               Σ_t L_t / N               (the whole matrix, M′ unused: see below)
    seq-mean-token-mean      Σ_i [n′_i > 0]·(Σ_t M′_it L_it)/(n′_i + 1e-8) / (G + 1e-8)
    seq-mean-token-sum       Σ_i Σ_t M′_it L_it / (G + 1e-8)
    seq-mean-token-sum-norm  Σ_i Σ_t M′_it L_it / T

A row the filter empties adds nothing to the numerator and still counts in G.  Under
``denominator: roll`` the two seq-mean modes are ROLL's, 1e-8s included (added in the loss's
precision; ROLL adds them to int64 counts, which torch forms in float32, where they round away:
the two are at most 1e-8/n apart, relative).  token-mean is ROLL's with the numerator masked,
Σ M′L / N: ROLL's ``agg_loss`` sums the unmasked loss matrix there, so its filter leaves the
policy loss unchanged (the open fix alibaba/ROLL#444 masks it, as here).  seq-mean-token-sum-norm
keeps the harness's Σ M′L / (G·T) (ROLL's divides by T alone, with or without a filter).

Sources (alibaba/ROLL): ``roll/utils/functionals.py`` at
090ac94658ad14006ef7665aa922bf2668f5517c (``agg_loss``, ``masked_mean``, ``masked_sum``);
``roll/utils/train_infer_corrections.py`` (``compute_train_infer_correction``) called from
``loss_func`` in ``roll/pipeline/rlvr/actor_pg_worker.py`` and
``roll/pipeline/agentic/agentic_actor_pg_worker.py``; the keys in ``roll/configs/base_config.py``
at 0a6a47e5afdc97749b353425b54f45296d9df3ff (``TrainInferFilterConfig``: ``agg_type``,
``ratio_enabled`` default true, ``diff_enabled``, ``diff_low`` −0.2, ``diff_high`` 0.2).
"""

from __future__ import annotations

import torch

from harness.ppo.corrections.registry import Preset, preset
from harness.ppo.corrections.spec import Correction, Filter

ROLL_EPS = 1e-8
# The loss_agg_modes whose ROLL denominators differ from 'pre' (the others aggregate as 'pre').
ROLL_SEQ_MODES = ("seq-mean-token-mean", "seq-mean-token-sum")


def roll_sequence_mean(
    contrib: torch.Tensor, m: torch.Tensor, kept: torch.Tensor, loss_agg_mode: str
) -> torch.Tensor:
    """ROLL's ``agg_loss`` seq-mean-token-mean / seq-mean-token-sum after its loss-side filter:

        seq-mean-token-mean  Σ_i [n′_i > 0]·S_i/(n′_i + 1e-8) / (G + 1e-8)
        seq-mean-token-sum   Σ_i S_i / (G + 1e-8)

    ``contrib`` [B, T] the weighted per-token loss, 0 off ``kept``; S_i its row sums; n′_i the
    row's ``kept`` tokens; G = max(#rows with any ``m`` token, 1), ``m`` the mask before the
    filter (ROLL's ``global_valid_samples``, clamped at 1).  The 1e-8s are added in
    ``contrib``'s precision.
    """
    dt = contrib.dtype
    per_seq = contrib.sum(dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        n = kept.sum(dim=1).to(dt)
        per_seq = torch.where(n > 0, per_seq / (n + ROLL_EPS), torch.zeros((), dtype=dt))
    elif loss_agg_mode != "seq-mean-token-sum":
        raise ValueError(f"ROLL's sequence means are {ROLL_SEQ_MODES}; got {loss_agg_mode!r}")
    g = max(int(m.any(dim=1).sum()), 1)
    return per_seq.sum() / (g + ROLL_EPS)


preset(
    Preset(
        "roll_infer_diff",
        "ROLL's train–infer probability band: tokens with p_p − p_b outside [−0.2, 0.2] leave "
        "the loss; rows are counted before the band, as ROLL's loss does",
        "keep_t ⟺ −0.2 ≤ p_p − p_b ≤ 0.2; no weight; a row's token mean over its kept tokens "
        "(n′ + 1e-8), the rows and token-mean's tokens counted before the band (G + 1e-8)",
        Correction(
            filters=(Filter(metric="prob_diff", lower=-0.2, upper=0.2),), denominator="roll"
        ),
        peers={
            "ROLL": "`train_infer_correction.filters: [{enabled: true, agg_type: token, "
            "ratio_enabled: false, diff_enabled: true, diff_low: -0.2, diff_high: 0.2}]` "
            "applied in the actor's `loss_func` (`roll/utils/train_infer_corrections.py`), "
            "under `loss_agg_mode` seq-mean-token-mean (ROLL's default) or seq-mean-token-sum; "
            "under token-mean ROLL's band leaves the loss unchanged and the harness masks the "
            "numerator instead (see ROLL's denominators below)"
        },
        rank=43,
    )
)
