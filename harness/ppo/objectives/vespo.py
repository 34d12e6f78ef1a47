"""VESPO (arXiv 2602.10693): a detached gamma weight on the sequence's summed log-ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from harness.ppo.objectives import frame as F
from harness.ppo.objectives import registry as R

_LOG_W_MIN = math.log(1e-8)  # TRL clamps log W to [log 1e-8, 20] (so W never needs its own clamp)
_LOG_W_MAX = 20.0
_LOG_RATIO_CLAMP = 20.0  # each token's ℓθ − ℓp is clamped to ±20 before the sum, as in TRL
_LAMBDA_MIN = 1e-4  # TRL's floor on λ
# The weights whose ρ is a factor of the sampler ratio, and the one refusal of fold (shared by
# the pure call and the config check).
FOLDABLE = ("token", "sequence_product")
FOLD_NEEDS = (
    "vespo.behaviour_weight 'fold' needs ppo.correction with weight 'token' (TRL's "
    "token_truncate / token_mask) or 'sequence_product' (TRL's sequence_truncate / "
    "sequence_mask); otherwise use 'multiply'"
)


@dataclass(frozen=True)
class VESPOOptions(R.Options):
    k_pos: float = R.option(
        2.0,
        "VESPO: shape k of the gamma weight φ(W) = e^λ·W^k·e^(−λW) where A >= 0 (TRL's "
        "vespo_k_pos, default 2.0).",
        ge=0,
    )
    lambda_pos: float = R.option(
        3.0,
        "VESPO: rate λ of the gamma weight where A >= 0 (TRL's vespo_lambda_pos, default 3.0; "
        "the weight peaks at W = k/λ).",
        gt=0,
    )
    k_neg: float = R.option(
        3.0,
        "VESPO: shape k of the gamma weight where A < 0 (TRL's vespo_k_neg, default 3.0).",
        ge=0,
    )
    lambda_neg: float = R.option(
        2.0,
        "VESPO: rate λ of the gamma weight where A < 0 (TRL's vespo_lambda_neg, default 2.0).",
        gt=0,
    )
    behaviour_weight: Literal["multiply", "fold"] = R.option(
        "multiply",
        "VESPO: how the correction's ρ (ppo.correction) enters: 'multiply' L·ρ per token, as "
        "for every objective, with W against π_prox only; 'fold' TRL's composition, L not "
        "multiplied by ρ but log W += clamp(log ρ, log 1e-8, 20) once per factor of ρ: summed "
        "over the row's tokens for weight 'token' (TRL's token_truncate / token_mask), once per "
        "row for 'sequence_product' (TRL's [B, 1] sequence ratio); no other weight.",
    )


def folded_log_rho(w: torch.Tensor, m: torch.Tensor, *, per_row: bool) -> torch.Tensor:
    """What ``fold`` adds to a row's log W [B, 1]: each factor of ρ once, log-clamped.

        token weight (ρ_t):         Σ_t M·clamp(log ρ_t, log 1e-8, 20)
        sequence weight (ρ_i):      clamp(log ρ_i, log 1e-8, 20)       (once, NOT n_i times)

    Source: TRL v1.16.0, trl/trainer/grpo_trainer.py, ``GRPOTrainer.get_gamma_weights``:
    ``seq_log_ratio += torch.sum(clamp(log(importance_sampling_ratio), log 1e-8, 20), dim=-1,
    keepdim=True)``, where the ratio is [B, T] for token_* modes and [B, 1] for sequence_* ones,
    so a sequence ρ_i enters once.  Here a sequence weight arrives broadcast to the row's
    tokens (0 where a filter dropped one): ρ_i is read back as its largest value over M, 0
    when every token is zeroed (``zero_outside``, TRL's sequence_mask: log W → log 1e-8); an
    empty row adds 0.  ρ = 0 gives log 0 = −inf, clamped to log 1e-8, as TRL's clamp does.
    """
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    if per_row:
        rho = torch.where(m, w, zero).amax(dim=-1, keepdim=True)
        log_rho = torch.log(rho).clamp(_LOG_W_MIN, _LOG_W_MAX)
        return torch.where(m.any(dim=-1, keepdim=True), log_rho, zero)
    log_rho = torch.log(w).clamp(_LOG_W_MIN, _LOG_W_MAX)
    return torch.where(m, log_rho, zero).sum(dim=-1, keepdim=True)


def gamma_weight(log_w: torch.Tensor, k: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """φ = e^λ·W^k·e^(−λW) in log space (φ(1) = 1); NaN or ±inf → 0, as in TRL."""
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@R.register(
    "vespo",
    rank=7,
    summary="REINFORCE −sg(φ(W))·A·log π with a gamma weight φ(W) = e^λ·W^k·e^(−λW) of the "
    "sequence ratio W = exp(Σ log r), (k, λ) by the sign of A (arXiv 2602.10693)",
    options=VESPOOptions,
    silenced="tokens whose sequence weight φ underflowed to 0",
    reweighted="tokens whose sequence weight φ is below 0.5",
    gate="the gamma weight φ(W) of the token's sequence (φ(1) = 1)",
    defaults_source="TRL",
    trl=R.Peer(
        "vespo",
        options={
            "k_pos": "vespo_k_pos",
            "lambda_pos": "vespo_lambda_pos",
            "k_neg": "vespo_k_neg",
            "lambda_neg": "vespo_lambda_neg",
        },
        aggregations=("token-mean",),
    ),
)
def vespo_terms(p: F.PolicyInputs, o: VESPOOptions, ctx: F.Context) -> F.Terms:
    """VESPO (arXiv 2602.10693): REINFORCE scaled by a detached gamma weight of the sequence's
    importance ratio.

        log W_i = clamp(Σ_t M·clamp(ℓθ − ℓp, ±20), log 1e-8, 20)      (a SUM over the row)
        (k, λ) = (k_pos, λ_pos) where A ≥ 0, else (k_neg, λ_neg);  λ ← max(λ, 1e-4)
        φ = e^λ·W^k·e^(−λW)   (detached; NaN/±inf → 0)
        L = −φ·A·ℓθ                                       then ·w and ``loss_agg_mode``

    The gradient is −φ·A·∇ℓθ: φ(1) = 1, it peaks at W = k/λ (≈ 1.21 at W = 2/3 with the A ≥ 0
    defaults, ≈ 1.24 at W = 1.5 with the A < 0 ones) and decays to 0 on both sides, so a sequence
    far from the proximal policy fades out instead of being clipped token by token.

    Peers.  TRL 1.16 ``loss_type="vespo"`` (``vespo_k_pos``/``vespo_lambda_pos``/``vespo_k_neg``/
    ``vespo_lambda_neg``, defaults 2, 3, 3, 2), with the sign of A taken per token (TRL's
    advantages are per sequence, so the same there); TRL aggregates it like ``dapo`` (=
    ``token-mean`` here over one generation batch).  With a behaviour weight ρ (``ppo.correction``)
    the composition is an option, ``behaviour_weight``:

        multiply (default): W against π_prox as above; L·ρ per token, as every objective
        fold (TRL 1.16, ``get_gamma_weights`` in trl/trainer/grpo_trainer.py):
            log W_i = clamp(Σ_t M·clamp(ℓθ − ℓp, ±20) + F_i, log 1e-8, 20)
            F_i = Σ_t M·clamp(log ρ_t, log 1e-8, 20)     weight 'token' (TRL's token_* modes)
            F_i = clamp(log ρ_i, log 1e-8, 20)            weight 'sequence_product' (sequence_*)
            L = −φ(W)·A·ℓθ, NOT multiplied by ρ again

    so under ``fold`` W is the ratio against the sampler (π_θ/π_prox · π_prox/π_behave, with ρ
    truncated or zeroed first) and ρ = 0 (``zero_outside``) sends the row's W to 1e-8 (φ ≈ 0).
    A sequence ρ_i (the truncated or zeroed Π_t π_prox/π_behave) is one factor: TRL's ρ is
    [B, 1] there and its sum over dim −1 adds log ρ_i once, not n_i times (``folded_log_rho``).  TRL's trainer itself refuses sequence_* modes
    with VESPO; its ``get_gamma_weights`` computes them as above, and so does the harness.
    'sequence_geometric' (exp of a mean, not a factor of the sampler ratio) and no weight are
    refused.  TRL sums token log ρ over the padded width, where its ρ = clip(1, C_min, C_max):
    the two agree whenever C_min ≤ 1 ≤ C_max (TRL's defaults), which the sum over M assumes.
    Policy ratio at token level only (W is already a sequence quantity; TRL warns for
    ``importance_sampling_level: sequence``).

    Stats: ``gate`` = φ broadcast to the row's tokens; ``silenced_mask`` = tokens with φ = 0
    (e.g. a row with log W at a clamp bound and a large λ); ``reweighted_mask`` = φ < 0.5.
    """
    log_r = p.on_valid(p.log_ratio.detach())
    log_r = log_r.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    log_w = log_r.sum(dim=-1, keepdim=True)
    fold = o.behaviour_weight == "fold"
    if fold:
        if p.w is None or p.weight_kind not in FOLDABLE:
            got = f"got {p.weight_kind!r}" if p.weight_kind else "no correction given"
            raise ValueError(f"{FOLD_NEEDS} ({got})")
        per_row = p.weight_kind != "token"
        log_w = log_w + folded_log_rho(p.w.detach(), p.m, per_row=per_row)
    log_w = log_w.clamp(_LOG_W_MIN, _LOG_W_MAX)
    nonneg = p.adv >= 0
    k = torch.where(nonneg, o.k_pos, o.k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, o.lambda_pos, o.lambda_neg).to(log_w.dtype).clamp(min=_LAMBDA_MIN)
    phi = gamma_weight(log_w, k, lam)
    lt = p.on_valid(p.logprobs)
    return F.Terms(
        -phi * p.adv * lt,
        silenced=phi == 0,
        reweighted=phi < 0.5,
        gate=phi,
        weighted=fold,
    )


vespo_loss = R.loss_function(vespo_terms)
