"""What every policy objective starts from: behaviour importance weights, the ratio (token or GSPO's
sequence ratio), the aggregation and the stats contract (the objectives: ``harness.ppo.objectives``).

Source: AReaL ``areal/utils/functional/functional.py`` (``ppo_actor_loss_fn``,
``apply_rejection_sampling``), main branch; legacy ``behave_imp_weight_mode`` from
v1.0.0.post1–v1.0.3.  ``docs/ppo-semantics.md`` "PPO actor loss".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from harness.ppo.corrections import (
    Correction,
    CorrectionResult,
    apply_correction,
    from_rejection_sampling,
)
from harness.ppo.masks import prompt_mean

BEHAVE_MODES = ("disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate")
IS_LEVELS = ("token", "sequence")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)
RS_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")


@dataclass(frozen=True)
class RejectionSampling:
    """Behaviour-policy importance weighting with AReaL v1.0.4+ semantics (``RejectionSamplingConfig``).

    The divergence between the proximal policy π_prox and the behaviour policy π_behave that
    sampled the data decides, per token or per sequence, whether a token stays in the loss
    (``action='mask'``) or how its weight w = π_prox/π_behave is truncated (``action='clamp'``).
    """

    level: Literal["token", "sequence"] = field(
        default="token", metadata={"help": "Granularity of the decision: 'token' or 'sequence'."}
    )
    action: Literal["mask", "clamp"] = field(
        default="mask",
        metadata={
            "help": "'mask' drops out-of-bounds tokens/sequences; 'clamp' truncates the weight."
        },
    )
    metric: Literal["ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl"] = field(
        default="ratio",
        metadata={"help": "Divergence between π_prox and π_behave that is bounded."},
    )
    agg: Literal["sum", "mean", "max"] = field(
        default="mean", metadata={"help": "Sequence-level aggregation of the metric."}
    )
    upper: float = field(
        default=5.0, metadata={"help": "Inclusive upper bound (metric <= upper passes)."}
    )
    lower: float | None = field(
        default=None,
        metadata={"help": "Inclusive lower bound; 'clamp' uses 0.0 when unset."},
    )

    def __post_init__(self) -> None:
        if self.level not in IS_LEVELS:
            raise ValueError(
                f"rejection_sampling.level must be one of 'token', 'sequence'; got {self.level!r}"
            )
        if self.action not in ("mask", "clamp"):
            raise ValueError(
                f"rejection_sampling.action must be one of 'mask', 'clamp'; got {self.action!r}"
            )
        if self.metric not in RS_METRICS:
            raise ValueError(
                f"rejection_sampling.metric must be one of {', '.join(RS_METRICS)}; got {self.metric!r}"
            )
        if self.agg not in ("sum", "mean", "max"):
            raise ValueError(
                f"rejection_sampling.agg must be one of 'sum', 'mean', 'max'; got {self.agg!r}"
            )
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError("rejection_sampling.action 'clamp' requires metric 'ratio'")
        if self.metric == "ratio":
            if not self.upper > 1.0:
                raise ValueError(
                    f"rejection_sampling.upper must be > 1 for metric 'ratio'; got {self.upper}"
                )
            if self.lower is not None and not self.lower > 0.0:
                raise ValueError(
                    f"rejection_sampling.lower must be > 0 for metric 'ratio'; got {self.lower}"
                )
        elif self.metric in ("kl_k2", "kl_k3", "binary_kl") and not self.upper > 0.0:
            raise ValueError(
                f"rejection_sampling.upper must be > 0 for metric {self.metric!r}; got {self.upper}"
            )
        if self.lower is not None and self.lower > self.upper:
            raise ValueError(
                f"rejection_sampling.lower ({self.lower}) must be <= upper ({self.upper})"
            )
        if self.level == "token" and self.agg != "mean":
            # A setting that cannot act is refused, not warned about (a grid over agg at token
            # level would give identical cells).
            raise ValueError(
                f"rejection_sampling.agg {self.agg!r} has no effect at level 'token'; leave agg "
                "at 'mean' or set level 'sequence'"
            )
        if self.action == "clamp" and self.lower is None:
            object.__setattr__(self, "lower", 0.0)


def validate_clip_options(
    eps_clip: float,
    eps_clip_higher: float | None,
    c_clip: float | None,
    behave_imp_weight_mode: str,
    behave_imp_weight_cap: float | None,
    rejection_sampling: RejectionSampling | None,
    importance_sampling_level: str,
    loss_agg_mode: str,
) -> None:
    """Raise ``ValueError`` naming the option and what is allowed (shared by the loss and configs)."""
    if not eps_clip > 0:
        raise ValueError(f"eps_clip must be > 0; got {eps_clip}")
    if eps_clip_higher is not None and eps_clip_higher < 0:
        raise ValueError(f"eps_clip_higher must be >= 0 or null; got {eps_clip_higher}")
    if c_clip is not None and not c_clip > 1:
        raise ValueError(f"c_clip must be > 1 or null; got {c_clip}")
    if behave_imp_weight_mode not in BEHAVE_MODES:
        raise ValueError(
            f"behave_imp_weight_mode must be one of {', '.join(BEHAVE_MODES)}; got {behave_imp_weight_mode!r}"
        )
    if behave_imp_weight_mode == "disabled":
        if behave_imp_weight_cap is not None:
            raise ValueError(
                "behave_imp_weight_cap must be null when behave_imp_weight_mode is 'disabled'; "
                f"got {behave_imp_weight_cap}"
            )
    elif behave_imp_weight_cap is not None and not behave_imp_weight_cap > 1:
        raise ValueError(f"behave_imp_weight_cap must be > 1 or null; got {behave_imp_weight_cap}")
    if rejection_sampling is not None and behave_imp_weight_mode != "disabled":
        raise ValueError(
            "give either rejection_sampling or behave_imp_weight_mode, not both "
            f"(behave_imp_weight_mode={behave_imp_weight_mode!r})"
        )
    if importance_sampling_level not in IS_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of 'token', 'sequence'; got {importance_sampling_level!r}"
        )
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}; got {loss_agg_mode!r}"
        )


def legacy_to_rejection_sampling(mode: str, cap: float | None) -> RejectionSampling | None:
    """AReaL's own migration of the v1.0.0.post1–v1.0.3 modes (a cap of None = no bound)."""
    if mode == "disabled":
        return None
    level, kind = mode.split("_")
    upper = math.inf if cap is None else float(cap)
    return RejectionSampling(
        level=level,  # type: ignore[arg-type]
        action="mask" if kind == "mask" else "clamp",
        metric="ratio",
        agg="mean",
        upper=upper,
    )


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    rs: RejectionSampling,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """AReaL's ``apply_rejection_sampling``: (narrowed mask m′, weight w, filtered fraction).

    ℓr = ℓp − ℓb (non-finite → 0); w = e^ℓr per token, or at sequence level with metric 'ratio'
    the sequence's geometric mean.  'mask' keeps a token iff lower ≤ metric ≤ upper; 'clamp'
    truncates w to [lower, upper].  w is 0 wherever m′ is 0.  Inputs carry no gradient.
    Evaluated by the general correction machinery (``harness.ppo.corrections``).
    """
    if rs.level == "sequence" and loss_mask.dim() != 2:
        raise ValueError("sequence-level rejection sampling needs [B, T] inputs")
    m = loss_mask.bool()
    if m.dim() == 1:
        new_mask, w, filtered = behaviour_weights(
            proximal_logprobs[None], old_logprobs[None], loss_mask[None], rs
        )
        return new_mask[0], w[0], filtered
    prox = proximal_logprobs.detach()
    res = apply_correction(
        from_rejection_sampling(rs), prox, prox, old_logprobs, torch.zeros_like(prox), m
    )
    assert res.w is not None
    masked, truncated = res.fractions(m)
    return res.mask, res.w, masked + truncated


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch: {shapes}")


