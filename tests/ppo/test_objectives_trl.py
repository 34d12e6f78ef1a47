"""Agreement with TRL's own loss computation (``GRPOTrainer._compute_loss``, TRL 1.16).

TRL's method is called unbound on a minimal stand-in for the trainer that supplies exactly the
attributes the loss reads (loss type, ε, SAPO temperatures, a one-process accelerator) and returns
our per-token log-probs from its forward pass; the loss and its gradient are compared with the
harness objective on identical inputs:

    TRL loss_type | harness
    cispo         | policy_loss cispo, ratio_max = epsilon_high, token-mean
    sapo          | policy_loss sapo, same temperatures, seq-mean-token-mean
    dapo          | ppo-clip, token-mean
    grpo          | ppo-clip, seq-mean-token-mean
    dr_grpo       | ppo-clip, seq-mean-token-sum-norm (max_completion_length = T)
"""

import pytest
import torch

pytest.importorskip("trl")
from harness.ppo import ppo_actor_loss  # noqa: E402
from harness.ppo.objectives import cispo_loss, sapo_loss  # noqa: E402
from tests.support.trl_stand_in import (  # noqa: E402
    TrainerStandIn,
    random_batch,
    trl_compute_loss,
)


def trl_loss(loss_type, lt, old, adv, mask, **kw):
    """TRL's loss and d loss / d ℓθ on [B, T] completions."""
    x = lt.clone().requires_grad_(True)
    stand_in = TrainerStandIn(loss_type, x, **kw)
    loss = trl_compute_loss(stand_in, old, adv, mask)
    return loss, x.grad, stand_in._metrics["train"]


def ours(fn, lt, old, adv, mask, **kw):
    x = lt.clone().requires_grad_(True)
    loss, stats = fn(x, old, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), x.grad, stats


SEEDS = range(8)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("eps_max", [1.5, 5.0])
def test_cispo_agrees_with_trl(seed, eps_max):
    lt, old, adv, mask = random_batch(seed, spread=0.8)
    want, g_want, metrics = trl_loss("cispo", lt, old, adv, mask, eps_high=eps_max)
    got, g_got, stats = ours(cispo_loss, lt, old, adv, mask, ratio_max=eps_max)
    close(got, want)
    close(g_got, g_want)
    # TRL's cispo_clip_ratio counts capped tokens with A > 0 only
    capped_pos = (stats["reweighted_mask"] & (adv > 0)).sum() / mask.sum()
    assert metrics["cispo_clip_ratio"][0] == pytest.approx(capped_pos.item(), abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.3, 2.0)])
def test_sapo_agrees_with_trl(seed, taus):
    lt, old, adv, mask = random_batch(seed, spread=0.8)
    want, g_want, _ = trl_loss("sapo", lt, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1])
    got, g_got, _ = ours(
        sapo_loss,
        lt,
        old,
        adv,
        mask,
        temperature_pos=taus[0],
        temperature_neg=taus[1],
        loss_agg_mode="seq-mean-token-mean",
    )
    close(got, want)
    close(g_got, g_want)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "loss_type, agg",
    [
        ("dapo", "token-mean"),
        ("grpo", "seq-mean-token-mean"),
        ("dr_grpo", "seq-mean-token-sum-norm"),
    ],
)
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
def test_ppo_aggregations_agree_with_trl(seed, loss_type, agg, eps):
    lt, old, adv, mask = random_batch(seed, spread=0.4)
    want, g_want, metrics = trl_loss(loss_type, lt, old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    got, g_got, stats = ours(
        ppo_actor_loss,
        lt,
        old,
        adv,
        mask,
        eps_clip=eps[0],
        eps_clip_higher=eps[1],
        loss_agg_mode=agg,
    )
    close(got, want)
    close(g_got, g_want)
    n = mask.sum().item()
    low = metrics["clip_ratio/low_mean"][0]
    high = metrics["clip_ratio/high_mean"][0]
    assert low == pytest.approx(stats["clip_low_mask"].sum().item() / n, abs=1e-6)
    assert high == pytest.approx(stats["clip_high_mask"].sum().item() / n, abs=1e-6)
