"""A PPO step's rollout: the behaviour policy samples, the task scores, dynamic sampling refills,
and the learner's view of the sampling weights is taken for the mismatch probe.

What comes out (:class:`Collected`) is everything the update and the step metrics need from the
rollout; the update batch is :attr:`Collected.train` (None when dynamic sampling left no group).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

import torch

from harness.run.dynamic_sampling import Refill, Round, refill, score_round
from harness.run.mismatch import mismatch_probe
from harness.run.policies import Policies
from harness.run.sampler import rollout_params
from harness.run.scaffold import Diverged, Run
from harness.sampling import NonFiniteLogits, Sampler
from harness.tasks import score_parts


@dataclass
class Collected:
    """One step's rollout: the first sampling round (the step's reward metrics are its), the
    dynamic-sampling outcome (None when off), ℓsnap for the mismatch probe (None unless the
    sampling weights were an older snapshot) and the policy version that sampled."""

    first: Round
    dyn: Refill | None
    snapshot: torch.Tensor | None
    version: int

    @property
    def train(self) -> Round | None:
        """The update batch: the first round, or what dynamic sampling kept (None: nothing)."""
        return self.dyn.train if self.dyn is not None else self.first

    @property
    def rounds(self) -> list[Round]:
        """Every round sampled this step (more than one only when dynamic sampling refilled)."""
        return self.dyn.rounds if self.dyn is not None else [self.first]

    @property
    def prompts(self) -> list[str]:
        """The prompt of every sampled completion, in row order, across all rounds."""
        return [e.prompt for r in self.rounds for e in r.per_row]


class Rollouts:
    """Draws and scores a run's rollouts: owns the prompt RNG and the sampling generator (both
    seeded with ``cfg.seed``, so a run's prompts and completions repeat) and the mismatch probe."""

    def __init__(self, run: Run, sampler: Sampler, amp: torch.dtype | None) -> None:
        self.cfg, self.task, self.tokenizer = run.cfg, run.task, run.tokenizer
        self.sampler = sampler
        self.device = run.device
        self.probe = mismatch_probe(run.cfg, run.device, amp)
        self.rng = random.Random(run.cfg.seed)
        self.gen = torch.Generator(device=run.device).manual_seed(run.cfg.seed)
        pad = run.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self.params = rollout_params(run.cfg)

    def collect(self, policies: Policies, step: int) -> Collected:
        """Sample this step's prompts under the behaviour snapshot, score them, refill
        zero-variance groups (``rollout.zero_variance_filter``) and take ℓsnap while the
        sampling weights are still loaded.  The sampler loads the behaviour weights once: the
        refill rounds sample the same version."""
        r = self.cfg.rollout
        examples = self.task.sample(self.rng, r.prompts_per_step)
        # The sampler runs at its own precision (rollout.sampler_dtype; run/sampler.py).
        with policies.behaviour() as b:
            self.sampler.load(b.module, b.version)
            first = self.draw(step, examples)
            dyn = None
            if r.zero_variance_filter:
                # Each extra round draws new prompts with the same behaviour weights.
                more = functools.partial(self.draw, step)
                dyn = refill(first, more, r.prompts_per_step, r.max_resample_rounds, self.pad_id)
            train = dyn.train if dyn is not None else first
            snapshot = (
                self.probe.snapshot(b.module, train.rb, stale=b.stale)
                if train is not None
                else None
            )
        return Collected(first, dyn, snapshot, b.version)

    def updated(self, model: Any, version: int) -> None:
        """After an update: nothing to hand over (the behaviour weights come from ``policies``)."""

    def step_metrics(self) -> dict[str, float]:
        """No metrics of its own (the asynchronous rollouts log ``async/*``)."""
        return {}

    def close(self) -> None:
        """Nothing to stop."""

    def draw(self, step: int, examples: list[Any] | None = None) -> Round:
        """One sampling round of the loaded weights, scored (new prompts unless ``examples``
        given)."""
        cfg = self.cfg
        if examples is None:
            examples = self.task.sample(self.rng, cfg.rollout.prompts_per_step)
        try:
            rb = self.sampler.generate(
                self.tokenizer, [e.prompt for e in examples], self.params, self.gen
            )
        except NonFiniteLogits as err:  # anything else sampling raises is an error
            raise Diverged(step, f"non-finite probabilities while sampling ({err})") from None
        if not torch.isfinite(rb.logprobs).all():
            raise Diverged(step, "non-finite behaviour log-probs in the rollout")
        # One deterministic score per completion (+ the overlong penalty).
        per_row = [e for e in examples for _ in range(cfg.rollout.n_samples)]
        parts = [score_parts(self.task, e, c) for e, c in zip(per_row, rb.completions, strict=True)]
        return score_round(
            Round(rb, per_row, parts), cfg.ppo, cfg.rollout.max_new_tokens, self.device
        )


__all__ = ["Collected", "Rollouts"]
