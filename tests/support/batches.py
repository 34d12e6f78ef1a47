"""An update batch made from one rollout, for tests of the loss and its statistics."""

from __future__ import annotations

from typing import Any

import torch


def stale_update_batch(rb: Any) -> dict[str, torch.Tensor]:
    """The actor's update batch of rollout ``rb`` with stale behaviour log-probs (Gaussian noise
    of std 0.3 on the completion tokens, so the behaviour weights are not all 1) and uniform
    random rewards, both drawn from a generator seeded with 1."""
    g = torch.Generator().manual_seed(1)
    stale = rb.logprobs + rb.loss_mask * torch.randn(rb.logprobs.shape, generator=g) * 0.3
    return {
        "input_ids": rb.input_ids,
        "attention_mask": rb.attention_mask,
        "loss_mask": rb.loss_mask,
        "logprobs": stale,
        "rewards": torch.rand(rb.input_ids.shape[0], generator=g),
        "group_sizes": rb.group_sizes,
        "truncated": rb.truncated,
    }
