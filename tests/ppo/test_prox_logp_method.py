"""``ppo.prox_logp_method``: AReaL's ``loglinear`` π_prox (interpolated from the behaviour and the
live log-probs by policy version, no forward pass) beside ``recompute``.

The peer's formula is transcribed from AReaL (inclusionAI/AReaL)
``areal/trainer/ppo/actor.py`` (``compute_prox_logp_approximations``, method ``loglinear``; the
loss it feeds is ``ppo_actor_loss_fn`` of ``areal/utils/functional/functional.py``).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import harness.model.logprobs as logprobs_module
from harness.cli import app
from harness.config import build_run_config, load_run_config
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError
from harness.ppo import PPOActor, PPOActorConfig
from harness.ppo.proximal import loglinear_alpha, loglinear_proximal
from harness.run.loop import run
from harness.sweep.present.cell_export import export_cell
from tests.support.tiny import tiny_reverse

STALE = tiny_reverse(
    4,
    # measure_mismatch: its own forwards would blur the count below
    rollout={"staleness": 2, "measure_mismatch": False},
    ppo={"ppo_n_minibatches": 2, "use_decoupled_loss": True},
    eval={"every": 100, "n_prompts": 4},
)


# -- the peer, transcribed ----------------------------------------------------------------------


def areal_loglinear(old_logp, logprobs, versions, current_version):
    """AReaL ``compute_prox_logp_approximations(..., method='loglinear')``, line by line."""
    v_proximal = current_version - 1
    v_behave = versions.float()
    v_theta = float(current_version)
    generated_tokens_mask = versions >= 0
    version_diff = v_theta - v_behave
    version_gap = v_proximal - v_behave
    alpha = torch.where(
        (version_diff > 0) & generated_tokens_mask,
        version_gap / version_diff,
        torch.zeros_like(v_behave),
    )
    alpha = torch.clamp(alpha, 0.0, 1.0)
    return old_logp + alpha * (logprobs - old_logp)


def areal_clip_loss(logprobs, proximal, advantages, mask, eps):
    """AReaL ``ppo_actor_loss_fn`` on the decoupled path without rejection sampling or dual
    clip: r = exp(ℓθ − ℓp), L = max(−A·r, −A·clip(r, 1 ± ε)), mean over the valid tokens."""
    m = mask.float()
    n = m.sum().clamp(min=1)
    ratio = torch.exp(torch.where(mask, logprobs - proximal, 0.0))
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    per_token = torch.max(-advantages * ratio, -advantages * clipped)
    return (per_token * m).sum() / n


# -- the pure function --------------------------------------------------------------------------


def test_alpha_golden():
    """v_θ = 10: a batch sampled k updates ago gets (k−1)/k; prompt tokens (−1), the current
    version and a 'future' version get 0."""
    versions = torch.tensor([10, 9, 8, 6, 2, 0, -1, 11])
    got = loglinear_alpha(versions, 10).tolist()
    want = [0.0, 0.0, 0.5, 0.75, 0.875, 0.9, 0.0, 0.0]
    assert got == pytest.approx(want, abs=1e-12)


def test_proximal_golden():
    lb = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    lt = torch.tensor([[-0.2, -1.0, -0.5, -1.0]])
    versions = torch.tensor([[-1, 8, 8, 2]])  # v_θ = 10: α = 0, 0.5, 0.5, 0.875
    got = loglinear_proximal(lb, lt, versions, 10)
    want = [[-1.0, -1.5, -0.5, -1.25]]
    assert got.tolist() == [pytest.approx(want[0], abs=1e-6)]


def test_matches_a_naive_loop_and_areal_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for _ in range(50):
        B, T = rng.randint(1, 4), rng.randint(1, 9)
        lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
        lt = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
        v_theta = rng.randint(0, 12)
        versions = torch.randint(-1, v_theta + 2, (B, T), generator=g)
        got = loglinear_proximal(lb, lt, versions, v_theta)
        assert got.dtype == torch.float64
        for i in range(B):
            for t in range(T):
                v = int(versions[i, t])
                if v >= 0 and v_theta - v > 0:
                    a = min(max((v_theta - 1 - v) / (v_theta - v), 0.0), 1.0)
                else:
                    a = 0.0
                naive = (1 - a) * float(lb[i, t]) + a * float(lt[i, t])
                assert math.isclose(float(got[i, t]), naive, rel_tol=1e-12, abs_tol=1e-12)
        peer = areal_loglinear(lb, lt, versions, v_theta)
        torch.testing.assert_close(got, peer, rtol=1e-6, atol=1e-6)


def test_the_current_logprobs_carry_no_gradient_into_the_proximal_policy():
    lb = torch.tensor([[-1.0, -2.0]])
    lt = torch.tensor([[-0.5, -0.7]], requires_grad=True)
    prox = loglinear_proximal(lb, lt, torch.tensor([[3, 3]]), 5)
    assert not prox.requires_grad


# -- the actor: loss and gradient against AReaL's ----------------------------------------------


def _batch(g: torch.Generator, B: int, T: int, v_b: int, v_theta: int):
    m = torch.rand(B, T, generator=g) > 0.25
    m[:, 0] = True
    lb = (-torch.rand(B, T, generator=g) * 3) * m
    adv = torch.randn(B, T, generator=g) * m
    versions = torch.where(m, v_b, -1)
    batch = {
        "mask": m,
        "old_logprobs": lb,
        "prox_logprobs": lb.clone(),  # what compute_advantages leaves before the interpolation
        "advantages": adv,
        "versions_p": versions,
        "current_version": v_theta,
        "group_sizes": None,
    }
    return batch, lb, adv, m, versions


@pytest.mark.parametrize("lag", [2, 3, 8])
def test_actor_loss_and_gradient_match_areal(lag):
    """Loss and ∂L/∂ℓθ of the harness's decoupled PPO-clip under loglinear equal AReaL's
    ppo_actor_loss_fn fed by AReaL's loglinear π_prox (the current micro-batch's ℓθ)."""
    eps = 0.2
    actor = PPOActor(
        PPOActorConfig(use_decoupled_loss=True, prox_logp_method="loglinear", eps_clip=eps)
    )
    g = torch.Generator().manual_seed(lag)
    for _ in range(20):
        batch, lb, adv, m, versions = _batch(g, 3, 7, v_b=10 - lag, v_theta=10)
        # ℓθ a few tenths away from ℓb, so some ratios leave [1−ε, 1+ε]
        base = (lb + torch.randn(lb.shape, generator=g) * 0.6).detach()
        lt = base.clone().requires_grad_(True)
        loss, stats = actor.compute_loss(batch, logprobs=lt, entropy=None)
        (grad,) = torch.autograd.grad(loss, lt)

        lt_peer = base.clone().requires_grad_(True)
        prox_peer = areal_loglinear(lb, lt_peer.detach(), versions, 10)
        peer = areal_clip_loss(lt_peer, prox_peer, adv, m, eps)
        (grad_peer,) = torch.autograd.grad(peer, lt_peer)

        torch.testing.assert_close(loss, peer, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, grad_peer, rtol=1e-5, atol=1e-7)
        # the log-ratio the loss saw is (1 − α)(ℓθ − ℓb) with α = (lag − 1)/lag
        want = ((base - lb) / lag)[m]
        torch.testing.assert_close(stats["approx_kl"][m], want, rtol=1e-5, atol=1e-6)


def test_compute_advantages_aligns_versions_with_the_token_they_describe():
    """Through the whole actor (token-layout batch, AReaL's keys ``versions`` and
    ``current_version``): every generated token is interpolated with its own version, the
    prompt positions not at all, and no forward pass or 'prox_logp' is needed."""
    cfg = PPOActorConfig(use_decoupled_loss=True, prox_logp_method="loglinear")
    actor = PPOActor(cfg)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])
    behaviour = torch.tensor([[0.0, 0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -0.9, -1.1, 0.0]])
    current = torch.tensor([[-9.0, -0.1, -0.2, -1.0, -0.4], [-5.0, -0.1, -0.4, -0.6, -7.0]])
    versions = torch.where(loss_mask.bool(), 6, -1)  # v_θ = 8: α = 1/2
    batch = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "loss_mask": loss_mask,
        "logprobs": behaviour,
        "rewards": torch.tensor([1.0, -1.0]),
        "versions": versions,
        "current_version": 8,
        "current_logprobs": current,
    }
    actor.compute_advantages(batch)
    _, stats = actor.compute_loss(batch)
    m = batch["mask"]
    lt, lb = torch.roll(current, -1, -1), torch.roll(behaviour, -1, -1)
    torch.testing.assert_close(stats["approx_kl"][m], ((lt - lb) / 2)[m])
    assert m.sum() == loss_mask.sum()


def test_actor_refuses_loglinear_without_versions():
    actor = PPOActor(PPOActorConfig(use_decoupled_loss=True, prox_logp_method="loglinear"))
    batch = {
        "input_ids": torch.zeros(1, 3, dtype=torch.long),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "loss_mask": torch.tensor([[0, 1, 1]]),
        "logprobs": torch.tensor([[0.0, -1.0, -1.0]]),
        "rewards": torch.tensor([1.0]),
        "current_logprobs": torch.tensor([[0.0, -1.0, -1.0]]),
    }
    with pytest.raises(ValueError, match="the batch needs 'versions' and 'current_version'"):
        actor.compute_advantages(batch)


# -- configuration: CLI, file, grid, export -----------------------------------------------------


@pytest.mark.parametrize(
    "sets,expect",
    [
        (
            ["ppo.prox_logp_method=loglinear"],
            "--set ppo.prox_logp_method=loglinear: 'loglinear' acts only with "
            "use_decoupled_loss=true",
        ),
        (
            ["ppo.use_decoupled_loss=true", "ppo.prox_logp_method=loglinear"],
            "'loglinear' acts only with rollout.staleness >= 2 or rollout.async.max_staleness >= 2 (the largest lag here is 0",
        ),
        (
            [
                "ppo.use_decoupled_loss=true",
                "rollout.staleness=1",
                "ppo.prox_logp_method=loglinear",
            ],
            "'loglinear' acts only with rollout.staleness >= 2 or rollout.async.max_staleness >= 2 (the largest lag here is 1",
        ),
        (
            [
                "ppo.use_decoupled_loss=true",
                "ppo.recompute_logprob=true",
                "rollout.staleness=2",
                "ppo.prox_logp_method=loglinear",
            ],
            "skips the forward pass that recompute_logprob=true asks for",
        ),
        (["ppo.prox_logp_method=linear"], "must be one of 'recompute', 'loglinear'"),
    ],
)
def test_cli_refuses_a_loglinear_that_cannot_act(sets, expect, tmp_path):
    results = tmp_path / "results"
    args = ["run", "--results-dir", str(results)]
    for s in sets:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    err = r.stderr if r.stderr is not None else r.output
    assert r.exit_code == 2, r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in r.output
    assert expect in lines[0], lines[0]
    assert not results.exists() or not any(results.iterdir())


def test_from_a_file_and_as_a_grid_axis(tmp_path: Path):
    f = tmp_path / "run.yaml"
    f.write_text(
        yaml.safe_dump({**STALE, "ppo": {**STALE["ppo"], "prox_logp_method": "loglinear"}})
    )
    cfg = load_run_config(f)
    assert cfg.ppo.prox_logp_method == "loglinear" and cfg.ppo.interpolates_proximal
    assert not cfg.ppo.recomputes_proximal

    base = {k: v for k, v in STALE.items() if k != "steps"}
    exp = tmp_path / "exp.yaml"
    doc = {
        "name": "prox",
        "base": base,
        "grid": {"ppo.prox_logp_method": ["recompute", "loglinear"]},
        "seeds": 1,
        "steps": 2,
    }
    exp.write_text(yaml.safe_dump(doc))
    spec = load_experiment(exp)
    assert sorted(c.overrides["ppo.prox_logp_method"] for c in spec.cells) == [
        "loglinear",
        "recompute",
    ]
    # the same axis on a base without staleness is refused, naming the field
    doc["base"] = {**base, "rollout": {**base["rollout"], "staleness": 0}}
    exp.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="prox_logp_method.*rollout.staleness >= 2"):
        load_experiment(exp)


def test_exports():
    cfg = build_run_config(STALE, {"ppo.prox_logp_method": "loglinear"})
    areal = yaml.safe_load(export_cell(cfg, "areal"))
    assert areal["actor"]["prox_logp_method"] == "loglinear"
    assert areal["actor"]["use_decoupled_loss"] is True
    assert areal["rollout"]["max_head_offpolicyness"] == 2
    default = yaml.safe_load(export_cell(build_run_config(STALE), "areal"))
    assert default["actor"]["prox_logp_method"] == "recompute"
    verl = export_cell(cfg, "verl")
    assert "# ppo.prox_logp_method=loglinear: verl has no such option" in verl
    assert "prox_logp_method" not in "".join(
        ln for ln in verl.splitlines() if not ln.startswith("#")
    )
    trl = export_cell(cfg, "trl")
    assert "# ppo.prox_logp_method: not expressible in TRL" in trl


# -- end to end: the forward pass is skipped ------------------------------------------------------


def test_a_loglinear_run_skips_the_proximal_forward(tmp_path, monkeypatch):
    """Two tiny stale runs, counting every learner forward: loglinear makes exactly one fewer
    per step (the π_prox recompute), logs no recompute time, and trains differently."""
    original = logprobs_module.forward_logprobs
    out = {}
    for method in ("recompute", "loglinear"):
        calls = [0]

        def counted(*a, _calls=calls, **k):
            _calls[0] += 1
            return original(*a, **k)

        monkeypatch.setattr(logprobs_module, "forward_logprobs", counted)
        res = run(
            build_run_config(STALE, {"ppo.prox_logp_method": method}),
            results_dir=tmp_path / method,
        )
        assert res.status == "completed", res.status
        out[method] = (calls[0], res.history)
    (n_re, h_re), (n_ll, h_ll) = out["recompute"], out["loglinear"]
    steps = STALE["steps"]
    assert n_re - n_ll == steps, (n_re, n_ll)
    assert all(t > 0 for t in h_re["perf/prox_logp_time"])
    assert h_ll["perf/prox_logp_time"] == [0.0] * steps
    # from step 2 the batch is 2 updates old: α = 1/2, so π_prox (and the ratio) differ
    assert h_re["policy/approx_kl_k1"][2:] != h_ll["policy/approx_kl_k1"][2:]
