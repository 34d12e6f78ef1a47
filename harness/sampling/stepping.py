"""Step-level sampling: the contract asynchronous rollouts drive a backend through.

:class:`~harness.sampling.base.Sampler` samples a whole batch per call under one version. An
asynchronous run needs finer control: groups of ``n_samples`` sequences join between two decode
steps (:meth:`StepSampler.submit`), every :meth:`StepSampler.step` advances each running
sequence by one token and hands back the groups that finished, and new weights may arrive between
two steps (:meth:`StepSampler.load`), the running sequences continuing under them, with the KV
cache the old weights computed (``keep``) or re-prefilled under the new ones (``recompute``).

Every generated token is recorded with its behaviour log-prob at the moment it was sampled and
the version of the weights that sampled it (:class:`Finished`), so one sequence can span versions.
The local backend is :mod:`harness.sampling.local_steps`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from harness.sampling.base import Closing, RolloutBatch, SamplingParams
from harness.sampling.local import prepare_prompts


@dataclass
class Finished:
    """One finished group: its ``n_samples`` rows in token layout (``rb``, versions included),
    the caller's group id, and the sampler's version when the group was submitted."""

    gid: int
    rb: RolloutBatch
    submitted: int


class StepSampler(Closing, abc.ABC):
    """A backend driven one decode step at a time (module docstring). ``version`` is the version
    of the weights loaded; ``running`` the groups submitted and not yet finished."""

    def __init__(self) -> None:
        self.version = -1
        self.decode_steps = 0  # steps that advanced at least one sequence
        self.loads = 0

    @abc.abstractmethod
    def load(self, state: dict[str, torch.Tensor], version: int, *, recompute: bool) -> None:
        """Sample with ``state`` (parameter name → tensor; under LoRA only the adapters) from
        the next step on. Running sequences continue; with ``recompute`` their prompt and
        generated prefix are re-prefilled under the new weights, else their KV cache is kept."""

    @abc.abstractmethod
    def submit(self, prompts: list[str], gids: list[int]) -> None:
        """Start ``n_samples`` sequences for each prompt, group ``gids[i]`` for ``prompts[i]``;
        they are prefilled by the next :meth:`step`."""

    @abc.abstractmethod
    def step(self) -> list[Finished]:
        """One decode step of every running sequence; the groups it finished, in id order."""

    @property
    @abc.abstractmethod
    def running(self) -> int:
        """Groups submitted and not yet finished."""


@dataclass(frozen=True)
class StepSetup:
    """What a :class:`PolicyStepSampler` samples from: ``model``, its own copy of the policy
    (the weights :meth:`StepSampler.load` copies in), the ``tokenizer``, the ``params`` every
    group is sampled with, the run's sampling ``generator``, and ``sample_kw`` (EOS ids,
    truncation, positions, chat template)."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    params: SamplingParams
    generator: torch.Generator
    sample_kw: Mapping[str, Any] = field(default_factory=dict)


class PolicyStepSampler(StepSampler):
    """A step sampler over its own copy of the policy, set up by a :class:`StepSetup`: what the
    local (:mod:`harness.sampling.local_steps`) and the engine
    (:mod:`harness.sampling.vllm_steps`) step samplers share."""

    def __init__(self, setup: StepSetup) -> None:
        super().__init__()
        self.model, self.tokenizer, self.params = setup.model, setup.tokenizer, setup.params
        self.generator = setup.generator
        self.sample_kw = dict(setup.sample_kw)
        self.eos: torch.Tensor | None = None  # the EOS ids, once a group was submitted
        self.pad_id = 0

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """``prompts`` as a submission starts them: the left-padded ids and mask, each prompt
        repeated ``n_samples`` times, the EOS ids and the pad id
        (:func:`harness.sampling.local.prepare_prompts`)."""
        p = self.params
        return prepare_prompts(
            self.model, self.tokenizer, prompts, p.n_samples, p.max_new_tokens, **self.sample_kw
        )


__all__ = ["Finished", "PolicyStepSampler", "StepSampler", "StepSetup"]
