"""AReaL's two spellings of the behaviour weight, and the ``Correction`` each one is.

``rejection_sampling`` (v1.0.4+, ``RejectionSampling``) and the legacy ``behave_imp_weight_mode``
/ ``behave_imp_weight_cap`` (v1.0.0.post1–v1.0.3) are options of the config and of the pure loss
functions; where those options are built they become one ``Correction``
(``behaviour_correction``), the only behaviour weight the loss reads.

Source: AReaL ``areal/utils/functional/functional.py`` (``apply_rejection_sampling``), main
branch; legacy ``behave_imp_weight_mode`` from v1.0.0.post1–v1.0.3.  ``docs/ppo-semantics.md``
"PPO actor loss".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from harness.core.configtools import checked
from harness.core.fields import meta, option
from harness.ppo.corrections.compute import apply_correction
from harness.ppo.corrections.spec import Correction, Filter

BehaveMode = Literal[
    "disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate"
]
BEHAVE_MODES: tuple[str, ...] = get_args(BehaveMode)
# ppo.behave_imp_weight_cap's declaration, also what a pure loss call's keyword is checked with.
BEHAVE_CAP = meta("Cap for the behaviour weight (> 1); null = no bound.", gt=1)


@dataclass(frozen=True)
@checked("rejection_sampling.")
class RejectionSampling:
    """Behaviour-policy importance weighting with AReaL v1.0.4+ semantics (``RejectionSamplingConfig``).

    The divergence between the proximal policy π_prox and the behaviour policy π_behave that
    sampled the data decides, per token or per sequence, whether a token stays in the loss
    (``action='mask'``) or how its weight w = π_prox/π_behave is truncated (``action='clamp'``).
    """

    level: Literal["token", "sequence"] = option(
        "token", "Granularity of the decision: 'token' or 'sequence'."
    )
    action: Literal["mask", "clamp"] = option(
        "mask", "'mask' drops out-of-bounds tokens/sequences; 'clamp' truncates the weight."
    )
    metric: Literal["ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl"] = option(
        "ratio", "Divergence between π_prox and π_behave that is bounded."
    )
    agg: Literal["sum", "mean", "max"] = option("mean", "Sequence-level aggregation of the metric.")
    upper: float = option(5.0, "Inclusive upper bound (metric <= upper passes).")
    lower: float | None = option(None, "Inclusive lower bound; 'clamp' uses 0.0 when unset.")

    def __post_init__(self) -> None:
        # The choices are checked from the Literal types (``checked``); the rest ties fields.
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


def legacy_to_rejection_sampling(mode: str, cap: float | None) -> RejectionSampling | None:
    """AReaL's own migration of the v1.0.0.post1–v1.0.3 modes (a cap of None = no bound)."""
    if mode == "disabled":
        return None
    level, kind = mode.split("_")
    rs = RejectionSampling(
        level=level,  # type: ignore[arg-type]
        action="mask" if kind == "mask" else "clamp",
        metric="ratio",
        agg="mean",
        upper=5.0 if cap is None else float(cap),
    )
    if cap is None:
        # No cap is an infinite upper bound, which the block's declaration (a finite number, as
        # a file must give it) refuses: set once the checks have passed (inf > 1 >= lower).
        object.__setattr__(rs, "upper", math.inf)
    return rs


_RS_METRIC = {
    "ratio": "ratio",
    "kl_k1": "k1",
    "kl_k2": "k2",
    "kl_k3": "k3",
    "binary_kl": "binary_kl",
}


def from_rejection_sampling(rs: RejectionSampling, *, legacy: bool = False) -> Correction:
    """AReaL's ``rejection_sampling`` as a correction: the weight is w per token (the sequence's
    geometric mean for sequence-level 'ratio'), always multiplied in; one filter with AReaL's KL
    direction; 'clamp' is a truncate filter.  ``legacy``: the v1.0.0.post1–v1.0.3 modes, which
    keep dropped tokens in the loss mask with weight 0."""
    seq_ratio = rs.level == "sequence" and rs.metric == "ratio"
    f = Filter(
        level=rs.level,
        metric=_RS_METRIC[rs.metric],  # type: ignore[arg-type]
        direction="ref_behave",
        agg=rs.agg,
        lower=rs.lower,
        upper=rs.upper,
        action="mask" if rs.action == "mask" else "truncate",
    )
    return Correction(
        weight="sequence_geometric" if seq_ratio else "token",
        filters=(f,),
        narrow_mask=not legacy,
    )


def behaviour_correction(
    behave_imp_weight_mode: str,
    behave_imp_weight_cap: float | None,
    rejection_sampling: RejectionSampling | None,
    correction: Correction | None,
) -> Correction | None:
    """The one behaviour weight of the loss: ``correction``, or ``rejection_sampling``, or the
    legacy mode, as the ``Correction`` it is (None: no weight).  The options were checked where
    they were given (at most one of the three is set)."""
    if correction is not None:
        return correction
    if rejection_sampling is not None:
        return from_rejection_sampling(rejection_sampling)
    legacy = legacy_to_rejection_sampling(behave_imp_weight_mode, behave_imp_weight_cap)
    return None if legacy is None else from_rejection_sampling(legacy, legacy=True)


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
