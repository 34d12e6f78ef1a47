"""Reward shaping, KL estimators and token-level GAE, following AReaL's ``PPOActor.compute_advantages``.

Source: AReaL ``areal/trainer/ppo/actor.py`` and ``areal/trainer/ppo/gae.py`` (main),
``areal/utils/data.py`` (``KLEstimator``); ``ppo-semantics.md`` §3.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]


def shape_rewards(
    rewards: torch.Tensor, *, scaling: float = 1.0, bias: float = 0.0, clip: float = 20.0
) -> torch.Tensor:
    """Scale and clip sequence rewards (AReaL §3 step 2).

        R ← clip((R + bias) · scaling, −clip, +clip)
    """
    if clip <= 0:
        raise ValueError(f"reward clip must be > 0; got {clip}")
    return ((rewards + bias) * scaling).clamp(-clip, clip)


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1"
) -> torch.Tensor:
    """Per-token KL estimate of π against π_ref from sampled-token log-probs (AReaL §3 step 7).

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


def _reverse_cummin(x: torch.Tensor) -> torch.Tensor:
    """out[..., t] = min(x[..., t:])."""
    return torch.flip(torch.cummin(torch.flip(x, dims=[-1]), dim=-1).values, dims=[-1])


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE with AReaL's masked-skip recurrence (AReaL §3 step 8).

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
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    device = rewards.device
    if T == 0:
        z = torch.zeros_like(rewards, dtype=out_dtype)
        return z, z.clone()

    f64 = torch.float64
    r = rewards.to(f64)
    v = values.to(f64)
    valid = loss_mask.bool().clone()
    valid[:, T - 1] = False  # AReaL never processes the last column: A_{T-1} = 0.

    # nextV_t = V at the first valid position s > t, else the bootstrap value.
    pos = torch.arange(T, device=device).expand(B, T)
    idx = torch.where(valid, pos, torch.full_like(pos, T))
    idx_after = torch.cat([idx[:, 1:], torch.full((B, 1), T, device=device, dtype=idx.dtype)], dim=1)
    nxt = _reverse_cummin(idx_after)
    boot = torch.zeros(B, dtype=f64, device=device)
    if bootstrap is not None:
        if bootstrap.shape != (B,):
            raise ValueError(f"bootstrap must be [B]={B}; got {tuple(bootstrap.shape)}")
        boot = torch.where(bootstrap.bool(), v[:, T - 1], boot)
    next_v = torch.where(
        nxt < T, torch.gather(v, 1, nxt.clamp(max=T - 1)), boot.unsqueeze(1).expand(B, T)
    )
    mf = valid.to(f64)
    b = mf * (r + gamma * next_v - v)

    c = float(gamma) * float(lam)
    if c == 0.0:
        # last_t = b at the first valid position ≥ t.
        idx_from = _reverse_cummin(idx)
        adv = torch.where(
            idx_from < T, torch.gather(b, 1, idx_from.clamp(max=T - 1)), torch.zeros_like(b)
        )
    elif c == 1.0:
        adv = torch.flip(torch.cumsum(torch.flip(b, dims=[1]), dim=1), dims=[1])
    else:
        adv = _discounted_masked_revsum(b, valid, c)

    adv = adv.to(out_dtype)
    returns = (adv.to(f64) + v).to(out_dtype)
    return adv, returns


def _discounted_masked_revsum(b: torch.Tensor, valid: torch.Tensor, c: float) -> torch.Tensor:
    """y_t = Σ_{s≥t} c^(#valid in [t, s)) · b_s for 0 < c < 1, in float64, vectorized in chunks."""
    B, T = b.shape
    # Largest chunk whose scale range c^C stays far above float64's underflow (1e-308).
    chunk = max(1, min(T, int(280.0 / -math.log10(c))))
    n_chunks = -(-T // chunk)
    pad = n_chunks * chunk - T
    if pad:
        b = torch.nn.functional.pad(b, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad))
    bc = b.reshape(B, n_chunks, chunk)
    mc = valid.reshape(B, n_chunks, chunk).to(torch.float64)
    # k_t: number of valid positions in [chunk_start, t) — the exponent relative to the chunk start.
    k = torch.cumsum(mc, dim=2) - mc
    k_end = mc.sum(dim=2, keepdim=True)
    log_c = math.log(c)
    scale = torch.exp(k * log_c)  # c^k, ≥ ~1e-280
    local = torch.flip(torch.cumsum(torch.flip(scale * bc, dims=[2]), dim=2), dims=[2]) / scale
    carry_gain = torch.exp((k_end - k) * log_c)  # c^(#valid in [t, chunk_end))
    # Join the chunks from the back: Y_j = value at the start of chunk j including later chunks.
    start_local = local[:, :, 0]
    start_gain = carry_gain[:, :, 0]
    carry_in = torch.zeros(B, n_chunks, dtype=torch.float64, device=b.device)
    running = torch.zeros(B, dtype=torch.float64, device=b.device)
    for j in range(n_chunks - 1, -1, -1):
        carry_in[:, j] = running
        running = start_local[:, j] + start_gain[:, j] * running
    y = local + carry_gain * carry_in.unsqueeze(2)
    return y.reshape(B, n_chunks * chunk)[:, :T]
