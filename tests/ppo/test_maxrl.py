"""MaxRL's mean-normalized advantage (``ppo.reward_norm.divide_by: mean``): golden numbers, the
agreement with prime-rl's and SkyRL's own code (transcribed below) and where those two disagree,
the config paths (YAML, --set, grid axis), the actor, and every export."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import PPOActorConfig, build_run_config
from harness.core.configtools import ConfigError
from harness.peers.export import export_areal, export_verl
from harness.peers.trl import trl_problems
from harness.ppo import NormConfig
from harness.ppo.actor import PPOActor
from harness.ppo.normalization import divide_by_mean, normalize
from harness.sweep.present.cell_export import export_cell

MAXRL = {"mean_level": "group", "std_level": None, "divide_by": "mean"}


# --- faithful transcriptions of the peers' code ---------------------------------------------


def prime_rl_score_group(rewards: list[float]) -> list[float]:
    """PrimeIntellect-ai/prime-rl src/prime_rl/orchestrator/algo/max_rl.py,
    ``MaxRLAlgorithm.score_group`` (one group; float32, no epsilon)."""
    r = torch.tensor(rewards, dtype=torch.float32)
    mean = r.mean()
    adv = torch.zeros_like(r) if mean <= 0 else (r - mean) / mean
    return adv.tolist()


def skyrl_compute_maxrl_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """NovaSky-AI/SkyRL skyrl/backends/skyrl_train/utils/ppo_utils.py,
    ``compute_maxrl_advantage`` (returns the advantages; returns are the same tensor)."""
    scores = token_level_rewards.sum(dim=-1)
    id2score: dict = defaultdict(list)
    id2mean = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if len(id2score[index[i]]) > 1:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores


def harness_maxrl(rewards: torch.Tensor, sizes: list[int], eps: float) -> torch.Tensor:
    return normalize(rewards, NormConfig(**MAXRL, eps=eps), group_sizes=sizes)


def _skyrl_rows(rewards: torch.Tensor, sizes: list[int], eps: float = 1e-6) -> torch.Tensor:
    T = 3
    tl = torch.zeros(len(rewards), T, dtype=torch.float32)
    tl[:, -1] = rewards  # the outcome reward at the last token, as SkyRL's generator puts it
    index = np.repeat(np.arange(len(sizes)), sizes)
    return skyrl_compute_maxrl_advantage(tl, torch.ones(len(rewards), T), index, eps)[:, 0]


# --- golden numbers -------------------------------------------------------------------------


def test_golden_values_binary_rewards():
    """K of N correct: a correct sample gets (N − K)/K, a wrong one −1; all-wrong and all-right
    groups carry nothing."""
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    out = harness_maxrl(r, [4, 4, 4, 4], eps=0.0)
    expect = [3.0, -1, -1, -1, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert torch.allclose(out, torch.tensor(expect), atol=1e-6), out
    # SkyRL's epsilon 1e-6: 0.75 / 0.250001 = 2.999988..., −0.25 / 0.250001 = −0.999996...
    out = harness_maxrl(r, [4, 4, 4, 4], eps=1e-6)
    assert out[0].item() == pytest.approx(0.75 / 0.250001, rel=1e-6)
    assert out[1].item() == pytest.approx(-0.25 / 0.250001, rel=1e-6)
    # continuous rewards, groups of 3 and 2: μ = 2 → (3−2)/2, (1−2)/2, (2−2)/2; μ = 0.5 → ±1
    out = harness_maxrl(torch.tensor([3.0, 1, 2, 0.25, 0.75]), [3, 2], eps=0.0)
    assert torch.allclose(out, torch.tensor([0.5, -0.5, 0.0, -0.5, 0.5]), atol=1e-6)


def test_pure_function_guards_non_positive_means():
    centred = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    mu = torch.tensor([0.5, 0.5, 0.0, -1.0], dtype=torch.float64)
    out = divide_by_mean(centred, mu, 0.0)
    assert out.tolist() == [2.0, -2.0, 0.0, 0.0]


# --- agreement with the peers ---------------------------------------------------------------


def _draws(n: int, seed: int, min_size: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        k = int(torch.randint(1, 6, (1,), generator=g))
        sizes = torch.randint(min_size, 9, (k,), generator=g).tolist()
        B = sum(sizes)
        if int(torch.randint(0, 2, (1,), generator=g)):
            r = (torch.rand(B, generator=g) < 0.3).float()  # binary, many all-zero groups
        else:
            r = torch.rand(B, generator=g) * 5
        yield r, sizes


@pytest.mark.filterwarnings("ignore:group-level mean over singleton groups")
def test_agrees_with_prime_rl_with_eps_zero_singletons_included():
    for r, sizes in _draws(200, seed=0, min_size=1):
        ours = harness_maxrl(r, sizes, eps=0.0)
        theirs = torch.tensor(
            [a for grp in torch.split(r, sizes) for a in prime_rl_score_group(grp.tolist())]
        )
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (r, sizes, ours, theirs)


def test_agrees_with_skyrl_with_eps_1e6_for_groups_of_two_or_more():
    for r, sizes in _draws(200, seed=1, min_size=2):
        ours = harness_maxrl(r, sizes, eps=1e-6)
        theirs = _skyrl_rows(r, sizes)
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (r, sizes, ours, theirs)


@pytest.mark.filterwarnings("ignore:group-level mean over singleton groups")
def test_where_the_peers_disagree():
    """A one-sample group: SkyRL passes the raw reward, prime-rl (and the harness) give 0.  A
    negative group mean: SkyRL divides by it (every advantage flips sign), prime-rl (and the
    harness) give 0.  Epsilon: prime-rl none, SkyRL 1e-6 (the harness's eps)."""
    r = torch.tensor([0.7])
    assert _skyrl_rows(r, [1]).tolist() == pytest.approx([0.7])
    assert prime_rl_score_group([0.7]) == [0.0]
    assert harness_maxrl(r, [1], eps=1e-6).tolist() == [0.0]

    neg = torch.tensor([-1.0, -3.0])  # μ = −2: SkyRL (−1+2)/(−2+1e-6) ≈ −0.5, prime-rl 0
    sky = _skyrl_rows(neg, [2])
    assert sky[0].item() == pytest.approx(-0.5, rel=1e-5) and sky[1].item() > 0
    assert prime_rl_score_group(neg.tolist()) == [0.0, 0.0]
    assert harness_maxrl(neg, [2], eps=1e-6).tolist() == [0.0, 0.0]


# --- the actor and the config ---------------------------------------------------------------


def test_actor_gives_every_valid_token_its_rows_maxrl_advantage():
    cfg = PPOActorConfig(reward_norm=NormConfig(**MAXRL, eps=0.0))
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1]])
    batch = {
        "loss_mask": mask,
        "logprobs": torch.zeros(4, 4),
        "rewards": torch.tensor([1.0, 0.0, 0.0, 0.0]),
        "group_sizes": [4],
    }
    out = PPOActor(cfg, None).compute_advantages(batch)
    m = out["mask"]
    expect = torch.tensor([3.0, -1.0, -1.0, -1.0]).unsqueeze(1).expand_as(m)
    assert torch.allclose(out["advantages"][m], expect[m])
    assert (out["advantages"][~m] == 0).all()


