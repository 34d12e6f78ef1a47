"""Reward shaping, KL estimators and token-level GAE, following AReaL's ``PPOActor.compute_advantages``.

Source: AReaL ``areal/trainer/ppo/actor.py`` and ``areal/trainer/ppo/gae.py`` (main),
``areal/utils/data.py`` (``KLEstimator``); ``docs/ppo-semantics.md`` "Advantages".
"""

from __future__ import annotations

import math
from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]


def shape_rewards(
    rewards: torch.Tensor, *, scaling: float = 1.0, bias: float = 0.0, clip: float = 20.0
) -> torch.Tensor:
    """Scale and clip sequence rewards (AReaL's order: before ``reward_norm``).

    R ← clip((R + bias) · scaling, −clip, +clip)
    """
    if clip <= 0:
        raise ValueError(f"reward clip must be > 0; got {clip}")
    return ((rewards + bias) * scaling).clamp(-clip, clip)


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1"
) -> torch.Tensor:
    """Per-token KL estimate of π against π_ref from sampled-token log-probs.

    With x = logprobs − ref_logprobs (Schulman's estimators, as in AReaL's ``KLEstimator``):
        k1 = x,   k2 = x² / 2,   k3 = e^(−x) − 1 + x,
    each clamped to [−10, 10] afterwards.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs shape {tuple(logprobs.shape)} != ref_logprobs shape {tuple(ref_logprobs.shape)}"
        )
    x = logprobs.float() - ref_logprobs.float()
    if kind == "k1":
        kl = x
    elif kind == "k2":
        kl = 0.5 * x * x
    elif kind == "k3":
        kl = torch.expm1(-x) + x
    else:
        raise ValueError(f"kind must be one of 'k1', 'k2', 'k3'; got {kind!r}")
    return kl.clamp(-10.0, 10.0)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE with AReaL's masked-skip recurrence (docs/ppo-semantics.md "GAE").

    Inputs are [B, T] in the "predicting" layout: position t holds the reward, value and mask for
    predicting token t+1.  AReaL's loop, for t = T−2 … 0, starting from last = 0 and
    nextV = V[:, T−1]·bootstrap:

        δ_t    = r_t + γ·nextV − V_t
        cand_t = δ_t + γλ·last
        if m_t: last ← cand_t, nextV ← V_t          (masked positions are skipped entirely)
        A_t    = last ;   A_{T−1} = 0 ;   returns = A + V   (at every position)

    So masked positions neither discount nor consume a step; δ uses the value at the next *valid*
    position; masked positions before a valid span carry the following valid advantage; positions
    after the last valid token get 0.  ``bootstrap`` (bool [B]) is AReaL's ``no_eos``: the sequence
    was truncated, so the value after its last valid token is V[:, T−1].

    Computation without a Python loop over tokens: with c = γλ and b_t = m_t·δ_t the recurrence is
    last_t = a_t·last_{t+1} + b_t with a_t = c if m_t else 1, whose solution is
    last_t = Σ_{s≥t} c^(K_s − K_t)·b_s (K = running count of valid positions).  It is evaluated
    per chunk of time steps, each chunk scaled relative to its own start so that c^k never
    underflows float64, and chunks are joined by a short carry loop over chunks.
    """
    if rewards.shape != values.shape or rewards.shape != loss_mask.shape or rewards.dim() != 2:
        raise ValueError(
            "rewards, values and loss_mask must all be [B, T] with the same shape; got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(loss_mask.shape)}"
        )
    if not (0.0 <= gamma <= 1.0) or not (0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1]; got gamma={gamma}, lam={lam}")
    B, T = rewards.shape
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    dev = rewards.device
    if bootstrap is not None and tuple(bootstrap.shape) != (B,):
        raise ValueError(f"bootstrap must be [B]={B}; got {tuple(bootstrap.shape)}")
    if T == 0:
        z = torch.zeros((B, 0), dtype=dtype, device=dev)
        return z, z.clone()

    # Work in reversed time u = T-1-t: "the next valid position after t" becomes "the previous
    # valid position before u" (a forward cummax) and reverse cumulative sums become cumsums.
    r = rewards.to(dtype).flip(1)
    v = values.to(dtype).flip(1)
    valid = loss_mask.bool().flip(1)
    valid[:, 0] = False  # AReaL never processes the last column: A_{T-1} = 0.

    # J_u: number of valid positions in reversed [0, u] (inclusive).  The k-th valid position's
    # value is looked up through a per-row table indexed by count; entry 0 is the bootstrap value
    # (V_{T-1} for truncated rows, else 0), used when no valid position follows t.
    count = torch.cumsum(valid, dim=1)
    count_before = count - valid.to(count.dtype)  # valid positions strictly before u
    table = torch.zeros((B, T + 2), dtype=dtype, device=dev)
    if bootstrap is not None:
        table[:, 0] = torch.where(bootstrap.bool(), v[:, 0], 0.0)
    table.scatter_(1, torch.where(valid, count, T + 1), v)  # invalid entries land in column T+1
    next_v = torch.gather(table, 1, count_before)  # value at the previous valid position
    b = (r - v).add_(next_v, alpha=gamma).mul_(valid)  # m_t·δ_t

    c = float(gamma) * float(lam)
    if c == 0.0:
        # last_t = b at the first valid position >= t (reversed: the last valid <= u), else 0.
        b_table = torch.zeros((B, T + 2), dtype=dtype, device=dev)
        b_table.scatter_(1, torch.where(valid, count, T + 1), b)
        adv_rev = torch.gather(b_table, 1, count)
    elif c == 1.0:
        adv_rev = torch.cumsum(b.to(torch.float64), dim=1)
    else:
        adv_rev = _discounted_masked_cumsum(b.to(torch.float64), valid, count, c)
    adv = adv_rev.to(dtype).flip(1)
    returns = adv + values.to(dtype)
    return adv, returns


