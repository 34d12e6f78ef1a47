"""The clipping-objective family beside PPO-clip: CISPO, SAPO, GMPO, Clip-Cov, KL-Cov.

Each objective is a pure function with ``ppo_actor_loss``'s inputs (ℓθ carrying the gradient,
proximal ℓp, old/behaviour ℓb, advantages A, loss mask; [B, T] or [T]) and its stats contract:
the behaviour weight w (decoupled loss: ``behave_imp_weight_mode`` / ``rejection_sampling``)
multiplies every objective's per-token loss after its own gate, and ``loss_agg_mode`` aggregates
it, exactly as for PPO-clip.  Every objective adds two per-token masks to the stats:
``silenced_mask`` (valid tokens whose policy gradient the objective zeroed) and
``reweighted_mask`` (valid tokens it kept but re-weighted or penalised), and where it has one a
per-token ``gate`` (its weight/gate).  Semantics: docs/ppo-semantics.md "Other policy
objectives"; peers: TRL 1.16 ``huggingface/trl trl/trainer/grpo_trainer.py``
(``_compute_loss``), verl ``volcengine/verl verl/trainer/ppo/core_algos.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.ppo.loss import (
    PolicyInputs,
    RejectionSampling,
    _check_shapes,
    aggregate,
    base_stats,
    behaviour_weighted,
    one_row,
    ppo_clip_terms,
    prepare_policy_inputs,
    validate_clip_options,
)

POLICY_LOSSES = ("ppo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")

# Objective-specific options, the objectives that use them, and their defaults (the papers' or
# the peers', cited on the config fields).  A non-default value under another objective is an
# error: it would otherwise be silently ignored in a sweep.
OBJECTIVE_OPTIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "eps_clip": (("ppo", "clip_cov"), 0.2),
    "eps_clip_higher": (("ppo", "clip_cov"), None),
    "c_clip": (("ppo", "clip_cov"), None),
    "cispo_ratio_max": (("cispo",), 5.0),
    "cispo_ratio_min": (("cispo",), None),
    "sapo_temperature_pos": (("sapo",), 1.0),
    "sapo_temperature_neg": (("sapo",), 1.05),
    "gmpo_log_clip": (("gmpo",), 0.4),
    "gmpo_log_clip_higher": (("gmpo",), None),
    "clip_cov_ratio": (("clip_cov",), 2e-4),
    "clip_cov_lb": (("clip_cov",), 1.0),
    "clip_cov_ub": (("clip_cov",), 5.0),
    "kl_cov_ratio": (("kl_cov",), 2e-4),
    "kl_cov_coef": (("kl_cov",), 1.0),
}
# importance_sampling_level 'sequence' (GSPO's ratio) is meaningful where the objective is a
# function of one ratio per token (TRL allows it for cispo and sapo).
SEQUENCE_LEVEL_OK = ("ppo", "cispo", "sapo")


def validate_objective(policy_loss: str, importance_sampling_level: str, **options: Any) -> None:
    """Raise ``ValueError`` naming the option and the objective when an option means nothing under
    ``policy_loss`` or is out of range (one line; shared by the config and the pure functions)."""
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(
            f"policy_loss must be one of {', '.join(POLICY_LOSSES)}; got {policy_loss!r}"
        )
    for name, value in options.items():
        users, default = OBJECTIVE_OPTIONS[name]
        if policy_loss not in users and value != default:
            raise ValueError(
                f"{name} means nothing under policy_loss {policy_loss!r} (it is an option of "
                f"{' / '.join(users)}); leave it at {'null' if default is None else default}"
            )
    if importance_sampling_level == "sequence" and policy_loss not in SEQUENCE_LEVEL_OK:
        raise ValueError(
            f"importance_sampling_level 'sequence' means nothing under policy_loss "
            f"{policy_loss!r} (allowed with {', '.join(SEQUENCE_LEVEL_OK)})"
        )

    def get(name: str) -> Any:
        return options.get(name, OBJECTIVE_OPTIONS[name][1])

    if not get("cispo_ratio_max") > 1:
        raise ValueError(f"cispo_ratio_max must be > 1; got {get('cispo_ratio_max')}")
    lo = get("cispo_ratio_min")
    if lo is not None and not 0 <= lo < 1:
        raise ValueError(f"cispo_ratio_min must be in [0, 1) or null; got {lo}")
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if not (get(name) > 0 and math.isfinite(get(name))):
            raise ValueError(f"{name} must be a finite number > 0; got {get(name)}")
    if not get("gmpo_log_clip") > 0:
        raise ValueError(f"gmpo_log_clip must be > 0; got {get('gmpo_log_clip')}")
    hi = get("gmpo_log_clip_higher")
    if hi is not None and not hi > 0:
        raise ValueError(f"gmpo_log_clip_higher must be > 0 or null; got {hi}")
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
        if not 0 <= get(name) <= 1:
            raise ValueError(f"{name} must be in [0, 1]; got {get(name)}")
    if not get("clip_cov_lb") < get("clip_cov_ub"):
        raise ValueError(
            f"clip_cov_lb ({get('clip_cov_lb')}) must be < clip_cov_ub ({get('clip_cov_ub')})"
        )
    if not (get("kl_cov_coef") >= 0 and math.isfinite(get("kl_cov_coef"))):
        raise ValueError(f"kl_cov_coef must be a finite number >= 0; got {get('kl_cov_coef')}")


_NAMES = ("logprobs", "proximal_logprobs", "old_logprobs", "advantages", "loss_mask")


def _common_checks(
    xs: tuple[torch.Tensor, ...],
    behave_imp_weight_mode: str,
    behave_imp_weight_cap: float | None,
    rejection_sampling: RejectionSampling | None,
    importance_sampling_level: str,
    loss_agg_mode: str,
) -> None:
    # The shared options are checked by the PPO validator (eps_clip is a dummy valid value here).
    validate_clip_options(
        0.2,
        None,
        None,
        behave_imp_weight_mode,
        behave_imp_weight_cap,
        rejection_sampling,
        importance_sampling_level,
        loss_agg_mode,
    )
    _check_shapes(**dict(zip(_NAMES, xs, strict=True)))
    if xs[0].dim() not in (1, 2):
        raise ValueError(f"expected [B, T] or [T] tensors; got {tuple(xs[0].shape)}")


def _prepare(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    kw: dict[str, Any],
) -> PolicyInputs:
    return prepare_policy_inputs(
        logprobs,
        proximal_logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        behave_imp_weight_mode=kw["behave_imp_weight_mode"],
        behave_imp_weight_cap=kw["behave_imp_weight_cap"],
        rejection_sampling=kw["rejection_sampling"],
        importance_sampling_level=kw["importance_sampling_level"],
    )


def _finish(
    p: PolicyInputs,
    pg: torch.Tensor,
    loss_agg_mode: str,
    *,
    clip_mask: torch.Tensor | None = None,
    dual_clip_mask: torch.Tensor | None = None,
    silenced: torch.Tensor | None = None,
    reweighted: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    none = torch.zeros_like(p.m)
    clip_mask = none if clip_mask is None else clip_mask
    dual_clip_mask = none if dual_clip_mask is None else dual_clip_mask
    pg = behaviour_weighted(pg, p)
    loss = aggregate(pg, p, loss_agg_mode)
    stats = base_stats(p, pg, clip_mask, dual_clip_mask)
    stats["silenced_mask"] = (none if silenced is None else silenced) & p.m
    stats["reweighted_mask"] = (none if reweighted is None else reweighted) & p.m
    if gate is not None:
        stats["gate"] = torch.where(p.m, gate.detach(), torch.zeros((), dtype=gate.dtype))
    return loss, stats


Shared = dict[str, Any]


def _shared(
    behave_imp_weight_mode: str,
    behave_imp_weight_cap: float | None,
    rejection_sampling: RejectionSampling | None,
    importance_sampling_level: str,
    loss_agg_mode: str,
) -> Shared:
    return dict(
        behave_imp_weight_mode=behave_imp_weight_mode,
        behave_imp_weight_cap=behave_imp_weight_cap,
        rejection_sampling=rejection_sampling,
        importance_sampling_level=importance_sampling_level,
        loss_agg_mode=loss_agg_mode,
    )


def cispo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ratio_max: float = 5.0,
    ratio_min: float | None = None,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    importance_sampling_level: str = "token",
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585 eq. 4): clip the importance weight, not the update.

        r̂ = clamp(r, ratio_min, ratio_max)            (ratio_min None = no floor, as in TRL)
        L = −sg(r̂)·A·ℓθ                               then ·w and ``loss_agg_mode``

    so every valid token with A ≠ 0 keeps a REINFORCE-style gradient r̂·A·∇ℓθ; the cap only
    re-weights it.  Matches TRL 1.16 ``loss_type="cispo"`` (``clamp(coef_1,
    max=epsilon_high).detach() * advantages * per_token_logps``, ε_max = ``epsilon_high`` an
    absolute bound on r, 5.0 recommended after ScaleRL arXiv 2510.13786); TRL always aggregates
    it like ``dapo`` (= ``token-mean`` here over one generation batch).  At sequence level r is
    GSPO's sequence ratio (TRL allows it too).  Stats: ``reweighted_mask`` = tokens whose weight was
    capped (TRL's ``cispo_clip_ratio`` counts only r > ε_max with A > 0), ``gate`` = r̂; no token is
    silenced and ``clip_mask`` is all False.
    """
    kw = _shared(
        behave_imp_weight_mode,
        behave_imp_weight_cap,
        rejection_sampling,
        importance_sampling_level,
        loss_agg_mode,
    )
    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    _common_checks(xs, **kw)
    validate_objective(
        "cispo", importance_sampling_level, cispo_ratio_max=ratio_max, cispo_ratio_min=ratio_min
    )
    if logprobs.dim() == 1:
        return one_row(cispo_loss, *xs, ratio_max=ratio_max, ratio_min=ratio_min, **kw)
    p = _prepare(*xs, kw)
    r = p.ratio.detach()
    r_hat = r.clamp(min=ratio_min, max=ratio_max)
    pg = -r_hat * p.adv * logprobs
    return _finish(p, pg, loss_agg_mode, reweighted=r_hat != r, gate=r_hat)


