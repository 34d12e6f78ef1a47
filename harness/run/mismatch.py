"""Measuring the training–inference mismatch of a rollout: the learner-precision forwards the
metrics of :mod:`harness.metrics.mismatch` compare the sampler's log-probs against.

Which forwards a step needs (all no-grad, at the learner's precision, ``model_options.dtype``):

* ℓcur, the learner at the current weights: the actor's own recompute when it does one
  (``ppo.use_decoupled_loss`` or ``ppo.recompute_logprob``: its proximal log-probs are exactly
  this forward, over the whole batch); otherwise the update's first forward, on its first
  minibatch before any optimizer step (``PPOActor.first_logprobs``; the whole batch at
  ``ppo_n_minibatches: 1``, the default, and the rows of the first token-balanced minibatch
  otherwise, as ``policy/sampler_logprob_gap``). Why not one more forward of the whole batch: on
  the default shape a no-grad forward costs ~15-20 % of a step, the budget is 3 %.
* ℓsnap, the learner at the sampling weights: only under staleness, once the behaviour policy is
  an older snapshot (one extra forward, run while that snapshot is loaded/swapped in). Without
  staleness the sampling weights are the current ones, so ℓsnap = ℓcur and the lag part is 0.

So without staleness the measurement costs no forward, only the metrics (about 1 ms); under
staleness one forward. Measured by ``benchmarks/bench_mismatch.py``; ``rollout.measure_mismatch:
false`` skips it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.metrics.mismatch import mismatch_decomposition, mismatch_stats
from harness.model.build import precision
from harness.model.logprobs import forward_logprobs
from harness.ppo.actor import roll_left  # token layout → the actor's predicting layout
from harness.sampling.base import RolloutBatch


@dataclass
class MismatchProbe:
    """Per-step mismatch measurement of a run (``enabled`` = ``rollout.measure_mismatch``)."""

    device: torch.device
    learner: torch.dtype | None  # the learner's autocast dtype (None = float32)
    temperature: float
    enabled: bool = True
    reuse_recompute: bool = False  # the actor's prox_logprobs are the learner at current weights

    def learner_logprobs(self, model: Any, rb: RolloutBatch) -> torch.Tensor:
        """The learner-precision log-probs of ``rb``'s tokens under ``model``, predicting layout."""
        with torch.no_grad(), precision(self.device, self.learner):
            lp = forward_logprobs(
                model, rb.input_ids, rb.attention_mask, temperature=self.temperature
            )[0]
        return roll_left(lp.float())

    def snapshot(self, policy: Any, rb: RolloutBatch, stale: bool) -> torch.Tensor | None:
        """ℓsnap: call right after sampling, with the sampling weights still in ``policy``;
        None when not measuring or when the sampling weights are the current ones."""
        if not self.enabled or not stale:
            return None
        return self.learner_logprobs(policy, rb)

    def measure(
        self,
        model: Any,
        rb: RolloutBatch,
        batch: dict[str, Any],
        snapshot: torch.Tensor | None,
        first: tuple[list[int], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """The step's ``mismatch/*`` metrics (empty when not measuring). ``batch`` has been
        through ``PPOActor.compute_advantages``; ``first`` is the actor's ``first_logprobs``
        (rows, log-probs) from the update, used when the actor does not recompute. Without
        either, one extra forward of ``model`` (the current weights, not yet updated)."""
        if not self.enabled:
            return {}
        mask = batch["mask"]
        behaviour = roll_left(rb.logprobs.float())
        if self.reuse_recompute:
            current = batch["prox_logprobs"]
        elif first is not None:
            rows = torch.tensor(first[0], device=mask.device)
            current, mask, behaviour = first[1], mask[rows], behaviour[rows]
            snapshot = None if snapshot is None else snapshot[rows]
        else:
            current = self.learner_logprobs(model, rb)
        out = mismatch_stats(behaviour, current, mask)
        out.update(
            mismatch_decomposition(
                behaviour, current if snapshot is None else snapshot, current, mask
            )
        )
        return out


def mismatch_probe(cfg: Any, device: torch.device, learner: torch.dtype | None) -> MismatchProbe:
    p = cfg.ppo
    return MismatchProbe(
        device=device,
        learner=learner,
        temperature=p.temperature,
        enabled=cfg.rollout.measure_mismatch,
        reuse_recompute=bool(p.recomputes_proximal or p.recompute_logprob),
    )


__all__ = ["MismatchProbe", "mismatch_probe"]
