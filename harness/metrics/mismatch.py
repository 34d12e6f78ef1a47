"""Training–inference mismatch metrics: the sampler's log-probs against the learner's (pure, no grad).

Per token t of row i, with the mask M (the generated tokens), ℓb the behaviour log-prob the
sampler recorded, ℓp a learner forward's log-prob of the same token, n_i = Σ_t M, and
log w = ℓp − ℓb (w the token importance weight π_p/π_b); mean_M is the mean over the batch's
valid tokens:

    kl_k1              = mean_M(ℓb − ℓp)                     verl rollout_corr/kl
    kl_k3              = mean_M(w − log w − 1)               verl rollout_corr/k3_kl
    logprob_abs_diff_* = mean_M / max_M |ℓp − ℓb|            TRL sampling/sampling_logp_difference
    prob_abs_diff_max  = max_M |exp ℓp − exp ℓb|             verl training/rollout_probs_diff_max
    log_ppl_diff       = (1/B) Σ_i (ℓ̄b_i − ℓ̄p_i)             verl log_ppl_diff
    ppl_ratio          = (1/B) Σ_i exp(ℓ̄b_i − ℓ̄p_i)          verl ppl_ratio
    chi2_token         = mean_M(w²) − 1                      verl chi2_token
    chi2_seq           = (1/B) Σ_i exp(2 Σ_t M log w) − 1    verl chi2_seq
    ess                = 1 / mean_M(ŵ²), ŵ = w / mean_M(w)   verl rollout_is_eff_sample_size

with ℓ̄_i = Σ_t M ℓ / (n_i + 1e-8) (verl's divisor: an empty row enters the row means with a
difference of 0 and a PPL ratio of 1). Both KLs estimate KL(π_b‖π_p) from the sampler's own
samples, as verl does: k1 is unbiased but can be negative, k3 is ≥ 0. log w is clamped to ±20
before every exp (verl's clamp); the ESS uses the raw token weights w (no correction applied:
the ESS the mismatch alone would leave a token-level IS correction), in (0, 1].

Numerics: float64, and k3 = expm1(x) − x with x = log w (in float32, w − log w − 1 at
|x| ~ 1e-7 is all rounding; the float32 sampler/learner gap is that small). Values off the mask
are never read (NaN there is harmless); NaN on the mask propagates. With no valid token every
value is NaN (not logged).

The decomposition under staleness (:func:`mismatch_decomposition`; no peer reports it) splits
ℓb − ℓcur (sampler vs the learner at the current weights) at ℓsnap, the learner-precision
forward of the snapshot the sampler ran: numerics = ℓb vs ℓsnap, lag = ℓsnap vs ℓcur. k1 adds
exactly (ℓb − ℓcur = (ℓb − ℓsnap) + (ℓsnap − ℓcur), averaged over the same tokens); k3 adds only
approximately (to second order both parts are ½·mean_M x², and the cross term
mean_M(x_numerics · x_lag) is what the sum leaves out).
"""

from __future__ import annotations

import math

import torch

__all__ = ["MISMATCH_KEYS", "DECOMPOSITION_KEYS", "mismatch_decomposition", "mismatch_stats"]

CLAMP = 20.0  # verl's bound on a log-ratio before exp (e^40 still fits float64 with room)
ROW_EPS = 1e-8  # verl's per-row divisor n_i + 1e-8
ESS_EPS = 1e-8  # verl's ŵ = w / (mean_M w + 1e-8)

MISMATCH_KEYS: tuple[str, ...] = (
    "mismatch/kl_k1",
    "mismatch/kl_k3",
    "mismatch/logprob_abs_diff_mean",
    "mismatch/logprob_abs_diff_max",
    "mismatch/prob_abs_diff_max",
    "mismatch/log_ppl_diff",
    "mismatch/ppl_ratio",
    "mismatch/chi2_token",
    "mismatch/chi2_seq",
    "mismatch/ess",
)
DECOMPOSITION_KEYS: tuple[str, ...] = (
    "mismatch/numerics_kl_k1",
    "mismatch/numerics_kl_k3",
    "mismatch/lag_kl_k1",
    "mismatch/lag_kl_k3",
)


