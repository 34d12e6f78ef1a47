"""Drawing one rollout from a sampler backend the way the loop does: load the weights (copied in
only when ``version`` changed), then generate."""

from __future__ import annotations

from typing import Any

import torch

from harness.sampling import RolloutBatch, Sampler, SamplingParams


def draw(
    sampler: Sampler,
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    generator: torch.Generator,
    version: int = 0,
    **params: Any,
) -> RolloutBatch:
    sampler.load(model, version)
    return sampler.generate(tokenizer, prompts, SamplingParams(**params), generator)