def sapo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    importance_sampling_level: str = "token",
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a smooth gate, no hard clip.

        τ = temperature_pos where A > 0, else temperature_neg
        L = −(4/τ)·σ(τ·(r − 1))·A                       then ·w and ``loss_agg_mode``

    dL/dr = −4σ(1−σ)·A: the gradient weight g = 4σ(1−σ) relative to the unclipped −A·r is exactly
    1 at r = 1 and decays smoothly (a soft trust region).  As τ → 0, L = −(2/τ)·A − (r − 1)·A +
    O(τ²): the unclipped objective plus a constant.  Matches TRL 1.16 ``loss_type="sapo"``
    (``sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures``, defaults τ+ 1.0 / τ− 1.05); TRL
    aggregates it like ``grpo`` (= ``seq-mean-token-mean`` here).  Stats: ``gate`` = g,
    ``reweighted_mask`` = tokens whose gradient the gate damped by more than half (g < 0.5, i.e.
    |τ(r − 1)| > 1.763); nothing is silenced.
    """
    kw = _shared(
        behave_imp_weight_mode,
        behave_imp_weight_cap,
        rejection_sampling,
        importance_sampling_level,
        loss_agg_mode,
    )
    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    _common_checks(xs, **kw)
    validate_objective(
        "sapo",
        importance_sampling_level,
        sapo_temperature_pos=temperature_pos,
        sapo_temperature_neg=temperature_neg,
    )
    if logprobs.dim() == 1:
        return one_row(
            sapo_loss,
            *xs,
            temperature_pos=temperature_pos,
            temperature_neg=temperature_neg,
            **kw,
        )
    p = _prepare(*xs, kw)
    tau = torch.full_like(p.ratio.detach(), temperature_neg).masked_fill(p.adv > 0, temperature_pos)
    s = torch.sigmoid(tau * (p.ratio - 1))
    pg = -(4 / tau) * s * p.adv
    g = (4 * s * (1 - s)).detach()
    return _finish(p, pg, loss_agg_mode, reweighted=g < 0.5, gate=g)


def gmpo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    log_clip: float = 0.4,
    log_clip_higher: float | None = None,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): the geometric mean of the
    token ratios of a sequence, each clipped sign-aware in log space.

        δ = ℓθ − ℓp;  s = sgn(A);  δ′ = s·min(s·δ, s·clamp(δ, −ε, ε_hi))   (ε_hi = ε if None)
        ρ_i = exp(mean_{t∈m′_i} δ′_t);  Ā_i = mean_{t∈m′_i} A_t
        L_t = −Ā_i·ρ_i on every valid token of sequence i      then ·w and ``loss_agg_mode``

    Matches verl ``loss_mode="geo_mean"`` (``compute_policy_loss_geo_mean``), which always takes
    the mean over sequences — ``seq-mean-token-mean`` here; ``token-mean`` weights each sequence by
    its length.  The paper's range is (−0.4, 0.4) in log space (verl reuses ``clip_ratio``).  With
    equal ratios and one advantage per sequence, GMPO equals token PPO-clip with
    ε = 1 − e^(−ε_log), ε_hi = e^(ε_log_hi) − 1.  Stats: ``clip_mask`` = valid tokens whose
    log-ratio clip binds (A > 0 and δ > ε_hi, or A < 0 and δ < −ε: their gradient is zero, so they
    are also ``silenced_mask``; verl's clipfrac counts every δ outside the range), ``gate`` = ρ_i.
    """
    kw = _shared(
        behave_imp_weight_mode, behave_imp_weight_cap, rejection_sampling, "token", loss_agg_mode
    )
    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    _common_checks(xs, **kw)
    validate_objective(
        "gmpo", "token", gmpo_log_clip=log_clip, gmpo_log_clip_higher=log_clip_higher
    )
    extra = dict(log_clip=log_clip, log_clip_higher=log_clip_higher)
    kw.pop("importance_sampling_level")
    if logprobs.dim() == 1:
        return one_row(gmpo_loss, *xs, **extra, **kw)
    p = _prepare(*xs, {**kw, "importance_sampling_level": "token"})
    hi = log_clip if log_clip_higher is None else log_clip_higher
    delta = p.log_ratio
    sgn = torch.sign(p.adv)
    delta_c = sgn * torch.minimum(sgn * delta, sgn * delta.clamp(-log_clip, hi))
    ml = p.m_loss
    n_i = ml.sum(dim=1, keepdim=True).clamp(min=1)
    rho = torch.exp(torch.where(ml, delta_c, p.zero).sum(dim=1, keepdim=True) / n_i)
    adv_i = (
        torch.where(ml, p.adv, torch.zeros((), dtype=p.adv.dtype)).sum(dim=1, keepdim=True) / n_i
    )
    pg = (-adv_i * rho).expand_as(delta)
    d = delta.detach()
    binds = ((p.adv > 0) & (d > hi)) | ((p.adv < 0) & (d < -log_clip))
    return _finish(
        p,
        pg,
        loss_agg_mode,
        clip_mask=binds,
        silenced=binds,
        gate=rho.expand_as(delta),
    )


