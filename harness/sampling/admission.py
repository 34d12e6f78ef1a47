"""The arithmetic of asynchronous rollouts, as pure functions: AReaL's admission rule (how many
groups the sampler may start) and the per-token lag statistics a step logs.

Units are groups (one prompt's ``n_samples`` sequences), as AReaL counts rollouts; ``batch`` is
the groups one training step consumes (``rollout.prompts_per_step``).
"""

from __future__ import annotations

import math

import torch


def capacity(
    *,
    accepted: int,
    running: int,
    version: int,
    max_staleness: int,
    batch: int,
    extra: int = 0,
    max_concurrent: int | None = None,
) -> int:
    """How many groups may be submitted now (never negative).

        capacity = min((η + v + 1)·B + extra − (accepted + running),  max_concurrent − running)

    with ``accepted`` the groups finished so far (cumulative, consumed ones included),
    ``running`` those in flight, v the published version (updates the sampler has been given),
    η ``max_staleness`` and B ``batch``. AReaL ``areal/core/staleness_manager.py``
    (``StalenessManager.get_capacity``). Why it bounds the lag: the k-th group submitted (from 0)
    is consumed by training step ⌊k/B⌋ when steps take groups in submission order, and it was
    submitted only while k < (η + v + 1)·B, so that step runs at most η updates after v.
    ``extra`` (partial rollouts' over-sampling, ``(over_sample − 1)·B``) admits that many more
    groups, whose sequences may then lag further (docs/async.md)."""
    room = (max_staleness + version + 1) * batch + extra - (accepted + running)
    if max_concurrent is not None:
        room = min(room, max_concurrent - running)
    return max(room, 0)


def over_sampled(over_sample: float, batch: int) -> int:
    """The groups partial rollouts keep in flight beyond one step's: ⌈(over_sample − 1)·B⌉."""
    return math.ceil((over_sample - 1.0) * batch - 1e-9)


def lag_stats(versions: torch.Tensor, mask: torch.Tensor, learner_version: int) -> dict[str, float]:
    """Per-token lag of a consumed batch: ``learner_version`` (updates made when the step takes
    the batch) minus the version that sampled each generated token (``mask``).

    ``async/token_lag_mean`` and ``async/token_lag_max`` over the generated tokens;
    ``async/mixed_version_fraction``: the share of rows whose generated tokens span two versions
    or more (in-flight weight updates); 0 for a batch without generated tokens."""
    m = mask.bool()
    if not bool(m.any()):
        return {
            "async/token_lag_mean": 0.0,
            "async/token_lag_max": 0.0,
            "async/mixed_version_fraction": 0.0,
        }
    v = versions.long()
    lag = (learner_version - v)[m].double()
    big = torch.iinfo(torch.long).max
    hi = torch.where(m, v, -1).max(dim=-1).values
    lo = torch.where(m, v, big).min(dim=-1).values
    has = m.any(dim=-1)
    mixed = (hi != lo) & has
    return {
        "async/token_lag_mean": float(lag.mean()),
        "async/token_lag_max": float(lag.max()),
        "async/mixed_version_fraction": float(mixed.sum()) / max(int(has.sum()), 1),
    }


__all__ = ["capacity", "lag_stats", "over_sampled"]
