"""DPPO: golden values by hand, a naive per-token loop, the peers' gradients, composition with
the decoupled loss / behaviour weights / every aggregation, config errors, a short CLI run."""

import math
import random

import pytest
import torch

from harness.config import ConfigError, build_run_config
from harness.core.configtools import from_dict
from harness.ppo import PPOActorConfig
from harness.ppo.objectives import objective_loss
from harness.ppo.objectives.dppo import dppo_loss
from tests.support.objective_cli import assert_trains_through_the_cli
from tests.support.objective_rows import assert_config_and_one_row, assert_refused_in_one_line

F64 = torch.float64
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# One sequence of five tokens: anchor probabilities p_μ, new probabilities p_θ, advantages.
P_MU = [0.5, 0.5, 0.1, 0.9, 0.01]
P_TH = [0.8, 0.6, 0.05, 0.5, 0.15]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0]


def golden_inputs():
    lt = torch.tensor([P_TH], dtype=F64).log().requires_grad_(True)
    lmu = torch.tensor([P_MU], dtype=F64).log()
    return lt, lmu, torch.tensor([ADV], dtype=F64), torch.ones(1, 5, dtype=torch.bool)


def test_golden_binary_tv():
    # d = p_θ − p_μ = [0.3, 0.1, −0.05, −0.4, 0.14]; δ = 0.2: token 0 (A>0, d>0.2) and token 3
    # (A<0, d<−0.2) drop.  Kept: −A·r = −1.2, +0.5, −15; token-mean over 5: −15.7 / 5.
    lt, lmu, adv, m = golden_inputs()
    loss, st = dppo_loss(lt, lmu, lmu, adv, m)
    loss.backward()
    assert loss.item() == pytest.approx(-3.14, rel=1e-12)
    assert st["silenced_mask"].tolist() == [[True, False, False, True, False]]
    assert st["clip_high_mask"].tolist() == [[True, False, False, False, False]]
    assert st["clip_low_mask"].tolist() == [[False, False, False, True, False]]
    # dL/dℓθ = −A·r / 5 on kept tokens, 0 on dropped ones
    assert lt.grad.tolist()[0] == pytest.approx([0.0, -0.24, 0.1, 0.0, -3.0], rel=1e-12)


def test_golden_binary_kl():
    # D (binary KL, worked by hand): token 1: ½ln(5/6) + ½ln(5/4) = 0.020411 (kept);
    # token 2: 0.1·ln 2 + 0.9·ln(0.9/0.95) = 0.020655 (kept); token 4: 0.01·ln(1/15) +
    # 0.99·ln(0.99/0.85) = 0.123863 > 0.05 with A>0 and d>0: dropped (TV kept it).
    d1 = 0.5 * math.log(5 / 6) + 0.5 * math.log(5 / 4)
    d4 = 0.01 * math.log(1 / 15) + 0.99 * math.log(0.99 / 0.85)
    assert d1 == pytest.approx(0.020411, abs=1e-6) and d4 == pytest.approx(0.123863, abs=1e-6)
    lt, lmu, adv, m = golden_inputs()
    loss, st = dppo_loss(lt, lmu, lmu, adv, m, divergence="binary_kl")
    assert loss.item() == pytest.approx((-1.2 + 0.5) / 5, rel=1e-12)
    assert st["silenced_mask"].tolist() == [[True, False, False, True, True]]
    # a wider bound keeps token 4 (D = 0.1239 < 0.2) but still drops 0 (0.2231) and 3 (0.3681)
    loss, st = dppo_loss(lt, lmu, lmu, adv, m, divergence="binary_kl", delta_high=0.2)
    assert st["silenced_mask"].tolist() == [[True, False, False, True, False]]
    assert loss.item() == pytest.approx(-3.14, rel=1e-12)


