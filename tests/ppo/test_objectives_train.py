"""ppo.policy_loss end to end: every objective trains on stale data through PPOActor, logs its
diagnostics under the documented names, is deterministic, and rejects meaningless options."""

import json
import math

import pytest
import torch

from harness.config import ConfigError, PPOActorConfig, build_run_config
from harness.metrics import STEP_METRICS
from harness.ppo import PPOActor, ppo_actor_loss
from harness.run.loop import run
from tests.support.objective_stats import OWN_STATS
from tests.support.tiny import tiny_reverse


def cfg(**over):
    base = tiny_reverse(
        3,
        rollout={"prompts_per_step": 4, "staleness": 1},
        ppo={"ppo_n_minibatches": 2, "ppo_epochs": 2},
        optim={"lr": 3e-3},
        eval={"every": 0, "n_prompts": 4},
    )
    return build_run_config(base, over)


# The objectives trained here; EXTRA gives the covariance ones a ratio large enough that this
# tiny batch selects tokens.
TRAINED = ("ppo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")
OBJECTIVE_KEYS = {name: OWN_STATS[name] for name in TRAINED}
EXTRA = {
    "clip_cov": {
        "ppo.clip_cov.ratio": 0.2,
        "ppo.clip_cov.cov_lb": -100.0,
        "ppo.clip_cov.cov_ub": 100.0,
    },
    "kl_cov": {"ppo.kl_cov.ratio": 0.1},
}


@pytest.mark.parametrize("objective", list(OBJECTIVE_KEYS))
def test_every_objective_trains_and_logs_its_diagnostics(objective, tmp_path):
    c = cfg(**{"ppo.policy_loss": objective}, **EXTRA.get(objective, {}))
    res = run(c, results_dir=tmp_path)
    assert res.steps_done == 3 and res.status == "completed"
    h = res.history
    for key in {"policy/silenced_frac", "policy/reweighted_frac"} | OBJECTIVE_KEYS[objective]:
        assert key in STEP_METRICS, key
        assert len(h[key]) == 3 and all(math.isfinite(v) for v in h[key]), (key, h[key])
    for key in {"policy/gate_mean", "policy/cov_selected"} - OBJECTIVE_KEYS[objective]:
        assert key not in h
    if objective in ("clip_cov", "kl_cov"):
        assert all(v >= 1 for v in h["policy/cov_selected"])
    if objective == "kl_cov":
        assert all(v > 0 for v in h["policy/reweighted_frac"])
    if objective in ("cispo", "sapo", "kl_cov"):
        assert all(v == 0 for v in h["policy/silenced_frac"])  # no token loses its gradient
    if objective == "ppo":
        clipped = [
            a + b for a, b in zip(h["policy/clipfrac"], h["policy/dual_clipfrac"], strict=True)
        ]
        assert h["policy/silenced_frac"] == pytest.approx(clipped)


def test_clip_cov_draw_is_deterministic_per_seed(tmp_path):
    c = cfg(**{"ppo.policy_loss": "clip_cov"}, **EXTRA["clip_cov"])
    a = run(c, results_dir=tmp_path)
    b = run(c, results_dir=tmp_path)
    for k in a.history:
        if not k.startswith("perf/"):
            assert json.dumps(a.history[k]) == json.dumps(b.history[k]), k


def test_actor_default_objective_is_ppo_actor_loss():
    # PPOActor with policy_loss 'ppo' computes exactly ppo_actor_loss (the refactor changed nothing)
    g = torch.Generator().manual_seed(3)
    B, T = 3, 6
    lp = -torch.rand(B, T, generator=g)
    cur = (lp + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    batch = {
        "loss_mask": torch.ones(B, T),
        "logprobs": lp,
        "rewards": torch.tensor([1.0, 0.0, 0.5]),
        "current_logprobs": cur,
    }
    config = PPOActorConfig(eps_clip=0.2, c_clip=3.0)
    actor = PPOActor(config)
    actor.compute_advantages(batch)  # compute_loss itself leaves the caller's batch alone
    loss, _ = actor.compute_loss(batch)
    m = batch["mask"]
    want, _ = ppo_actor_loss(
        torch.roll(cur, -1, -1),
        batch["prox_logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        m,
        eps_clip=0.2,
        c_clip=3.0,
    )
    assert loss.item() == want.item()


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"ppo.policy_loss": "cispo", "ppo.c_clip": 3.0}, "ppo.c_clip means nothing under"),
        ({"ppo.policy_loss": "sapo", "ppo.eps_clip": 0.3}, "ppo.eps_clip means nothing under"),
        ({"ppo.kl_cov.coef": 2.0}, "ppo.kl_cov.coef means nothing under policy_loss 'ppo'"),
        (
            {"ppo.policy_loss": "gmpo", "ppo.importance_sampling_level": "sequence"},
            "importance_sampling_level 'sequence' means nothing under policy_loss 'gmpo'",
        ),
        (
            {"ppo.policy_loss": "cispo", "ppo.cispo.ratio_max": 0.5},
            "cispo.ratio_max: must be a finite number > 1",
        ),
    ],
)
def test_meaningless_options_are_config_errors(over, msg):
    with pytest.raises(ConfigError, match=None) as err:
        build_run_config({}, over)
    assert msg in str(err.value)