def _discounted_masked_cumsum(
    b: torch.Tensor, valid: torch.Tensor, count: torch.Tensor, c: float
) -> torch.Tensor:
    """y_u = Σ_{w≤u} c^(J_u − J_w)·b_w (J = ``count``, inclusive count of valid positions), 0<c<1.

    Evaluated as c^J·cumsum(c^(−J)·b) per chunk, with J counted from the chunk start so that
    c^(−J) ≤ 1e280 stays inside float64 (the powers come from a small lookup table rather than
    an exp over the whole batch); chunks are joined by a carry loop over chunks.
    """
    B, T = b.shape
    chunk = max(1, min(T, int(280.0 / -math.log10(c))))
    powers = torch.arange(chunk + 1, dtype=torch.float64, device=b.device) * math.log(c)
    pos_table, neg_table = torch.exp(powers), torch.exp(-powers)  # c^k, c^-k for k <= chunk

    def lookup(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # gather on a broadcast row is ~4x faster than advanced indexing table[idx] on CPU
        flat = idx.reshape(B, -1)
        return torch.gather(table.expand(B, -1), 1, flat).view(idx.shape)

    if chunk >= T:
        return torch.cumsum(b * lookup(neg_table, count), dim=1).mul_(lookup(pos_table, count))
    n_chunks = -(-T // chunk)
    pad = n_chunks * chunk - T
    if pad:
        b = torch.nn.functional.pad(b, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad))
    bc = b.reshape(B, n_chunks, chunk)
    j = torch.cumsum(valid.reshape(B, n_chunks, chunk), dim=2)  # counts from the chunk start
    gain = lookup(pos_table, j)
    local = torch.cumsum(bc * lookup(neg_table, j), dim=2).mul_(gain)
    carry = torch.zeros(B, n_chunks, dtype=torch.float64, device=b.device)
    running = torch.zeros(B, dtype=torch.float64, device=b.device)
    for k in range(n_chunks):
        carry[:, k] = running
        running = local[:, k, -1] + gain[:, k, -1] * running
    y = local + gain * carry.unsqueeze(2)
    return y.reshape(B, n_chunks * chunk)[:, :T]