def test_moves_in_the_safe_direction_never_drop():
    # A > 0 and p falls, A < 0 and p rises: far outside any bound, still kept.
    lt = torch.tensor([[math.log(0.01), math.log(0.99)]], dtype=F64)
    lmu = torch.tensor([[math.log(0.9), math.log(0.05)]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    for divergence in ("binary_tv", "binary_kl"):
        _, st = dppo_loss(
            lt, lmu, lmu, adv, torch.ones(1, 2, dtype=torch.bool), divergence=divergence
        )
        assert not st["silenced_mask"].any()


# ------------------------------------------------------------------ naive per-token reference


def naive(lt, lp, lb, A, m, *, divergence, lo, hi, anchor, agg):
    """Python floats, one token at a time, then the aggregation by its definition."""
    B, T = len(lt), len(lt[0])
    per = [[0.0] * T for _ in range(B)]
    drops = [[False] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not m[i][t]:
                continue
            mu = lb[i][t] if anchor == "behaviour" else lp[i][t]
            pt, pm = math.exp(lt[i][t]), math.exp(mu)
            d = pt - pm
            kl = pm * (mu - lt[i][t]) + (1 - pm) * math.log((1 - pm + 1e-8) / (1 - pt + 1e-8))
            a = A[i][t]
            if divergence == "binary_tv":
                drop = (a > 0 and d > hi) or (a < 0 and d < -lo)
            else:
                drop = (a > 0 and d > 0 and kl > hi) or (a < 0 and d < 0 and kl > lo)
            drops[i][t] = drop
            r = math.exp(max(-20.0, min(20.0, lt[i][t] - mu)))
            per[i][t] = 0.0 if drop else -a * r
    n = max(sum(map(sum, m)), 1)
    rows = [i for i in range(B) if any(m[i])]
    if agg == "token-mean":
        return sum(map(sum, per)) / n, drops
    if agg == "seq-mean-token-mean":
        return sum(sum(per[i]) / sum(m[i]) for i in rows) / max(len(rows), 1), drops
    if agg == "seq-mean-token-sum":
        return sum(sum(per[i]) for i in rows) / max(len(rows), 1), drops
    return sum(sum(per[i]) for i in rows) / (max(len(rows), 1) * T), drops


@pytest.mark.parametrize("case", range(120))
def test_matches_a_naive_per_token_loop(case):
    rng = random.Random(900 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 6)
    lt = [[math.log(rng.uniform(0.005, 0.995)) for _ in range(T)] for _ in range(B)]
    lp = [[min(x + rng.gauss(0, 0.6), -1e-3) for x in row] for row in lt]
    lb = [[min(x + rng.gauss(0, 0.6), -1e-3) for x in row] for row in lp]
    A = [[rng.choice([0.0, rng.gauss(0, 2)]) for _ in range(T)] for _ in range(B)]
    m = [[rng.random() < 0.8 for _ in range(T)] for _ in range(B)]
    m[0][0] = True
    divergence = rng.choice(["binary_tv", "binary_kl"])
    anchor = rng.choice(["behaviour", "proximal"])
    lo, hi = rng.choice([None, 0.02, 0.1, 0.3]), rng.choice([None, 0.02, 0.1, 0.3])
    agg = rng.choice(AGGS)
    default = 0.2 if divergence == "binary_tv" else 0.05
    want, drops = naive(
        lt,
        lp,
        lb,
        A,
        m,
        divergence=divergence,
        lo=default if lo is None else lo,
        hi=default if hi is None else hi,
        anchor=anchor,
        agg=agg,
    )
    tens = [torch.tensor(x, dtype=F64) for x in (lt, lp, lb, A)]
    mask = torch.tensor(m)
    got, st = dppo_loss(
        *tens,
        mask,
        divergence=divergence,
        delta_low=lo,
        delta_high=hi,
        anchor=anchor,
        loss_agg_mode=agg,
    )
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert st["silenced_mask"].tolist() == drops


# ------------------------------------------------------------------ the peers' gradients


def random_batch(seed, B=3, T=7, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    lb = torch.log(torch.rand(B, T, generator=g, dtype=F64) * 0.98 + 0.01)
    lt = (lb + torch.randn(B, T, generator=g, dtype=F64) * spread).clamp(max=-1e-4)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.85
    mask[0, 0] = True
    return lt, lb, adv, mask


def keep_mask(lt, lmu, adv, lo, hi):
    d = lt.exp() - lmu.exp()
    return ~(((adv > 0) & (d > hi)) | ((adv < 0) & (d < -lo)))


@pytest.mark.parametrize("seed", range(12))
def test_gradient_equals_skyrl_and_verl_surrogates(seed):
    lt, lb, adv, mask = random_batch(seed)
    x = lt.clone().requires_grad_(True)
    loss, _ = dppo_loss(x, lb, lb, adv, mask)
    (g_ours,) = torch.autograd.grad(loss, x)
    keep = (keep_mask(lt, lb, adv, 0.2, 0.2) & mask).to(F64)
    n = mask.sum()
    # SkyRL: −A·exp(clamp(ℓθ − ℓμ, ±20))·m, summed over the mask, over the token count
    y = lt.clone().requires_grad_(True)
    sky = (-adv * torch.exp((y - lb).clamp(-20, 20)) * keep).sum() / n
    (g_sky,) = torch.autograd.grad(sky, y)
    assert loss.item() == pytest.approx(sky.item(), rel=1e-12)
    assert torch.allclose(g_ours, g_sky, rtol=1e-12, atol=1e-15)
    # verl: −A·sg(min(r, c))·ℓθ·m with c = 3: the same gradient while r ≤ c
    z = lt.clone().requires_grad_(True)
    r = torch.exp(lt - lb)
    assert bool((r[mask] <= 3.0).all())
    ver = (-adv * r.clamp(max=3.0) * z * keep).sum() / n
    (g_verl,) = torch.autograd.grad(ver, z)
    assert torch.allclose(g_ours, g_verl, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------ composition


def test_anchor_and_decoupled_loss_with_behaviour_weights():
    lt, lb, adv, mask = random_batch(3, spread=0.4)
    g = torch.Generator().manual_seed(5)
    lp = (lb + torch.randn(lb.shape, generator=g, dtype=F64) * 0.3).clamp(max=-1e-4)
    base = {"policy_loss": "dppo", "use_decoupled_loss": True}
    # token_truncate with cap 2; float64 inputs give a float64 behaviour weight
    w = torch.exp(lp - lb).clamp(max=2.0) * mask
    for anchor, lmu in (("behaviour", lb), ("proximal", lp)):
        cfg = from_dict(
            PPOActorConfig,
            {
                **base,
                "behave_imp_weight_mode": "token_truncate",
                "behave_imp_weight_cap": 2.0,
                "dppo": {"anchor": anchor},
            },
        )
        got, st = objective_loss(cfg, lt, lp, lb, adv, mask)
        keep = keep_mask(lt, lmu, adv, 0.2, 0.2) & mask
        want = (torch.where(keep, -adv * torch.exp(lt - lmu), 0.0) * w).sum() / mask.sum()
        assert got.item() == pytest.approx(want.item(), rel=1e-9), anchor
        assert torch.equal(st["silenced_mask"], ~keep & mask)
        assert "behave_imp_weight" in st
    # the two anchors differ once π_prox ≠ π_behave
    a = objective_loss(from_dict(PPOActorConfig, {**base}), lt, lp, lb, adv, mask)[0]
    b = objective_loss(
        from_dict(PPOActorConfig, {**base, "dppo": {"anchor": "proximal"}}), lt, lp, lb, adv, mask
    )[0]
    assert a.item() != pytest.approx(b.item(), rel=1e-6)


@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_through_the_config_and_one_row(agg):
    assert_config_and_one_row("dppo", dppo_loss, random_batch(11), agg, "silenced_mask")


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"ppo.dppo.delta_low": 0.1}, "ppo.dppo.delta_low means nothing under policy_loss 'ppo'"),
        (
            {"ppo.policy_loss": "dppo", "ppo.importance_sampling_level": "sequence"},
            "importance_sampling_level 'sequence' means nothing under policy_loss 'dppo'",
        ),
        (
            {"ppo.policy_loss": "dppo", "ppo.dppo.divergence": "tv"},
            "ppo.dppo.divergence: must be one of 'binary_tv', 'binary_kl'",
        ),
        ({"ppo.policy_loss": "dppo", "ppo.dppo.delta_high": 0.0}, "ppo.dppo.delta_high: must be"),
        ({"ppo.policy_loss": "dppo", "ppo.eps_clip": 0.3}, "ppo.eps_clip means nothing under"),
    ],
)
def test_bad_dppo_options_are_one_line(over, msg):
    assert_refused_in_one_line(over, msg)


def test_short_train_through_the_cli(tmp_path):
    assert_trains_through_the_cli(
        tmp_path, "ppo.policy_loss=dppo", "ppo.dppo.divergence=binary_kl", "rollout.staleness=1"
    )


# ------------------------------------------------------------------ verl's own surrogate


def verl_dppo(old_log_prob, log_prob, advantages, response_mask, kind, lo, hi, c):
    """verl-project/verl verl/trainer/ppo/core_algos.py ``compute_policy_loss_dppo_tv`` /
    ``compute_policy_loss_dppo_kl``, line for line, with agg_loss token-mean."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    truncated_ratio = torch.clamp(ratio, max=c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if kind == "binary_tv":
        valid_positive_mask = (prob - old_prob) <= hi
        valid_negative_mask = (prob - old_prob) >= -lo
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= hi) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= lo) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask)
    valid_mask = valid_mask.detach().to(log_prob.dtype)
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    m = response_mask.to(log_prob.dtype)
    loss = (pg_losses * m).sum() / m.sum().clamp(min=1)
    lower = ((ratio > c).to(m.dtype) * valid_mask * m).sum() / m.sum()
    return loss, lower


@pytest.mark.parametrize("kind", ["binary_tv", "binary_kl"])
def test_truncated_is_is_verls_dppo_loss_and_gradient(kind):
    """200 float64 draws: surrogate truncated_is with ratio_cap c, anchor proximal, equals
    verl's dppo_tv / dppo_kl (loss, gradient and pg_clipfrac_lower) to 1e-12; surrogate ratio
    has another loss value."""
    g = torch.Generator().manual_seed(35)
    capped = dropped = differs = 0
    for _ in range(200):
        B, T = (
            int(torch.randint(2, 6, (1,), generator=g)),
            int(torch.randint(2, 8, (1,), generator=g)),
        )
        lp = torch.log(torch.rand(B, T, generator=g, dtype=F64) * 0.98 + 0.01)
        lb = lp + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
        # log-probs stay below 0 (a probability above 1 has no binary KL)
        lt = (lp + torch.randn(B, T, generator=g, dtype=F64) * 1.2).clamp(max=-1e-3)
        adv = torch.randn(B, T, generator=g, dtype=F64)
        mask = torch.rand(B, T, generator=g) < 0.8
        mask[:, 0] = True
        lo, hi, c = (0.2, 0.25, 1.5) if kind == "binary_tv" else (0.05, 0.08, 1.5)
        x = lt.clone().requires_grad_(True)
        want, lower = verl_dppo(lp, x, adv, mask, kind, lo, hi, c)
        (g_want,) = torch.autograd.grad(want, x)
        y = lt.clone().requires_grad_(True)
        kw = dict(divergence=kind, delta_low=lo, delta_high=hi, anchor="proximal")
        got, st = dppo_loss(y, lp, lb, adv, mask, surrogate="truncated_is", ratio_cap=c, **kw)
        (g_got,) = torch.autograd.grad(got, y)
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-13)
        frac = float(st["reweighted_mask"].sum()) / float(mask.sum())
        assert frac == pytest.approx(float(lower), abs=1e-12)
        capped += int(st["reweighted_mask"].any())
        dropped += int(st["silenced_mask"].any())
        ratio, _ = dppo_loss(lt, lp, lb, adv, mask, **kw)
        differs += not torch.allclose(ratio, got.detach())
    assert capped > 50 and dropped > 50  # both the cap and the trust region act
    assert differs > 150  # the loss values differ unless every token is dropped


def test_truncated_is_cap_defaults_to_verls_actor_default():
    lt, lmu, adv, m = golden_inputs()
    a, _ = dppo_loss(lt, lmu, lmu, adv, m, surrogate="truncated_is")
    b, _ = dppo_loss(lt, lmu, lmu, adv, m, surrogate="truncated_is", ratio_cap=3.0)
    assert a.item() == b.item()


def test_ratio_cap_without_truncated_is_is_one_line():
    with pytest.raises(ConfigError) as err:
        build_run_config({}, {"ppo.policy_loss": "dppo", "ppo.dppo.ratio_cap": 5.0})
    assert "dppo.ratio_cap means nothing with dppo.surrogate 'ratio'" in str(err.value)
    assert "\n" not in str(err.value)


def test_verl_export_says_which_dppo_surrogate():
    from harness.peers.export import export_verl

    A = "actor_rollout_ref.actor"
    over = {"ppo.policy_loss": "dppo", "ppo.dppo.delta_low": 0.1, "ppo.dppo.delta_high": 0.3}
    text = export_verl(build_run_config({}, {**over, "ppo.dppo.surrogate": "truncated_is"}))
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert f"{A}.clip_ratio_low=0.1" in lines and f"{A}.clip_ratio_high=0.3" in lines
    assert f"{A}.clip_ratio_c=3.0" in lines and f"{A}.policy_loss.loss_mode=dppo_tv" in lines
    assert len({x.split("=")[0] for x in lines}) == len(lines)  # every key once
    assert "surrogate=ratio" not in text and "c_clip null" not in text
    text = export_verl(build_run_config({}, over))
    assert f"{A}.clip_ratio_c=1e9" in text.splitlines()
    assert "# ppo.dppo.surrogate=ratio: verl's dppo loss is −A·sg(min(r, clip_ratio_c))" in text
