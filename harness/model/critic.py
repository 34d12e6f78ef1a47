"""The optional critic: a value model for GAE, and AReaL's clipped value loss.

AReaL trains the critic as a separate engine (``PPOCriticConfig``); here it is a copy of the
policy's transformer trunk (any architecture: its ``base_model``) with a scalar head, trained
after each actor update. Under LoRA the copy keeps the adapters and their trainability (the
copied base stays frozen), so the critic trains adapters + head.
"""

from __future__ import annotations

import copy

import torch

from harness.model.build import base_model
from harness.model.logprobs import position_ids


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_clip: float | None,
) -> torch.Tensor:
    """AReaL's ``ppo_critic_loss_fn`` (docs/ppo-semantics.md "Critic loss"):

    V_clip = V_old + clamp(V − V_old, −ε_v, ε_v)
    loss   = masked mean of max(½(V − G)², ½(V_clip − G)²)      (no clipping: ½(V − G)²)
    """
    m = mask.bool()
    err = 0.5 * (values - returns) ** 2
    if value_clip is not None:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        err = torch.maximum(err, 0.5 * (clipped - returns) ** 2)
    n = max(int(m.sum()), 1)
    return torch.where(m, err, torch.zeros((), dtype=err.dtype)).sum() / n


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(G − V) / Var(G) over valid positions (CleanRL's diagnostic); NaN if Var(G) = 0."""
    m = mask.bool()
    g, v = returns[m].double(), values[m].double()
    if g.numel() < 2 or float(g.var()) == 0.0:
        return float("nan")
    return float(1.0 - (g - v).var() / g.var())


class ValueModel(torch.nn.Module):
    """Transformer trunk (copied from the policy at start) + a zero-initialised scalar head.

    ``forward`` returns values in predicting layout: position t is the value of the state after
    reading tokens 0..t, i.e. before emitting token t+1.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        # The model's own trunk whatever it is called (.model, .transformer, .gpt_neox, ...).
        self.trunk = copy.deepcopy(base_model(policy))
        hidden = int(policy.config.hidden_size)  # type: ignore[union-attr,arg-type]
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        )
        return self.head(out.last_hidden_state).squeeze(-1).float()
