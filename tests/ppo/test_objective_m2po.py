"""M2PO: golden values by hand, AReaL's procedure (the mask it narrows loss_mask with, then its
PPO loss), a naive loop, composition with the decoupled loss / rejection sampling / every
aggregation, config errors, a short CLI run."""

import math
import random

import pytest
import torch

from harness.config import build_run_config
from harness.core.configtools import from_dict
from harness.ppo import PPOActorConfig, RejectionSampling, ppo_actor_loss
from harness.ppo.objectives import objective_loss
from harness.ppo.objectives.m2po import m2_keep, m2po_loss
from tests.support.objective_cli import assert_trains_through_the_cli
from tests.support.objective_rows import assert_refused_in_one_line

F64 = torch.float64
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def test_golden_mask_loss_and_gradient():
    # ℓp = ℓθ (r = 1); ℓb − ℓp = [0.1, 0.7, 0.14, 0.45] → M2 = [0.01, 0.49, 0.0196, 0.2025].
    # Means after dropping the k largest: k=0 0.18053, k=1 0.07737, k=2 0.0148 < 0.04: the
    # two largest (tokens 1 and 3) go.  Kept: −A·r = −2, +1 over 2 kept tokens (not 4).
    lt = torch.tensor([[-1.0, -2.0, -0.5, -1.5]], dtype=F64, requires_grad=True)
    lp = lt.detach().clone()
    lb = lp + torch.tensor([[0.1, 0.7, 0.14, 0.45]], dtype=F64)
    adv = torch.tensor([[2.0, 3.0, -1.0, 5.0]], dtype=F64)
    m = torch.ones(1, 4, dtype=torch.bool)
    loss, st = m2po_loss(lt, lp, lb, adv, m)
    loss.backward()
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2, rel=1e-12)
    assert lt.grad.tolist()[0] == pytest.approx([-1.0, 0.0, 0.5, 0.0], rel=1e-12)
    assert st["silenced_mask"].tolist() == [[False, True, False, True]]
    assert not st["clip_mask"].any()
    # τ = 0.1 drops only the largest (k=1: 0.0774 < 0.1); τ = 0.181 drops none (0.1805 < τ)
    assert m2_keep((lb - lp) ** 2, m, 0.1).tolist() == [[True, False, True, True]]
    assert m2_keep((lb - lp) ** 2, m, 0.181).tolist() == [[True, True, True, True]]


def test_when_no_drop_gets_below_the_bound_only_the_smallest_is_kept():
    sm = torch.tensor([[0.09, 0.25, 0.16], [0.5, 9.0, 0.0]], dtype=F64)
    valid = torch.tensor([[True, True, True], [False, False, False]])
    assert m2_keep(sm, valid, 0.04).tolist() == [[True, False, False], [False] * 3]
    # a mean equal to τ is not below it: [0.03, 0.01] has mean 0.02, so only 0.01 stays
    sm = torch.tensor([[0.5, 0.03, 0.5, 0.01]], dtype=F64)
    one = torch.ones(1, 4, dtype=torch.bool)
    assert m2_keep(sm, one, 0.02).tolist() == [[False, False, False, True]]
    assert m2_keep(sm, one, 0.0201).tolist() == [[False, True, False, True]]
    # ties drop in index order: one of two equal values goes, the first
    sm = torch.tensor([[0.5, 0.5, 0.01]], dtype=F64)
    assert m2_keep(sm, one[:, :3], 0.3).tolist() == [[False, True, True]]


# ------------------------------------------------------------------ AReaL's procedure


def areal_m2_mask(old, prox, mask, threshold):
    """AReaL's M2PO mask as the reference describes it: on the loss call's valid tokens, sort
    (ℓb − ℓp)² in descending order and mask the fewest largest that bring the mean of the rest
    below τ (all but one if none does); the result narrows loss_mask."""
    m2 = ((old - prox) ** 2)[mask]
    n = m2.numel()
    ordered, idx = torch.sort(m2, descending=True, stable=True)
    k = n - 1
    for j in range(n):
        if ordered[j:].mean() < threshold:
            k = j
            break
    flat = torch.ones(n, dtype=torch.bool)
    flat[idx[:k]] = False
    out = mask.clone()
    out[mask] = flat
    return out


