"""Reward-side stability options as pure functions (``docs/ppo-semantics.md`` "Stability
options"): DAPO's soft overlong punishment and the zero-variance group test of dynamic sampling."""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_new_tokens: int, overlong_tokens: int, factor: float
) -> torch.Tensor:
    """AReaL's ``overlong_reward_penalty`` (DAPO's soft overlong punishment, scaled by f):

        penalty = min(−(|y| − (L_max − L_c)) / L_c · f, 0)

    with |y| the generated tokens (EOS included), L_max = ``max_new_tokens``, L_c =
    ``overlong_tokens``: 0 up to L_max − L_c, falling linearly to −f at L_max.  Added to the task
    reward before ``reward_bias``, ``reward_scaling``, ``reward_clip`` and ``reward_norm``."""
    if not 0 < overlong_tokens <= max_new_tokens:
        raise ValueError(
            f"overlong_tokens must be in [1, max_new_tokens={max_new_tokens}]; got {overlong_tokens}"
        )
    excess = lengths.float() - (max_new_tokens - overlong_tokens)
    return torch.clamp(-excess / overlong_tokens * factor, max=0.0)


def zero_variance_groups(rewards: torch.Tensor, group_sizes: list[int]) -> torch.Tensor:
    """[G] bool: the groups (consecutive rows, ``group_sizes``) of more than one row whose rewards
    are all equal (max == min: DAPO / verl ``filter_groups``' std == 0).  A group of one row has
    no variance to lose and is kept, as in verl and SkyRL."""
    out = []
    start = 0
    for n in group_sizes:
        g = rewards[start : start + n]
        out.append(n > 1 and bool(g.max() == g.min()))
        start += n
    return torch.tensor(out, dtype=torch.bool)
