"""Inputs and the agreement check shared by the tests that transcribe a peer's loss."""

from __future__ import annotations

import torch


def correction_inputs(seed: int, B: int = 6, T: int = 8) -> tuple[torch.Tensor, ...]:
    """``(ℓθ, ℓp, ℓb, A, M)`` in float64: behaviour log-probs, a proximal policy 0.25 away, the
    learner 0.1 away from that (requiring grad), rows of random lengths (the first full) and one
    advantage per row, masked."""
    g = torch.Generator().manual_seed(seed)
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lp = lb + 0.25 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lt = (lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    M = torch.arange(T)[None] < lengths[:, None]
    A = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * M
    return lt, lp, lb, A, M


def assert_agree(
    peer: torch.Tensor, mine: torch.Tensor, lt: torch.Tensor, atol: float = 1e-13
) -> None:
    """The peer's loss and ours, and their gradients in ``lt``, equal to float64 precision (only
    the summation order differs), and the gradient not all zero."""
    (g_peer,) = torch.autograd.grad(peer, lt)
    (g_mine,) = torch.autograd.grad(mine, lt)
    assert torch.allclose(peer, mine, rtol=1e-12, atol=atol), (float(peer), float(mine))
    assert torch.allclose(g_peer, g_mine, rtol=1e-12, atol=atol)
    assert g_mine.abs().sum() > 0