def _covariance(p: PolicyInputs) -> torch.Tensor:
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


def _n_selected(ratio: float, n_valid: int) -> int:
    # verl: max(⌊ratio·n⌋, 1) with ratio > 0 required; ratio 0 here switches the selection off.
    if ratio <= 0 or n_valid == 0:
        return 0
    return max(int(ratio * n_valid), 1)


def clip_cov_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
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
    validate_clip_options(
        eps_clip,
        eps_clip_higher,
        c_clip,
        behave_imp_weight_mode,
        behave_imp_weight_cap,
        rejection_sampling,
        "token",
        loss_agg_mode,
    )
    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    _check_shapes(**dict(zip(_NAMES, xs, strict=True)))
    validate_objective(
        "clip_cov", "token", clip_cov_ratio=ratio, clip_cov_lb=cov_lb, clip_cov_ub=cov_ub
    )
    kw: dict[str, Any] = dict(
        eps_clip=eps_clip,
        eps_clip_higher=eps_clip_higher,
        c_clip=c_clip,
        ratio=ratio,
        cov_lb=cov_lb,
        cov_ub=cov_ub,
        generator=generator,
        behave_imp_weight_mode=behave_imp_weight_mode,
        behave_imp_weight_cap=behave_imp_weight_cap,
        rejection_sampling=rejection_sampling,
        loss_agg_mode=loss_agg_mode,
    )
    if logprobs.dim() == 1:
        return one_row(clip_cov_loss, *xs, **kw)
    if logprobs.dim() != 2:
        raise ValueError(f"expected [B, T] or [T] tensors; got {tuple(logprobs.shape)}")
    p = _prepare(
        *xs,
        dict(
            behave_imp_weight_mode=behave_imp_weight_mode,
            behave_imp_weight_cap=behave_imp_weight_cap,
            rejection_sampling=rejection_sampling,
            importance_sampling_level="token",
        ),
    )
    pg, clip_mask, dual_clip_mask = ppo_clip_terms(p, eps_clip, eps_clip_higher, c_clip)
    cov = _covariance(p)
    cand = p.m_loss & ~clip_mask & ~dual_clip_mask & (cov > cov_lb) & (cov < cov_ub)
    idx = torch.nonzero(cand.flatten()).flatten()
    k = min(_n_selected(ratio, int(p.m_loss.sum())), int(idx.numel()))
    cov_mask = torch.zeros_like(p.m)
    if k > 0:
        # The draw runs on the CPU generator of the run (determinism), then moves to the data.
        perm = torch.randperm(int(idx.numel()), generator=generator).to(idx.device)
        cov_mask.view(-1)[idx[perm[:k]]] = True
    pg = torch.where(cov_mask, pg * 0, pg)  # zero value and gradient (verl multiplies by 0)
    loss, stats = _finish(
        p,
        pg,
        loss_agg_mode,
        clip_mask=clip_mask,
        dual_clip_mask=dual_clip_mask,
        silenced=clip_mask | dual_clip_mask | cov_mask,
    )
    stats["cov_mask"] = cov_mask
    stats["cov_selected"] = float(k)
    stats["cov_candidates"] = float(idx.numel())
    stats["cov_threshold"] = float(cov[cov_mask].min()) if k > 0 else math.nan
    return loss, stats