def random_batch(seed, B=4, T=9, stale=0.25):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lt = lp + torch.randn(B, T, generator=g, dtype=F64) * 0.15
    lb = lp + torch.randn(B, T, generator=g, dtype=F64) * stale
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[0, 0] = True
    return lt, lp, lb, adv, mask


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("threshold", [0.005, 0.04, 0.2])
def test_equals_ppo_on_the_mask_areal_narrows(seed, threshold):
    lt, lp, lb, adv, mask = random_batch(seed, stale=0.1 + 0.05 * seed)
    narrowed = areal_m2_mask(lb, lp, mask, threshold)
    clip = {"eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": 3.0}
    x = lt.clone().requires_grad_(True)
    want, want_st = ppo_actor_loss(x, lp, lb, adv, narrowed, **clip)
    (g_want,) = torch.autograd.grad(want, x)
    y = lt.clone().requires_grad_(True)
    got, st = m2po_loss(y, lp, lb, adv, mask, threshold=threshold, **clip)
    (g_got,) = torch.autograd.grad(got, y)
    assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-15)
    assert torch.allclose(g_got, g_want, rtol=1e-12, atol=1e-15)
    assert torch.equal(st["clip_mask"], want_st["clip_mask"])
    assert torch.equal(st["silenced_mask"], (want_st["silenced_mask"] | ~narrowed) & mask)


# ------------------------------------------------------------------ naive per-token reference


def naive(lt, lp, lb, A, m, *, tau, eps, eps_hi, agg):
    B, T = len(lt), len(lt[0])
    cells = [(lb[i][t] - lp[i][t]) ** 2 for i in range(B) for t in range(T) if m[i][t]]
    where = [(i, t) for i in range(B) for t in range(T) if m[i][t]]
    order = sorted(range(len(cells)), key=lambda j: (-cells[j], j))
    k = len(cells) - 1
    for j in range(len(cells)):
        rest = [cells[q] for q in order[j:]]
        if sum(rest) / len(rest) < tau:
            k = j
            break
    kept = [[False] * T for _ in range(B)]
    for i, t in where:
        kept[i][t] = True
    for q in order[:k]:
        i, t = where[q]
        kept[i][t] = False
    per = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if kept[i][t]:
                r = math.exp(lt[i][t] - lp[i][t])
                rc = min(max(r, 1 - eps), 1 + eps_hi)
                per[i][t] = max(-A[i][t] * r, -A[i][t] * rc)
    n = max(sum(map(sum, kept)), 1)
    rows = [i for i in range(B) if any(kept[i])]
    if agg == "token-mean":
        return sum(map(sum, per)) / n
    if agg == "seq-mean-token-mean":
        return sum(sum(per[i]) / sum(kept[i]) for i in rows) / max(len(rows), 1)
    if agg == "seq-mean-token-sum":
        return sum(sum(per[i]) for i in rows) / max(len(rows), 1)
    return sum(sum(per[i]) for i in rows) / (max(len(rows), 1) * T)


@pytest.mark.parametrize("case", range(60))
def test_matches_a_naive_per_token_loop(case):
    rng = random.Random(300 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 7)
    lp = [[-rng.uniform(0.01, 4) for _ in range(T)] for _ in range(B)]
    lt = [[x + rng.gauss(0, 0.3) for x in r] for r in lp]
    lb = [[x + rng.gauss(0, rng.choice([0.05, 0.2, 0.6])) for x in r] for r in lp]
    A = [[rng.gauss(0, 2) for _ in range(T)] for _ in range(B)]
    m = [[rng.random() < 0.8 for _ in range(T)] for _ in range(B)]
    m[0][0] = True
    tau, eps, eps_hi = rng.choice([0.01, 0.04, 0.3]), rng.choice([0.1, 0.2]), 0.28
    agg = rng.choice(AGGS)
    want = naive(lt, lp, lb, A, m, tau=tau, eps=eps, eps_hi=eps_hi, agg=agg)
    t = [torch.tensor(x, dtype=F64) for x in (lt, lp, lb, A)]
    got, _ = m2po_loss(
        *t,
        torch.tensor(m),
        threshold=tau,
        eps_clip=eps,
        eps_clip_higher=eps_hi,
        loss_agg_mode=agg,
    )
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ composition


