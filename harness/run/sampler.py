"""The rollout sampler as an interface: what produces the behaviour log-probs ℓb.

Everything downstream of sampling (rewards, advantages, the mismatch metrics, behaviour-weight
corrections) consumes a :class:`~harness.run.rollout.RolloutBatch` and never asks which sampler
made it. :class:`LocalSampler` is the in-process one (the KV-cache loop of
:func:`harness.run.rollout.sample`) with the three sources of training–inference mismatch the
harness can dial (``rollout.sampler_dtype``, ``rollout.sampler_logit_noise``,
``rollout.sampler_backend``; docs/mismatch.md). The vLLM inference engine
(:mod:`harness.run.engine`, ``sampler_backend: vllm``) is another implementation of
:class:`Sampler`: it takes the policy's weights, and returns the batch in token layout with its
own log-probs in ``logprobs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from harness.core.configtools import check_value
from harness.model.build import precision
from harness.model.engine_support import SamplerDtype
from harness.run.engine import engine_sampler
from harness.run.rollout import RolloutBatch, sample

if TYPE_CHECKING:
    from harness.config import RunConfig

# The noise stream's seed is the run seed shifted by this, so it never coincides with the
# sampling generator's stream (seeded with the run seed itself).
NOISE_SEED_OFFSET = 0x6E015E

_DTYPES: dict[str, torch.dtype | None] = {
    "float32": None,  # autocast off
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class Sampler(Protocol):
    """Samples ``n_samples`` completions per prompt from ``model`` and records their log-probs."""

    def sample(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[str],
        *,
        n_samples: int,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float,
        top_p: float,
    ) -> RolloutBatch: ...


def sampler_autocast(name: str | None, learner: torch.dtype | None) -> torch.dtype | None:
    """The sampler's autocast dtype: ``rollout.sampler_dtype`` (None = the learner's ``learner``
    autocast dtype; ``"float32"`` = autocast off)."""
    if name is None:
        return learner
    return _DTYPES[check_value(name, SamplerDtype, {}, "rollout.sampler_dtype")]


@dataclass
class LocalSampler:
    """The in-process sampler: :func:`harness.run.rollout.sample` under ``torch.autocast(dtype)``
    (None = float32), decoded by ``backend``, with ``logit_noise`` σ from ``noise_generator``."""

    device: torch.device
    dtype: torch.dtype | None = None
    backend: str = "auto"
    logit_noise: float = 0.0
    noise_generator: torch.Generator | None = None
    sample_kw: dict[str, Any] = field(default_factory=dict)  # EOS ids, truncation, template

    def sample(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[str],
        *,
        n_samples: int,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float,
        top_p: float,
    ) -> RolloutBatch:
        with precision(self.device, self.dtype):
            return sample(
                model,
                tokenizer,
                prompts,
                n_samples=n_samples,
                max_new_tokens=max_new_tokens,
                generator=generator,
                temperature=temperature,
                top_p=top_p,
                backend=self.backend,
                logit_noise=self.logit_noise,
                noise_generator=self.noise_generator,
                **self.sample_kw,
            )


def local_sampler(
    cfg: RunConfig,
    device: torch.device,
    learner: torch.dtype | None,
    sample_kw: dict[str, Any],
) -> LocalSampler:
    """The run's sampler as ``cfg.rollout`` configures it (``learner``: the learner's autocast)."""
    r = cfg.rollout
    noise_gen = None
    if r.sampler_logit_noise > 0:
        noise_gen = torch.Generator(device=device).manual_seed(
            (cfg.seed + NOISE_SEED_OFFSET) % 2**63
        )
    return LocalSampler(
        device=device,
        dtype=sampler_autocast(r.sampler_dtype, learner),
        backend=r.sampler_backend,
        logit_noise=r.sampler_logit_noise,
        noise_generator=noise_gen,
        sample_kw=dict(sample_kw),
    )


def build_sampler(
    cfg: RunConfig,
    device: torch.device,
    learner: torch.dtype | None,
    sample_kw: dict[str, Any],
) -> Sampler:
    """The run's sampler: the inference engine for ``rollout.sampler_backend: vllm``
    (:mod:`harness.run.engine`, started at the first rollout), else the local one."""
    if cfg.rollout.sampler_backend == "vllm":
        return engine_sampler(cfg, device, sample_kw)
    return local_sampler(cfg, device, learner, sample_kw)


__all__ = ["LocalSampler", "Sampler", "build_sampler", "local_sampler", "sampler_autocast"]