def kl_cov_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ratio: float = 2e-4,
    coef: float = 1.0,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """KL-Cov (arXiv 2505.22617 §4.2): no clip; a KL penalty on the top-covariance tokens.

        L_t = −A_t·r_t                                  on every valid token
        L_t = −A_t·r_t + coef·|δ_t| on the k = max(⌊ratio·Σm⌋, 1) tokens with the largest cov_t
        (k = 0 when ratio = 0)                          then ·w and ``loss_agg_mode``

    Matches verl ``loss_mode="kl_cov"`` (``compute_policy_loss_kl_cov``, defaults ratio 2e-4,
    ``ppo_kl_coef`` 1).  Ties in cov are broken by ``torch.topk``.  Stats: ``cov_mask`` (=
    ``reweighted_mask``, the penalised tokens), floats ``cov_selected``, ``cov_threshold`` (the
    k-th largest covariance, NaN when k = 0) and ``cov_penalty_kl`` (mean |δ| on them).
    """
    kw = _shared(
        behave_imp_weight_mode, behave_imp_weight_cap, rejection_sampling, "token", loss_agg_mode
    )
    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    _common_checks(xs, **kw)
    validate_objective("kl_cov", "token", kl_cov_ratio=ratio, kl_cov_coef=coef)
    kw.pop("importance_sampling_level")
    if logprobs.dim() == 1:
        return one_row(kl_cov_loss, *xs, ratio=ratio, coef=coef, **kw)
    p = _prepare(*xs, {**kw, "importance_sampling_level": "token"})
    pg = -p.adv * p.ratio
    cov = _covariance(p)
    k = _n_selected(ratio, int(p.m_loss.sum()))
    cov_mask = torch.zeros_like(p.m)
    if k > 0:
        top = torch.topk(cov.flatten(), k).indices
        cov_mask.view(-1)[top] = True
    pg = torch.where(cov_mask, pg + coef * p.log_ratio.abs(), pg)
    loss, stats = _finish(p, pg, loss_agg_mode, reweighted=cov_mask)
    stats["cov_mask"] = cov_mask
    stats["cov_selected"] = float(k)
    stats["cov_threshold"] = float(cov[cov_mask].min()) if k > 0 else math.nan
    stats["cov_penalty_kl"] = (
        float(p.log_ratio.detach()[cov_mask].abs().mean()) if k > 0 else math.nan
    )
    return loss, stats