def _prepared(
    behaviour: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log w with 0 off the mask, ℓb with 0 off, the bool mask), float64, [B, L]."""
    if behaviour.shape != learner.shape or behaviour.shape != mask.shape:
        raise ValueError(
            f"mismatch: shapes differ: behaviour {tuple(behaviour.shape)}, learner "
            f"{tuple(learner.shape)}, mask {tuple(mask.shape)}"
        )
    m = mask.bool()
    zero = torch.zeros((), dtype=torch.float64, device=behaviour.device)
    lb = torch.where(m, behaviour.double(), zero)
    lp = torch.where(m, learner.double(), zero)
    return lp - lb, lb, m


@torch.no_grad()
def kl_k1_k3(
    behaviour: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """(k1, k3) estimates of KL(π_b‖π_p) over the valid tokens; NaN without one."""
    log_w, _, m = _prepared(behaviour, learner, mask)
    n = int(m.sum())
    if n == 0:
        return math.nan, math.nan
    x = log_w[m]
    xc = x.clamp(-CLAMP, CLAMP)
    return float(-x.sum() / n), float((torch.expm1(xc) - xc).sum() / n)


@torch.no_grad()
def mismatch_stats(
    behaviour: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The :data:`MISMATCH_KEYS` of one batch (module docstring): ``behaviour`` ℓb and
    ``learner`` ℓp per token, ``[B, L]`` in the same layout as ``mask``."""
    log_w, lb, m = _prepared(behaviour, learner, mask)
    n = int(m.sum())
    if n == 0:
        return dict.fromkeys(MISMATCH_KEYS, math.nan)
    x = log_w[m]
    xc = x.clamp(-CLAMP, CLAMP)
    k1, k3 = kl_k1_k3(behaviour, learner, mask)
    absx = x.abs()
    lp_valid = lb[m] + x
    prob_diff = (lp_valid.exp() - lb[m].exp()).abs()

    n_i = m.sum(-1).double()
    # Row means: ℓ̄b_i − ℓ̄p_i = −Σ_t M log w / (n_i + 1e-8).
    row_diff = -log_w.sum(-1) / (n_i + ROW_EPS)
    row_sum = log_w.sum(-1).clamp(-CLAMP, CLAMP)

    w = xc.exp()
    w_hat = w / (w.mean() + ESS_EPS)
    return {
        "mismatch/kl_k1": k1,
        "mismatch/kl_k3": k3,
        "mismatch/logprob_abs_diff_mean": float(absx.mean()),
        "mismatch/logprob_abs_diff_max": float(absx.max()),
        "mismatch/prob_abs_diff_max": float(prob_diff.max()),
        "mismatch/log_ppl_diff": float(row_diff.mean()),
        "mismatch/ppl_ratio": float(row_diff.clamp(-CLAMP, CLAMP).exp().mean()),
        "mismatch/chi2_token": float(torch.expm1(2 * xc).mean()),
        "mismatch/chi2_seq": float(torch.expm1(2 * row_sum).mean()),
        "mismatch/ess": float(1.0 / (w_hat.pow(2).mean())),
    }


@torch.no_grad()
def mismatch_decomposition(
    behaviour: torch.Tensor,
    snapshot: torch.Tensor,
    current: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """The :data:`DECOMPOSITION_KEYS`: numerics = ℓb (sampler) vs ``snapshot`` (the learner's
    forward of the sampling weights); lag = ``snapshot`` vs ``current`` (the learner's forward
    of the current weights), both KL estimates from the sampler's tokens."""
    nk1, nk3 = kl_k1_k3(behaviour, snapshot, mask)
    lk1, lk3 = kl_k1_k3(snapshot, current, mask)
    return {
        "mismatch/numerics_kl_k1": nk1,
        "mismatch/numerics_kl_k3": nk3,
        "mismatch/lag_kl_k1": lk1,
        "mismatch/lag_kl_k3": lk3,
    }