def test_areal_example_decoupled_loss_with_rejection_sampling():
    # AReaL's gsm8k_m2po example: decoupled loss, rejection sampling (ratio, upper 5).  RS
    # tokens stay in the denominator, M2PO-dropped tokens leave it.
    lt, lp, lb, adv, mask = random_batch(5, stale=0.5)
    rs = RejectionSampling(upper=1.5)
    cfg = from_dict(
        PPOActorConfig,
        {
            "policy_loss": "m2po",
            "use_decoupled_loss": True,
            "rejection_sampling": {"upper": 1.5},
            "m2po": {"threshold": 0.04},
        },
    )
    got, st = objective_loss(cfg, lt, lp, lb, adv, mask)
    narrowed = areal_m2_mask(lb, lp, mask, 0.04)
    want, want_st = ppo_actor_loss(lt, lp, lb, adv, narrowed, rejection_sampling=rs)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert torch.equal(st["behave_mask"], want_st["behave_mask"])
    assert 0 < int((~narrowed & mask).sum()) < int(mask.sum())


def test_without_a_stale_behaviour_policy_it_is_ppo():
    lt, lp, _, adv, mask = random_batch(2)
    got, st = m2po_loss(lt, lp, lp, adv, mask)
    want, want_st = ppo_actor_loss(lt, lp, lp, adv, mask)
    assert got.item() == want.item() and torch.equal(st["silenced_mask"], want_st["silenced_mask"])


@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_through_the_config_and_one_row(agg):
    lt, lp, lb, adv, mask = random_batch(11, stale=0.4)
    cfg = from_dict(
        PPOActorConfig, {"policy_loss": "m2po", "loss_agg_mode": agg, "use_decoupled_loss": True}
    )
    got, _ = objective_loss(cfg, lt, lp, lb, adv, mask)
    want, _ = m2po_loss(lt, lp, lb, adv, mask, loss_agg_mode=agg)
    assert got.item() == want.item()
    narrowed = areal_m2_mask(lb, lp, mask, 0.04)
    ppo, _ = ppo_actor_loss(lt, lp, lb, adv, narrowed, loss_agg_mode=agg)
    assert got.item() == pytest.approx(ppo.item(), rel=1e-12)
    one_row, st = m2po_loss(lt[0], lp[0], lb[0], adv[0], mask[0], loss_agg_mode=agg)
    first, _ = m2po_loss(lt[:1], lp[:1], lb[:1], adv[:1], mask[:1], loss_agg_mode=agg)
    assert one_row.item() == first.item() and st["silenced_mask"].shape == (lt.shape[1],)


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"ppo.m2po.threshold": 0.1}, "ppo.m2po.threshold means nothing under policy_loss 'ppo'"),
        (
            {"ppo.policy_loss": "m2po", "ppo.importance_sampling_level": "sequence"},
            "importance_sampling_level 'sequence' means nothing under policy_loss 'm2po'",
        ),
        ({"ppo.policy_loss": "m2po", "ppo.m2po.threshold": 0.0}, "ppo.m2po.threshold: must be"),
    ],
)
def test_bad_m2po_options_are_one_line(over, msg):
    assert_refused_in_one_line(over, msg)


def test_reads_the_clip_options():
    cfg = build_run_config({}, {"ppo.policy_loss": "m2po", "ppo.eps_clip": 0.3})
    assert cfg.ppo.eps_clip == 0.3 and cfg.ppo.m2po.threshold == 0.04


def test_areal_export_names_m2_threshold():
    import yaml

    from harness.peers.export import export_areal

    cfg = build_run_config(
        {}, {"ppo.policy_loss": "m2po", "ppo.m2po.threshold": 0.08, "ppo.use_decoupled_loss": True}
    )
    text = export_areal(cfg)
    actor = yaml.safe_load(text)["actor"]
    assert actor["m2_threshold"] == 0.08 and actor["use_decoupled_loss"] is True
    assert "AReaL's actor loss is PPO-clip" not in text
    assert "# ppo.policy_loss=m2po: AReaL applies the mask per micro-batch" in text


def test_short_train_through_the_cli(tmp_path):
    assert_trains_through_the_cli(
        tmp_path, "ppo.policy_loss=m2po", "ppo.use_decoupled_loss=true", "rollout.staleness=1"
    )
