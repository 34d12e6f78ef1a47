"""The staleness ring: past policy weights, so a rollout can be sampled by the policy as it was
k updates ago (``rollout.staleness``)."""

from __future__ import annotations

import collections

import torch


class StalenessRing:
    """Past policy weights, so rollouts can be sampled by the policy as it was k updates ago.

    Emulates AReaL's asynchronous off-policy setting (``max_head_offpolicyness``) on one
    machine: ``push(model)`` after every update keeps the newest ``k + 1`` snapshots;
    ``behaviour_state()`` is the oldest kept (k updates behind once the ring has filled, fewer
    before). With ``k = 0`` nothing is copied and the live model is the behaviour policy.
    Snapshots are detached clones on the model's device.
    """

    def __init__(self, k: int, *, trainable_only: bool = False) -> None:
        if k < 0:
            raise ValueError(f"staleness must be >= 0; got {k}")
        self.k = k
        # Under LoRA only the adapters change: snapshot those, not the frozen base.
        self.trainable_only = trainable_only
        self._ring: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=k + 1)

    def push(self, model: torch.nn.Module) -> None:
        if self.k == 0:
            return
        with torch.no_grad():
            if self.trainable_only:
                snap = {
                    n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
                }
            else:
                snap = {n: t.detach().clone() for n, t in model.state_dict().items()}
            self._ring.append(snap)

    def behaviour_state(self) -> dict[str, torch.Tensor] | None:
        """The oldest kept snapshot, or None when k == 0 or nothing was pushed yet."""
        return self._ring[0] if self._ring else None

    @property
    def lag(self) -> int:
        """How many updates the behaviour snapshot is behind the newest pushed weights."""
        return max(len(self._ring) - 1, 0)


__all__ = ["StalenessRing"]
