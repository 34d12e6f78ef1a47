"""ROLL's policy-gradient variants ``kimi15`` and ``topr`` as ``ppo.policy_loss``: golden
numbers, loss AND gradient against transcriptions of ROLL's loss code, the config paths and the
exports."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from harness.config import build_run_config
from harness.config.experiment import load_experiment
from harness.ppo.objectives import lookup
from harness.sweep.present.cell_export import export_cell
from tests.support.peer_inputs import assert_agree


def agg_token_mean(loss_mat, loss_mask):
    """ROLL's agg_loss, loss_agg_mode token-mean: masked mean over every token."""
    return (loss_mat * loss_mask).sum() / loss_mask.sum()


def roll_kimi15(log_probs, old_log_probs, advantages, response_mask, tau=0.1):
    """alibaba/ROLL roll/pipeline/rlvr/actor_pg_worker.py ``_compute_kimi15_loss``."""
    kimi15_loss = -advantages * log_probs + tau * 0.5 * (log_probs - old_log_probs).pow(2)
    return agg_token_mean(kimi15_loss, response_mask)


def roll_topr(log_probs, old_log_probs, advantages, response_mask, scores, pos_w=1.0, neg_w=1.0):
    """alibaba/ROLL roll/pipeline/rlvr/actor_pg_worker.py ``_compute_topr_loss`` (ratio =
    exp(log_probs − old_log_probs), pg_variant topr)."""
    ratio = (log_probs - old_log_probs).exp()
    positive_mask = (scores > 0).float()
    negative_mask = (scores <= 0).float()
    positive_token_mask = positive_mask.unsqueeze(-1).expand_as(log_probs)
    negative_token_mask = negative_mask.unsqueeze(-1).expand_as(log_probs)
    positive_loss = -advantages * log_probs * positive_token_mask
    clipped_ratio = torch.clamp(ratio, min=0.0, max=1.0).detach()
    negative_loss = -clipped_ratio * advantages * log_probs * negative_token_mask
    topr_loss = pos_w * positive_loss + neg_w * negative_loss
    return agg_token_mean(topr_loss, response_mask)


def data(seed: int, groups: int = 3, n: int = 4, T: int = 7):
    """Binary rewards, group-mean baseline (GRPO without the std): A = r − mean(r)."""
    g = torch.Generator().manual_seed(seed)
    B = groups * n
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lt = (lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    M = torch.arange(T)[None] < lengths[:, None]
    scores = (torch.rand(B, generator=g) < 0.5).double()
    scores[:n] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # at least one mixed group
    centred = scores.view(groups, n) - scores.view(groups, n).mean(1, keepdim=True)
    A = centred.reshape(B, 1).expand(B, T) * M
    return lt, lp, A, M, scores


def agree(peer, mine, lt):
    assert_agree(peer, mine, lt, atol=1e-14)


def test_kimi15_golden():
    lt = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=torch.float64)
    lp = torch.tensor([[math.log(0.4), math.log(0.2)]], dtype=torch.float64)
    A = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    M = torch.ones(1, 2, dtype=torch.bool)
    loss, _ = lookup("kimi15").loss(lt, lp, lp, A, M)
    expect = (-2 * math.log(0.5) + 0.05 * math.log(1.25) ** 2 - 2 * math.log(0.2)) / 2
    assert loss.item() == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tau", [0.1, 0.7])
def test_kimi15_agrees_with_roll(seed, tau):
    lt, lp, A, M, _ = data(seed)
    mine, _ = lookup("kimi15").loss(lt, lp, lp, A, M, tau=tau)
    agree(roll_kimi15(lt, lp, A, M.double(), tau), mine, lt)


def test_topr_golden():
    """A positive row keeps the plain −A·log π whatever r; a negative row with r = 2 is tapered
    to weight 1, one with r = 0.5 keeps 0.5."""
    lt = torch.log(torch.tensor([[0.4], [0.4], [0.1]], dtype=torch.float64))
    lp = torch.log(torch.tensor([[0.1], [0.2], [0.2]], dtype=torch.float64))
    A = torch.tensor([[1.5], [-0.5], [-0.5]], dtype=torch.float64)
    M = torch.ones(3, 1, dtype=torch.bool)
    loss, stats = lookup("topr").loss(lt, lp, lp, A, M)
    expect = (-1.5 * math.log(0.4) + 0.5 * math.log(0.4) + 0.5 * 0.5 * math.log(0.1)) / 3
    assert loss.item() == pytest.approx(expect, rel=1e-12)
    assert stats["reweighted_mask"].tolist() == [[False], [True], [False]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 0.5)])
def test_topr_agrees_with_roll_for_binary_rewards(seed, weights):
    lt, lp, A, M, scores = data(seed)
    o = {"positive_weight": weights[0], "negative_weight": weights[1]}
    mine, _ = lookup("topr").loss(lt, lp, lp, A, M, **o)
    agree(roll_topr(lt, lp, A, M.double(), scores, *weights), mine, lt)


def test_topr_differs_from_roll_for_a_below_mean_positive_reward():
    """Graded rewards: a row with reward 0.5 in a group of mean 0.75 has A < 0; ROLL treats it as
    positive (its score is > 0), the harness as negative (documented in topr.py)."""
    lt = torch.log(torch.tensor([[0.1], [0.3]], dtype=torch.float64)).requires_grad_()
    lp = torch.log(torch.tensor([[0.2], [0.2]], dtype=torch.float64))  # row 0: r = 0.5
    scores = torch.tensor([0.5, 1.0], dtype=torch.float64)
    A = (scores - scores.mean()).unsqueeze(1)
    M = torch.ones(2, 1, dtype=torch.bool)
    mine, _ = lookup("topr").loss(lt, lp, lp, A, M)
    peer = roll_topr(lt, lp, A, M.double(), scores)
    # row 0: ROLL −A·ℓθ (weight 1), the harness −0.5·A·ℓθ (tapered)
    assert float((peer - mine).detach()) == pytest.approx(0.5 * 0.25 * math.log(0.1) / 2, rel=1e-12)


def test_config_grid_and_exports(tmp_path):
    cfg = build_run_config({}, {"ppo.policy_loss": "kimi15", "ppo.kimi15.tau": 0.2})
    assert cfg.ppo.kimi15.tau == 0.2
    cfg2 = build_run_config({}, {"ppo.policy_loss": "topr", "ppo.topr.negative_weight": 0.5})
    assert cfg2.ppo.topr.negative_weight == 0.5
    doc = {
        "name": "roll-axis",
        "base": {},
        "grid": {"ppo.policy_loss": ["ppo", "kimi15", "topr"]},
        "seeds": 1,
        "steps": 2,
    }
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(doc))
    exp = load_experiment(f)
    assert sorted(c.overrides["ppo.policy_loss"] for c in exp.cells) == ["kimi15", "ppo", "topr"]
    for c, name in ((cfg, "kimi15"), (cfg2, "topr")):
        for target in ("trl", "verl", "areal"):
            notes = [ln for ln in export_cell(c, target).splitlines() if ln.startswith("#")]
            assert any(name in ln for ln in notes), (target, name, notes)
