"""prime-rl's losses: ``ipo`` as ``ppo.policy_loss: ipo`` (golden numbers, loss AND gradient
against a transcription of prime-rl's ``pg_loss_fn`` with trust_region "ipo", the config paths and
the exports) and its default loss as ``ppo.policy_loss: dppo`` with ``ppo.dppo.kl_tau``."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from harness.config import build_run_config
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError
from harness.ppo.objectives import lookup
from harness.sweep.present.cell_export import export_cell


def prime_rl_ipo(trainer_logprobs, inference_logprobs, advantages, loss_mask, thr, adv_tau, kl_tau):
    """PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py ``pg_loss_fn`` with
    advantage 'shipped' and trust_region 'ipo', then ``compute_loss``'s division by the rl token
    count (packed: every row's tokens concatenated)."""
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    probs_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    is_masked = torch.abs(probs_diff) > thr
    keep_mask = loss_mask & ~is_masked
    pg_loss = keep_mask * (adv_tau * advantages) * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    per_token_loss = -pg_loss + kl_tau * kl_loss
    loss = per_token_loss.sum()
    is_masked_metric = is_masked[loss_mask].double().mean()
    return loss / loss_mask.sum(), is_masked_metric


def data(seed: int, B: int = 6, T: int = 8):
    g = torch.Generator().manual_seed(seed)
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lt = (lb + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    M = torch.arange(T)[None] < lengths[:, None]
    A = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * M
    return lt, lb, A, M


def ours(lt, lb, A, M, **options):
    o = lookup("ipo")
    return o.loss(lt, lb, lb, A, M, **options)


def test_golden_values():
    """prime-rl's own test case (tests of its default loss, probabilities 0.5/0.1/0.2/0.3 against
    0.1/0.5/0.2/0.25): the first two tokens move by 0.4 and drop, the third has A = 0, the fourth
    is padding; only the drift term is left: 1e-3·((ln 5)² + (ln 0.2)²)/3."""
    lt = torch.log(torch.tensor([[0.5, 0.1, 0.2, 0.3]], dtype=torch.float64)).requires_grad_()
    lb = torch.log(torch.tensor([[0.1, 0.5, 0.2, 0.25]], dtype=torch.float64))
    A = torch.tensor([[1.0, -1.0, 0.0, 0.5]], dtype=torch.float64)
    M = torch.tensor([[True, True, True, False]])
    loss, stats = ours(lt, lb, A, M)
    assert loss.item() == pytest.approx(1e-3 * 2 * math.log(5) ** 2 / 3, rel=1e-12)
    assert stats["clip_mask"].tolist() == [[True, True, False, False]]
    # a small move keeps the token: p 0.30 → 0.35 (|d| = 0.05), A = 2: L = −2·(0.35/0.3) + drift
    lt = torch.log(torch.tensor([[0.35]], dtype=torch.float64))
    lb = torch.log(torch.tensor([[0.3]], dtype=torch.float64))
    loss, _ = ours(lt, lb, torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([[True]]))
    expect = -2 * 0.35 / 0.3 + 1e-3 * math.log(0.35 / 0.3) ** 2
    assert loss.item() == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("opts", [{}, {"threshold": 0.05, "kl_tau": 0.01, "adv_tau": 0.7}])
def test_agrees_with_prime_rl_loss_and_gradient(seed, opts):
    lt, lb, A, M = data(seed)
    o = {"threshold": 0.1, "kl_tau": 1e-3, "adv_tau": 1.0, **opts}
    peer, peer_masked = prime_rl_ipo(lt, lb, A, M, o["threshold"], o["adv_tau"], o["kl_tau"])
    mine, stats = ours(lt, lb, A, M, **opts)
    (g_peer,) = torch.autograd.grad(peer, lt)
    (g_mine,) = torch.autograd.grad(mine, lt)
    assert torch.allclose(peer, mine, rtol=1e-12, atol=1e-14), (float(peer), float(mine))
    assert torch.allclose(g_peer, g_mine, rtol=1e-12, atol=1e-14)
    dropped = stats["clip_mask"][M]
    assert 0 < int(dropped.sum()) < int(M.sum())  # both sides of the region are exercised
    assert float(dropped.double().mean()) == pytest.approx(float(peer_masked))


def test_drop_ignores_the_sign_of_the_advantage_unlike_dppo():
    """A token whose probability rose by 0.3 with A < 0: DPPO (binary_tv) keeps it (a safe
    move), IPO drops it."""
    lt = torch.log(torch.tensor([[0.6]], dtype=torch.float64)).requires_grad_()
    lb = torch.log(torch.tensor([[0.3]], dtype=torch.float64))
    A, M = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[True]])
    _, ipo = ours(lt, lb, A, M, kl_tau=0.0)
    _, dppo = lookup("dppo").loss(lt, lb, lb, A, M)
    assert ipo["clip_mask"].tolist() == [[True]] and dppo["clip_mask"].tolist() == [[False]]


