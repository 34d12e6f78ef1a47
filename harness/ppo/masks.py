"""Token and row masks the stability options put on the loss, and the prompt-mean reduction, as
pure functions (``docs/ppo-semantics.md`` "Stability options").

* ``top_entropy_mask``: TRL's ``top_entropy_quantile`` (the "80/20" rule): keep only the tokens
  whose entropy is in the top ρ of the minibatch's valid tokens.
* ``truncated_row_mask``: TRL's ``mask_truncated_completions``: a truncated row leaves the loss.
* ``group_ids_from_sizes`` / ``prompt_mean``: SkyRL's ``loss_reduction: prompt_mean``.
"""

from __future__ import annotations

import torch


def entropy_threshold(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` with linear interpolation, computed with a sort: the same
    numbers, without torch.quantile's limit of 2**24 elements.  ``values`` is 1-D, non-empty."""
    v = values.float().sort().values
    # As torch.quantile: the rank in the input's dtype, then lerp between its neighbours.
    pos = torch.tensor(q, dtype=v.dtype, device=v.device) * (v.numel() - 1)
    lo = int(pos.floor())
    hi = min(lo + 1, v.numel() - 1)
    return torch.lerp(v[lo], v[hi], pos - lo)


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The valid tokens whose entropy reaches the ``1 − quantile`` quantile of the valid tokens'
    entropies (TRL ``get_high_entropy_mask``): τ = quantile(H[mask], 1 − ρ), keep H ≥ τ, so ties
    at τ are kept and ρ = 0 keeps the maximum (all of its ties).  ρ = 1 keeps every valid token;
    no valid token keeps nothing.  Boolean, the shape of ``entropy``."""
    m = mask.bool()
    if quantile >= 1.0:
        return m.clone()
    valid = entropy.detach()[m]
    if valid.numel() == 0:
        return torch.zeros_like(m)
    tau = entropy_threshold(valid, 1.0 - quantile)
    return (entropy.detach().float() >= tau) & m


def truncated_row_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """``mask`` with every truncated row (``truncated`` [B] bool) zeroed (TRL
    ``mask_truncated_completions``: the row leaves the loss and every denominator)."""
    return mask.bool() & ~truncated.bool().view(-1, *([1] * (mask.dim() - 1)))


def group_ids_from_sizes(
    group_sizes: list[int] | None, n_rows: int, device: torch.device
) -> torch.Tensor:
    """Per-row prompt index [B] from consecutive group sizes; without groups every row is its own
    prompt (prompt-mean then equals seq-mean-token-mean)."""
    if not group_sizes:
        return torch.arange(n_rows, device=device)
    if sum(group_sizes) != n_rows:
        raise ValueError(f"group_sizes {group_sizes} do not sum to the batch's {n_rows} rows")
    sizes = torch.tensor(group_sizes, device=device)
    return torch.repeat_interleave(torch.arange(len(group_sizes), device=device), sizes)


def prompt_mean(contrib: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """SkyRL ``prompt_mean``: (1/P) Σ_p Σ_{i∈p,t} contrib / max(1, Σ_{i∈p,t} mask), P the number
    of prompts present in the minibatch (a prompt whose tokens are all masked still counts, as in
    SkyRL).  ``contrib`` is the masked per-token loss [B, T]; ``group_ids`` [B]."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_prompts = int(inverse.max()) + 1 if inverse.numel() else 1
    row_sum = contrib.sum(dim=1)
    row_tok = mask.to(contrib.dtype).sum(dim=1)
    num = torch.zeros(n_prompts, dtype=contrib.dtype, device=contrib.device)
    den = torch.zeros(n_prompts, dtype=contrib.dtype, device=contrib.device)
    num = num.index_add(0, inverse, row_sum)
    den = den.index_add(0, inverse, row_tok)
    return (num / den.clamp(min=1)).sum() / n_prompts