@pytest.mark.parametrize(
    "over, expect",
    [
        ({"std_level": "group"}, "replaces the std: set std_level null"),
        ({"mean_leave1out": True}, "needs mean_leave1out false"),
        ({"mean_level": None}, "needs mean_level 'group' or 'batch'"),
    ],
)
def test_config_refuses_what_cannot_act(over, expect):
    with pytest.raises(ConfigError, match=expect):
        build_run_config({}, {"ppo.reward_norm": {**MAXRL, **over}})


def test_set_and_grid_axis_reach_the_config(tmp_path):
    cfg = build_run_config(
        {"ppo": {"reward_norm": {"mean_level": "group", "std_level": None}}},
        {"ppo.reward_norm.divide_by": "mean"},
    )
    assert cfg.ppo.reward_norm.divide_by == "mean"
    runner = CliRunner()
    bad = runner.invoke(
        app,
        [
            "run",
            "--set",
            "ppo.reward_norm.mean_level=group",
            "--set",
            "ppo.reward_norm.divide_by=mean",
            "--results-dir",
            str(tmp_path / "r"),
        ],
    )
    err = bad.stderr if bad.stderr is not None else bad.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert bad.exit_code == 2 and len(lines) == 1, bad.output
    assert "ppo.reward_norm.divide_by" in lines[0] and "std_level null" in lines[0]
    assert "Traceback" not in bad.output and not (tmp_path / "r").exists()
    doc = {
        "name": "maxrl-axis",
        "base": {"ppo": {"reward_norm": {"mean_level": "group", "std_level": None}}},
        "grid": {"ppo.reward_norm.divide_by": ["std", "mean"]},
        "seeds": 1,
        "steps": 2,
    }
    from harness.config.experiment import load_experiment

    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(doc))
    exp = load_experiment(f)
    from harness.config.loading import apply_overrides

    built = [build_run_config(apply_overrides(exp.base, c.overrides)) for c in exp.cells]
    assert sorted(b.ppo.reward_norm.divide_by for b in built) == ["mean", "std"]


# --- exports --------------------------------------------------------------------------------


def test_every_target_says_it_has_no_mean_divisor():
    cfg = build_run_config({}, {"ppo.reward_norm": MAXRL})
    assert ("ppo.reward_norm.divide_by" in dict(trl_problems(cfg))) is True
    verl = export_verl(cfg)
    assert "# ppo.reward_norm.divide_by=mean: verl has no MaxRL adv_estimator" in verl
    assert "algorithm.adv_estimator" not in verl  # not written as grpo without the std
    areal = export_areal(cfg)
    assert "# ppo.reward_norm.divide_by=mean: AReaL's NormConfig has no mean divisor" in areal
    assert "divide_by" not in yaml.safe_load(areal)["actor"]["reward_norm"]
    assert "ppo.reward_norm.divide_by" in export_cell(cfg, "trl")
