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
from dataclasses import dataclass

import torch

from harness.sampling.base import Closing, RolloutBatch


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


__all__ = ["Finished", "StepSampler"]