def objective_loss(
    cfg: Any,
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """The loss of ``cfg.policy_loss`` (a ``PPOActorConfig``) with its options from ``cfg``."""
    from harness.ppo.loss import ppo_actor_loss

    xs = (logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask)
    weighting: dict[str, Any] = dict(
        behave_imp_weight_mode=cfg.behave_imp_weight_mode,
        behave_imp_weight_cap=cfg.behave_imp_weight_cap,
        rejection_sampling=cfg.rejection_sampling,
        loss_agg_mode=cfg.loss_agg_mode,
    )
    name = cfg.policy_loss
    if name == "ppo":
        return ppo_actor_loss(
            *xs,
            eps_clip=cfg.eps_clip,
            eps_clip_higher=cfg.eps_clip_higher,
            c_clip=cfg.c_clip,
            importance_sampling_level=cfg.importance_sampling_level,
            **weighting,
        )
    if name == "cispo":
        return cispo_loss(
            *xs,
            ratio_max=cfg.cispo_ratio_max,
            ratio_min=cfg.cispo_ratio_min,
            importance_sampling_level=cfg.importance_sampling_level,
            **weighting,
        )
    if name == "sapo":
        return sapo_loss(
            *xs,
            temperature_pos=cfg.sapo_temperature_pos,
            temperature_neg=cfg.sapo_temperature_neg,
            importance_sampling_level=cfg.importance_sampling_level,
            **weighting,
        )
    if name == "gmpo":
        return gmpo_loss(
            *xs, log_clip=cfg.gmpo_log_clip, log_clip_higher=cfg.gmpo_log_clip_higher, **weighting
        )
    if name == "clip_cov":
        return clip_cov_loss(
            *xs,
            eps_clip=cfg.eps_clip,
            eps_clip_higher=cfg.eps_clip_higher,
            c_clip=cfg.c_clip,
            ratio=cfg.clip_cov_ratio,
            cov_lb=cfg.clip_cov_lb,
            cov_ub=cfg.clip_cov_ub,
            generator=generator,
            **weighting,
        )
    if name == "kl_cov":
        return kl_cov_loss(*xs, ratio=cfg.kl_cov_ratio, coef=cfg.kl_cov_coef, **weighting)
    raise ValueError(f"policy_loss must be one of {', '.join(POLICY_LOSSES)}; got {name!r}")