@dataclass
class PolicyInputs:
    """What every policy objective starts from (built by ``prepare_policy_inputs``).

    ``m`` the loss mask, ``m_loss`` the mask the loss sums over (narrowed by rejection sampling),
    ``n0`` = max(Σm, 1), ``prox`` / ``adv`` detached (``adv`` replaced by the sequence mean at
    sequence level), ``log_ratio`` = ℓθ − ℓp (with gradient), ``ratio`` r on m (0 elsewhere; the
    GSPO sequence ratio at sequence level), ``w`` the behaviour weight or None, ``filtered`` its
    filtered fraction, ``old`` the behaviour log-probs, ``correction`` what the correction did
    (per-token masked / truncated, for the stats).
    """

    logprobs: torch.Tensor
    m: torch.Tensor
    m_loss: torch.Tensor
    n0: int
    prox: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    w: torch.Tensor | None
    filtered: float
    group_ids: torch.Tensor | None = None  # [B] prompt of each row ('prompt-mean' only)
    correction: CorrectionResult | None = None

    @property
    def zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=self.logprobs.dtype, device=self.logprobs.device)


def prepare_policy_inputs(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    behave_imp_weight_mode: str = "disabled",
    behave_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSampling | None = None,
    importance_sampling_level: str = "token",
    group_ids: torch.Tensor | None = None,
    correction: Correction | None = None,
) -> PolicyInputs:
    """Behaviour weights (rejection sampling or the legacy modes) and the policy ratio (token, or
    GSPO's sequence ratio) of [B, T] inputs — the part shared by every objective in
    ``harness.ppo.objectives``."""
    m = loss_mask.bool()
    n0 = max(int(m.sum()), 1)
    prox = proximal_logprobs.detach()
    adv = advantages.detach()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    # Behaviour weight: a correction, or rejection sampling / the legacy modes (particular
    # corrections).
    corr = correction
    if corr is None and rejection_sampling is not None:
        corr = from_rejection_sampling(rejection_sampling)
    elif corr is None and behave_imp_weight_mode != "disabled":
        legacy = legacy_to_rejection_sampling(behave_imp_weight_mode, behave_imp_weight_cap)
        assert legacy is not None
        corr = from_rejection_sampling(legacy, legacy=True)
    w: torch.Tensor | None = None
    filtered = 0.0
    m_loss = m
    result: CorrectionResult | None = None
    if corr is not None:
        result = apply_correction(corr, logprobs, prox, old_logprobs, adv, m)
        w, m_loss = result.w, result.mask
        masked, truncated = result.fractions(m)
        filtered = masked + truncated
        if corr.denominator == "post":  # verl: dropped tokens leave every denominator
            m = m_loss
            n0 = max(int(m.sum()), 1)

    log_ratio = logprobs - prox
    if importance_sampling_level == "token":
        ratio = torch.where(m, torch.exp(log_ratio), zero)
    else:
        n_i = m_loss.sum(dim=1, keepdim=True).clamp(min=1)
        seq_log_ratio = torch.where(m_loss, log_ratio, zero).sum(dim=1, keepdim=True) / n_i
        ratio = torch.where(m_loss, torch.exp(seq_log_ratio).expand_as(log_ratio), zero)
        seq_adv = (
            torch.where(m_loss, adv, torch.zeros((), dtype=adv.dtype)).sum(dim=1, keepdim=True)
            / n_i
        )
        adv = torch.where(m_loss, seq_adv.expand_as(adv), torch.zeros((), dtype=adv.dtype))
    return PolicyInputs(
        logprobs=logprobs,
        m=m,
        m_loss=m_loss,
        n0=n0,
        prox=prox,
        old=old_logprobs,
        adv=adv,
        log_ratio=log_ratio,
        ratio=ratio,
        w=w,
        filtered=filtered,
        group_ids=group_ids,
        correction=result,
    )