def test_config_set_grid_and_bad_values(tmp_path):
    cfg = build_run_config({}, {"ppo.policy_loss": "ipo", "ppo.ipo.threshold": 0.2})
    assert cfg.ppo.policy_loss == "ipo" and cfg.ppo.ipo.threshold == 0.2
    with pytest.raises(ConfigError, match="ipo.threshold"):
        build_run_config({}, {"ppo.policy_loss": "ipo", "ppo.ipo.threshold": 0})
    with pytest.raises(ConfigError, match="ipo"):  # an unselected objective's options
        build_run_config({}, {"ppo.ipo.kl_tau": 0.1})
    doc = {
        "name": "ipo-axis",
        "base": {"ppo": {"policy_loss": "ipo"}},
        "grid": {"ppo.ipo.threshold": [0.05, 0.1, 0.2]},
        "seeds": 1,
        "steps": 2,
    }
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(doc))
    exp = load_experiment(f)
    assert sorted(c.overrides["ppo.ipo.threshold"] for c in exp.cells) == [0.05, 0.1, 0.2]


def test_every_target_names_the_objective_it_lacks():
    cfg = build_run_config({}, {"ppo.policy_loss": "ipo"})
    for target in ("trl", "verl", "areal"):
        text = export_cell(cfg, target)
        notes = [ln for ln in text.splitlines() if ln.startswith("#")]
        assert any("ipo" in ln for ln in notes), (target, notes)


def prime_rl_default(
    trainer_logprobs, inference_logprobs, advantages, loss_mask, low, high, kl_tau
):
    """PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py ``default_loss_fn`` (the DPPO
    trust region, adv_tau 1), divided by the rl token count."""
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    probs_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    positive_advantages = advantages > 0
    dppo_invalid_mask_high = probs_diff > high
    dppo_invalid_mask_low = probs_diff < -low
    is_masked = torch.where(positive_advantages, dppo_invalid_mask_high, dppo_invalid_mask_low)
    keep_mask = loss_mask & ~is_masked
    pg_loss = keep_mask * advantages * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    return (-pg_loss + kl_tau * kl_loss).sum() / loss_mask.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kl_tau", [1e-3, 0.05])
def test_dppo_with_kl_tau_is_prime_rls_default_loss(seed, kl_tau):
    lt, lb, A, M = data(seed)
    peer = prime_rl_default(lt, lb, A, M, 0.05, 0.05, kl_tau)
    o = lookup("dppo")
    mine, stats = o.loss(lt, lb, lb, A, M, delta_low=0.05, delta_high=0.05, kl_tau=kl_tau)
    (g_peer,) = torch.autograd.grad(peer, lt)
    (g_mine,) = torch.autograd.grad(mine, lt)
    assert torch.allclose(peer, mine, rtol=1e-12, atol=1e-14), (float(peer), float(mine))
    assert torch.allclose(g_peer, g_mine, rtol=1e-12, atol=1e-14)
    assert 0 < int(stats["clip_mask"][M].sum()) < int(M.sum())
    # kl_tau 0 (the default) is DPPO without the drift term: the value moves by kl_tau·mean(log r)²
    plain, _ = o.loss(lt, lb, lb, A, M, delta_low=0.05, delta_high=0.05)
    drift = float(((lt.detach() - lb) ** 2)[M].mean())
    assert float(mine.detach()) - float(plain) == pytest.approx(kl_tau * drift, rel=1e-9)


def test_prime_rl_default_loss_from_the_config():
    cfg = build_run_config({}, {"ppo.policy_loss": "dppo", "ppo.dppo.kl_tau": 1e-3})
    assert cfg.ppo.dppo.kl_tau == 1e-3
    with pytest.raises(ConfigError, match="dppo.kl_tau"):
        build_run_config({}, {"ppo.policy_loss": "dppo", "ppo.dppo.kl_tau": -1})
    verl = export_cell(cfg, "verl")
    assert "ppo.dppo.kl_tau" in verl  # verl's dppo has no drift term: named, not dropped
