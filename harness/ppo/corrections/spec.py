"""The correction block ``ppo.correction``: one behaviour weight and a list of filters.

Every training–inference-mismatch correction the peers ship (TRL's ``vllm_importance_sampling_*``
and ``off_policy_mask_threshold``, verl's ``algorithm.rollout_correction``, SkyRL's
``off_policy_correction``, AReaL's ``rejection_sampling`` and legacy ``behave_imp_weight_mode``)
is one setting of these two dataclasses; ``harness.ppo.corrections.compute`` evaluates them and
the named presets (``ppo.correction: token_tis``) expand to them.  Notation: ℓθ current (with
gradient), ℓp proximal, ℓb behaviour (sampler) log-probs; the reference ℓr of a weight or a
filter is ℓp, or sg(ℓθ) under ``bypass`` / ``reference: current``; log w = ℓr − ℓb (non-finite →
0, so a NaN sampler log-prob gives w = 1, as TRL and verl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from harness.core.configtools import checked
from harness.core.fields import option

Weight = Literal["none", "token", "sequence_product", "sequence_geometric"]
WEIGHTS: tuple[str, ...] = get_args(Weight)


@dataclass(frozen=True)
@checked("filters[].")
class Filter:
    """One rejection filter: a token (or its whole sequence) leaves the loss unless
    lower ≤ statistic ≤ upper.  Filters are combined with AND."""

    level: Literal["token", "segment", "sequence"] = option(
        "token",
        "'token': each token on its own; 'segment': the aggregate over each run of consecutive "
        "valid tokens of a row decides for that run (ROLL's agg_type segment); 'sequence': the "
        "row's aggregate decides.",
    )
    metric: Literal[
        "ratio", "k1", "k2", "k3", "binary_kl", "binary_kl_directed", "tv", "prob_diff"
    ] = option(
        "ratio",
        "The statistic, with u the ratio of the KL direction: 'ratio' w = π_r/π_b (aggregated "
        "in log space: sum = the product, mean = the geometric mean); 'k1' −log u; 'k2' "
        "½(log u)²; 'k3' u − 1 − log u; 'binary_kl' the larger Bernoulli KL of the token's "
        "probabilities; 'binary_kl_directed' the Bernoulli KL in the KL direction "
        "(behave_ref: KL(Bern(p_b)‖Bern(p_r)), OpenRLHF's binary_kl); 'tv' abs(p_r − p_b) "
        "(OpenRLHF's tv); 'prob_diff' the signed p_r − p_b (ROLL's infer_diff band); p = the "
        "sampled token's probability.",
    )
    direction: Literal["behave_ref", "ref_behave"] = option(
        "behave_ref",
        "KL direction of k1/k3/binary_kl_directed: 'behave_ref' estimates KL(π_b‖π_r), u = w "
        "(verl: k1 = ℓb − ℓr, k3 = w − 1 − log w); 'ref_behave' u = 1/w (AReaL's kl_k1 = ℓr − "
        "ℓb, kl_k3 = 1/w − 1 + log w).",
    )
    agg: Literal["sum", "mean", "max", "min"] = option(
        "mean",
        "Sequence and segment level: sum, mean (over the row's, or the run's, valid tokens), "
        "max or min of the metric.",
    )
    lower: float | None = option(None, "Inclusive lower bound; null = none.", inf="no bound")
    upper: float | None = option(None, "Inclusive upper bound; null = none.", inf="no bound")
    reference: Literal["proximal", "current"] = option(
        "proximal",
        "ℓr: 'proximal' ℓp (decoupled PPO's recomputed log-probs), 'current' sg(ℓθ) per "
        "micro-batch (verl bypass, DeepSeek-V3.2's off-policy mask).",
    )
    negative_advantage_only: bool = option(
        False,
        "Only rows (tokens at token level) with A < 0 can be dropped (DeepSeek-V3.2, TRL "
        "off_policy_mask_threshold); the sign of a row is that of its mean advantage.",
    )
    action: Literal["mask", "truncate"] = option(
        "mask",
        "'mask' drops what fails; 'truncate' keeps it and truncates its weight to [lower (0 if "
        "null), upper] instead (AReaL rejection_sampling action 'clamp'; metric 'ratio' only).",
    )

    def __post_init__(self) -> None:
        if self.lower is None and self.upper is None:
            raise ValueError("filters[].lower / upper: give at least one bound")
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise ValueError(f"filters[].lower ({self.lower}) must be <= upper ({self.upper})")
        if self.metric == "ratio" and self.lower is not None and not self.lower >= 0:
            raise ValueError(f"filters[].lower must be >= 0 for metric 'ratio'; got {self.lower}")
        if self.action == "truncate" and self.metric != "ratio":
            raise ValueError("filters[].action 'truncate' requires metric 'ratio'")


@dataclass(frozen=True)
@checked()
class Correction:
    """Behaviour weight ρ (times every objective's per-token loss, after its clip) and filters
    (narrowing the loss mask), evaluated inside the loss per micro-batch."""

    weight: Weight = option(
        "none",
        "ρ: 'none' (1), 'token' w_t, 'sequence_product' exp(Σ_t log w) (TRL/verl/SkyRL "
        "sequence IS), 'sequence_geometric' exp(mean_t log w) (AReaL sequence level); sequence "
        "weights are broadcast to the row's tokens.",
    )
    clip_min: float | None = option(None, "Lower bound C_min on ρ; null = none.", ge=0)
    clip_max: float | None = option(
        None, "Upper bound C_max on ρ (TIS); null = none.", gt=0, inf="no bound"
    )
    zero_outside: bool = option(
        False,
        "false: truncate ρ to [C_min, C_max] (TIS); true: ρ = 0 outside [C_min, C_max], bounds "
        "kept (TRL *_mask, verl IcePop 'lo_hi').",
    )
    log_clamp: float | None = option(
        None,
        "Clamp log ρ (the row sum for sequence_product) to ±log_clamp before exp (verl and "
        "SkyRL: 20); null = none (TRL).",
        gt=0,
    )
    batch_normalize: bool = option(
        False,
        "ρ ← ρ / ρ̄ after clipping, with verl's rollout_is_batch_normalize mean over the "
        "micro-batch, its epsilons included: token weights Σρ/(n + 1e-8) over valid tokens "
        "(Σρ/n under bypass); sequence weights the mean over non-empty rows of each row's "
        "Σρ/(n_i + 1e-8); skipped unless ρ̄ > 1e-8.",
    )
    filters: tuple[Filter, ...] = option((), "Rejection filters, combined with AND (see Filter).")
    sequential: bool = option(
        False,
        "false: every filter and the sequence weight see the caller's mask (verl); true: each "
        "sees the mask narrowed by the filters before it (SkyRL's fixed order).",
    )
    denominator: Literal["pre", "post", "roll"] = option(
        "pre",
        "'pre': dropped tokens stay in the loss_agg_mode denominators (AReaL, TRL, SkyRL); "
        "'post': they leave them (verl decoupled rollout_rs); 'roll': ROLL's loss-side "
        "filter: a row's token mean is over its kept tokens (n′ + 1e-8) while the rows of the "
        "seq-mean modes (G + 1e-8) and token-mean's tokens are counted before the filter, so "
        "an emptied row still counts (harness.ppo.corrections.roll).",
    )
    bypass: bool = option(
        False,
        "verl bypass_mode: no proximal recompute (needs use_decoupled_loss and "
        "recompute_logprob false, so the ratio is against ℓb); ρ and every filter use sg(ℓθ) "
        "as the reference.",
    )
    narrow_mask: bool = option(
        True,
        "false: dropped tokens keep their place in the loss mask with ρ = 0 (AReaL's legacy "
        "behave_imp_weight_mode; only GSPO's sequence means can tell).",
    )

    def __post_init__(self) -> None:
        lo, hi = self.clip_min, self.clip_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"clip_min ({lo}) must be <= clip_max ({hi})")
        if self.weight == "none" and (lo is not None or hi is not None or self.zero_outside):
            raise ValueError(
                "clip_min / clip_max / zero_outside need a weight: set weight to one of "
                f"{', '.join(w for w in WEIGHTS if w != 'none')} (it is 'none')"
            )
        if self.zero_outside and lo is None and hi is None:
            raise ValueError("zero_outside needs clip_min or clip_max")
        if self.weight == "none" and self.batch_normalize:
            raise ValueError(
                "batch_normalize needs a weight: set weight to one of "
                f"{', '.join(w for w in WEIGHTS if w != 'none')} (it is 'none')"
            )
        if self.weight == "none" and not self.filters and not self.bypass:
            raise ValueError(
                "an empty correction: give a weight, filters or bypass (or leave ppo.correction "
                "null)"
            )

    def references(self) -> set[str]:
        """The log-prob references it reads (``proximal`` only matters with a recompute)."""
        refs = {"current" if self.bypass else "proximal"} if self.weight != "none" else set()
        refs |= {"current" if self.bypass else f.reference for f in self.filters}
        return refs
