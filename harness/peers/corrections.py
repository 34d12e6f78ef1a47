"""A correction in TRL's and verl's own settings, and what each cannot express.

TRL 1.16 ``GRPOConfig``: ``vllm_importance_sampling_{correction,mode,clip_min,clip_max}`` (ρ, only
with a vLLM sampler) and ``off_policy_mask_threshold`` (DeepSeek-V3.2's mask).  verl
``algorithm.rollout_correction``: ``rollout_is``, ``rollout_is_threshold``,
``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``, ``bypass_mode``.
Each function returns (settings, problems): a problem is (our field, why) and the setting it
concerns is left out, never approximated silently.
"""

from __future__ import annotations

import math
from typing import Any

from harness.ppo.corrections.spec import Correction, Filter

Problems = list[tuple[str, str]]

F = "ppo.correction"


def _num(x: float) -> str:
    """A bound as verl's "lo_hi" string reads it back (shortest round-trip repr)."""
    return repr(float(x))


def is_opsm(f: Filter) -> bool:
    """DeepSeek-V3.2's off-policy sequence mask: mean_t(ℓb − sg(ℓθ)) ≤ δ unless A ≥ 0."""
    return (
        f.level == "sequence"
        and f.metric == "k1"
        and f.direction == "behave_ref"
        and f.agg == "mean"
        and f.lower is None
        and f.upper is not None
        and f.reference == "current"
        and f.negative_advantage_only
        and f.action == "mask"
    )


def trl_settings(c: Correction) -> tuple[dict[str, Any], Problems]:
    """TRL ``GRPOConfig`` keyword arguments for ``c``."""
    kw: dict[str, Any] = {}
    problems: Problems = []
    if c.bypass:
        problems.append((f"{F}.bypass", "TRL always takes the old policy from a training forward"))
    for i, f in enumerate(c.filters):
        if is_opsm(f):
            kw["off_policy_mask_threshold"] = f.upper
        else:
            problems.append(
                (
                    f"{F}.filters[{i}]",
                    "TRL's only filter is off_policy_mask_threshold (sequence k1 mean against "
                    "sg(ℓθ), A < 0 rows only)",
                )
            )
    if c.weight == "none":
        return kw, problems
    if c.weight == "sequence_geometric":
        problems.append((f"{F}.weight", "TRL's sequence weight is the product, not the mean"))
        return kw, problems
    if c.batch_normalize:
        problems.append((f"{F}.batch_normalize", "TRL does not normalize the IS weights"))
    if c.log_clamp is not None and c.log_clamp < 20 and c.clip_max is None:
        problems.append((f"{F}.log_clamp", "TRL does not clamp log ρ"))
    level = "token" if c.weight == "token" else "sequence"
    if c.clip_min is None and c.clip_max is None:
        problems.append((f"{F}.clip_max", "TRL's *_truncate modes need at least one bound"))
        return kw, problems
    kw["vllm_importance_sampling_correction"] = True
    kw["vllm_importance_sampling_mode"] = f"{level}_{'mask' if c.zero_outside else 'truncate'}"
    kw["vllm_importance_sampling_clip_min"] = c.clip_min
    kw["vllm_importance_sampling_clip_max"] = c.clip_max
    return kw, problems


_VERL_AGG = {"sum": "seq_sum", "mean": "seq_mean", "max": "seq_max"}


def _verl_rs(f: Filter, i: int, bypass: bool) -> tuple[tuple[str, Any] | None, str | None]:
    """(option, threshold) for one filter, or (None, why)."""
    if f.action != "mask":
        return None, "verl's rollout_rs only masks (no truncation)"
    if f.negative_advantage_only:
        return None, "verl's rollout_rs has no advantage-sign condition"
    if f.reference == "current" and not bypass:
        return None, "verl judges against sg(ℓθ) only in bypass_mode"
    if f.level == "segment":
        return None, "verl's rollout_rs aggregates per token or per sequence, not per segment"
    level = "token" if f.level == "token" else _VERL_AGG.get(f.agg)
    if level is None:
        return None, "verl's rollout_rs has no min aggregation"
    if f.metric in ("binary_kl", "binary_kl_directed", "tv", "prob_diff"):
        return None, f"verl's rollout_rs has no {f.metric} (it filters on log-ratios only)"
    lo, hi = f.lower, f.upper
    if f.metric in ("ratio", "k1"):
        if f.agg == "max" and f.level == "sequence":
            return None, "verl has no seq_max_k1"
        if lo is None or hi is None or math.isinf(hi):
            return None, "verl's k1 filters are two-sided: give finite lower and upper"
        if f.metric == "ratio":  # w ∈ [a, b] ⟺ k1 = −log w ∈ [log 1/b, log 1/a]
            if lo <= 0:
                return None, "a ratio lower bound of 0 has no k1 equivalent"
            return (f"{level}_k1", f"{_num(1 / hi)}_{_num(1 / lo)}"), None
        if f.direction != "behave_ref":
            lo, hi = -hi, -lo  # AReaL's k1 = −(verl's k1)
        return (f"{level}_k1", f"{_num(math.exp(lo))}_{_num(math.exp(hi))}"), None
    if f.metric == "k3" and f.direction != "behave_ref":
        return None, "verl's k3 is w − 1 − log w (direction behave_ref)"
    if lo is not None and lo > 0 or hi is None:
        return None, f"verl's {f.metric} filters take an upper bound only"
    return (f"{level}_{f.metric}", hi), None


