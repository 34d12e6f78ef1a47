"""The policies one PPO run keeps: the live policy, the frozen KL reference and the behaviour
snapshot that samples ``rollout.staleness`` updates behind the learner.

Two layouts stand behind the same three calls, so the training loop never asks which one it has:

=================  ===============================  =========================================
                   full fine-tuning                 LoRA (peft)
=================  ===============================  =========================================
KL reference       a frozen deep copy of the start  the live model with its adapters disabled
behaviour (k > 0)  a frozen copy, loaded with the   the live model with the old adapters
                   snapshot before each rollout     swapped in for the rollout, then restored
snapshots          the whole ``state_dict``         the adapter weights only
=================  ===============================  =========================================

Under LoRA nothing is copied: the frozen base is shared, which is the point of LoRA on a large
model (``harness/config/resources.py`` counts the copies the full layout needs).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.model.logprobs import forward_logprobs
from harness.model.lora import is_lora, reference_off, swapped_in
from harness.run.staleness import StalenessRing


@dataclass(frozen=True)
class Behaviour:
    """The weights that sample one step: the module to sample with, whether they are an older
    snapshot than the live policy's, and the policy version they are (AReaL's versions)."""

    module: Any
    stale: bool
    version: int


class Policies:
    """The live policy ``model``, its KL reference (when ``kl``) and the staleness ring of
    behaviour snapshots (``staleness`` updates deep), full copies or LoRA swaps alike.

    ``version`` counts the updates made so far (AReaL's ``get_version``); :meth:`push` after each
    update advances it and snapshots the new weights.
    """

    def __init__(self, model: Any, *, kl: bool, staleness: int) -> None:
        self.model = model
        self.lora = is_lora(model)
        self.kl = kl
        # Eval mode except inside the update (PPOActor.ppo_update switches to train mode there,
        # which gradient checkpointing needs). Every dropout is zeroed at load time, so the mode
        # changes nothing else; LoRA's own dropout, if configured, is live in the update only.
        model.eval()
        self._reference = frozen_copy(model) if kl and not self.lora else None
        self.ring = StalenessRing(staleness, trainable_only=self.lora)
        self._behaviour = frozen_copy(model) if staleness and not self.lora else None
        self.ring.push(model)
        self.version = 0

    @contextlib.contextmanager
    def behaviour(self) -> Iterator[Behaviour]:
        """The behaviour policy, loaded for the body of the ``with``: the policy as it was
        ``lag`` updates ago (the live model itself without staleness). Under LoRA the old
        adapters are swapped into the live model and the current ones restored on exit, so
        whatever must see the sampling weights (the mismatch snapshot) runs inside the block."""
        stale = self.ring.behaviour_state()
        version = self.version - self.ring.lag
        if stale is None:
            yield Behaviour(self.model, stale=False, version=version)
        elif self._behaviour is not None:
            self._behaviour.load_state_dict(stale)
            yield Behaviour(self._behaviour, stale=True, version=version)
        else:
            with swapped_in(self.model, stale):
                yield Behaviour(self.model, stale=True, version=version)

    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float
    ) -> torch.Tensor:
        """The KL reference's per-token log-probs (token layout, like ``forward_logprobs``); the
        caller sets no-grad and the precision, as for every learner forward."""
        if not self.kl:  # no reference was kept: the live model would answer, silently wrong
            raise RuntimeError("no KL reference in this run (ppo.kl_ctl is 0)")
        if self._reference is not None:
            return forward_logprobs(
                self._reference, input_ids, attention_mask, temperature=temperature
            )[0]
        with reference_off(self.model) if self.lora else contextlib.nullcontext():
            return forward_logprobs(self.model, input_ids, attention_mask, temperature=temperature)[
                0
            ]

    def push(self) -> None:
        """After an update: snapshot the new weights into the ring and advance the version."""
        self.ring.push(self.model)
        self.version += 1

    @property
    def lag(self) -> int:
        """How many updates the next behaviour snapshot is behind the live weights."""
        return self.ring.lag


def frozen_copy(model: Any) -> Any:
    """A copy no optimizer holds and no backward reaches (the reference, the behaviour copy)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


__all__ = ["Behaviour", "Policies", "frozen_copy"]