def behaviour_weighted(pg: torch.Tensor, p: PolicyInputs) -> torch.Tensor:
    """L·w when behaviour weighting is on (applied after every clip, as AReaL does)."""
    return pg * p.w if p.w is not None else pg


def aggregate(pg: torch.Tensor, p: PolicyInputs, loss_agg_mode: str) -> torch.Tensor:
    """Mask and ``loss_agg_mode`` (see ``ppo_actor_loss``): weighted per-token L → loss."""
    contrib = torch.where(p.m_loss, pg, p.zero)
    m = p.m
    if loss_agg_mode == "token-mean":
        return contrib.sum() / p.n0
    if loss_agg_mode == "prompt-mean":
        if p.group_ids is None:
            raise ValueError("loss_agg_mode 'prompt-mean' needs the rows' group_ids")
        return prompt_mean(contrib, m, p.group_ids)
    nonempty = m.any(dim=1)
    n_seq = max(int(nonempty.sum()), 1)
    per_seq = contrib.sum(dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(dim=1).clamp(min=1)
        return per_seq.sum() / n_seq
    if loss_agg_mode == "seq-mean-token-sum":
        return per_seq.sum() / n_seq
    return per_seq.sum() / (n_seq * m.shape[1])  # seq-mean-token-sum-norm


def base_stats(
    p: PolicyInputs,
    pg: torch.Tensor,
    clip_mask: torch.Tensor,
    dual_clip_mask: torch.Tensor,
) -> dict[str, torch.Tensor | float]:
    """The per-token stats contract every objective returns (see ``ppo_actor_loss``)."""
    # As AReaL main (docs/ppo-semantics.md, "Q8: clip and ratio statistics use the pre-filter
    # mask").
    stat_mask = p.m
    adv = p.adv
    stats: dict[str, torch.Tensor | float] = {
        "loss": pg.detach(),
        "importance_weight": p.ratio.detach(),
        "approx_kl": p.log_ratio.detach(),
        "clip_mask": clip_mask & stat_mask,
        "clip_low_mask": clip_mask & stat_mask & (adv < 0),
        "clip_high_mask": clip_mask & stat_mask & (adv > 0),
        "dual_clip_mask": dual_clip_mask & stat_mask,
    }
    if p.w is not None:
        w = p.w
        behave_mask = (w > 0) & p.m_loss
        stats["behave_imp_weight"] = w
        stats["behave_mask"] = behave_mask
        stats["behave_approx_kl"] = torch.where(
            behave_mask,
            (p.prox - p.old.detach()).float(),
            torch.zeros((), dtype=torch.float32),
        )
        stats["filtered_fraction"] = p.filtered
    if p.correction is not None:
        stats["correction_masked"] = p.correction.masked
        stats["correction_truncated"] = p.correction.truncated
        stats["correction_norm_factor"] = p.correction.norm_factor
    return stats


def one_row(
    fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor | float]]],
    *xs: torch.Tensor,
    **kw: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """Run a [B, T] objective on one [T] sequence; per-token stats come back as [T]."""
    loss, row_stats = fn(*(x[None] for x in xs), **kw)
    return loss, {
        k: (v[0] if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
        for k, v in row_stats.items()
    }