def verl_settings(
    c: Correction | None, policy_loss: str = "ppo"
) -> tuple[list[tuple[str, Any]], Problems]:
    """``algorithm.rollout_correction.*`` overrides for ``c`` (verl's rollout_is thresholds and
    rollout_rs lists are strings: they are returned as ``str``)."""
    kv: list[tuple[str, Any]] = []
    problems: Problems = []
    if c is None:
        return kv, problems
    if c.bypass:
        _verl_bypass(c, policy_loss, kv, problems)
    _verl_weight(c, kv, problems)
    _verl_filters(c, kv, problems)
    if not c.narrow_mask:
        problems.append((f"{F}.narrow_mask", "verl always narrows the mask"))
    return kv, problems


_A = "algorithm.rollout_correction"


def _verl_bypass(
    c: Correction, policy_loss: str, kv: list[tuple[str, Any]], problems: Problems
) -> None:
    """verl's bypass mode and its loss, appended to ``kv`` and ``problems``."""
    kv.append((f"{_A}.bypass_mode", True))
    # verl's bypass_mode loss dispatches on rollout_correction.loss_type: PPO-clip (no IS
    # weight) or REINFORCE −A·sg(ρ)·ℓθ; no other objective runs there.
    if policy_loss == "reinforce":
        kv.append((f"{_A}.loss_type", "reinforce"))
    elif policy_loss == "ppo":
        kv.append((f"{_A}.loss_type", "ppo_clip"))
        if c.weight != "none":
            problems.append(
                (f"{F}.weight", "verl's bypass ppo_clip applies no IS weight (use weight none)")
            )
    else:
        problems.append(
            (
                f"{F}.bypass",
                f"verl's bypass_mode loss is ppo_clip or reinforce, not {policy_loss} (cispo "
                "with ratio_max C and no weight is policy_loss reinforce with {weight: token, "
                "clip_max: C, log_clamp: 20})",
            )
        )


def _verl_weight(c: Correction, kv: list[tuple[str, Any]], problems: Problems) -> None:
    """verl's rollout_is (the IS weight and its threshold), appended to ``kv`` and ``problems``."""
    if c.weight == "sequence_geometric":
        problems.append(
            (f"{F}.weight", "verl's rollout_is is per token or the row's product (not the mean)")
        )
        return
    if c.weight == "none":
        return
    kv.append((f"{_A}.rollout_is", "token" if c.weight == "token" else "sequence"))
    if c.zero_outside:
        if c.clip_min is None or c.clip_max is None or c.clip_min <= 0:
            problems.append((f"{F}.clip_min", "verl's IcePop needs both bounds, 0 < lo <= hi"))
        else:
            kv.append((f"{_A}.rollout_is_threshold", f"{_num(c.clip_min)}_{_num(c.clip_max)}"))
    elif c.clip_min is not None:
        problems.append((f"{F}.clip_min", "verl's TIS has no lower bound"))
    elif c.clip_max is None:
        problems.append((f"{F}.clip_max", "verl's rollout_is always truncates at a threshold"))
    else:
        kv.append((f"{_A}.rollout_is_threshold", c.clip_max))
    if c.log_clamp != 20.0:
        problems.append((f"{F}.log_clamp", "verl always clamps log ρ to ±20; set 20"))
    if c.batch_normalize:
        kv.append((f"{_A}.rollout_is_batch_normalize", True))


def _verl_filters(c: Correction, kv: list[tuple[str, Any]], problems: Problems) -> None:
    """verl's rollout_rs (the filters and their thresholds), appended to ``kv`` and
    ``problems``."""
    options: list[str] = []
    thresholds: list[Any] = []
    for i, f in enumerate(c.filters):
        got, why = _verl_rs(f, i, c.bypass)
        if got is None:
            problems.append((f"{F}.filters[{i}]", str(why)))
            continue
        options.append(got[0])
        thresholds.append(got[1])
    if not options:
        return
    kv.append((f"{_A}.rollout_rs", ",".join(options)))
    same = all(t == thresholds[0] for t in thresholds)
    kv.append(
        (
            f"{_A}.rollout_rs_threshold",
            thresholds[0] if same else ",".join(str(t) for t in thresholds),
        )
    )
    if c.sequential and len(options) > 1:
        problems.append((f"{F}.sequential", "verl evaluates every filter on the caller's mask"))
    verl_denominator = "pre" if c.bypass else "post"
    if c.denominator != verl_denominator:
        problems.append(
            (
                f"{F}.denominator",
                f"verl's rollout_rs denominators are {verl_denominator}-filter "
                f"{'in bypass mode' if c.bypass else 'in decoupled mode'}",
            )
        )
