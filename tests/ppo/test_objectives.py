"""CISPO, SAPO, GMPO, Clip-Cov, KL-Cov: golden values worked by hand, a naive per-token loop
reference, and hypothesis properties.  (Agreement with TRL's own loss: test_objectives_trl.py.)"""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.ppo import RejectionSampling, ppo_actor_loss
from harness.ppo.config import PPOActorConfig
from harness.ppo.objectives import (
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    sapo_loss,
)

settings.register_profile("harness", deadline=None, max_examples=60)
settings.load_profile("harness")

T = torch.tensor
LN6, LN_HALF = math.log(6.0), math.log(0.5)
# Two sequences of two tokens, the last one padding.  δ = ℓθ − ℓp = [[ln 6, ln 0.5], [0, ·]],
# so r = [[6, 0.5], [1, ·]].
LT = T([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
LP = LT - T([[LN6, LN_HALF], [0.0, 0.0]], dtype=torch.float64)
ADV = T([[1.0, -2.0], [0.5, 1.0]], dtype=torch.float64)
MASK = T([[1, 1], [1, 0]]).bool()


def run(fn, **kw):
    lt = LT.clone().requires_grad_(True)
    loss, stats = fn(lt, LP, LP, ADV, MASK, **kw)
    loss.backward()
    return loss.item(), lt.grad, stats


# ------------------------------------------------------------------ golden values by hand


def test_cispo_golden():
    # r̂ = min(r, 5) = [[5, 0.5], [1]];  L = −r̂·A·ℓθ:
    #   (0,0): −5·1·(−1) = 5;  (0,1): −0.5·(−2)·(−2) = −2;  (1,0): −1·0.5·(−0.5) = 0.25
    # token-mean over the 3 valid tokens: (5 − 2 + 0.25)/3 = 1.0833333
    loss, grad, st = run(cispo_loss, ratio_max=5.0)
    assert loss == pytest.approx(3.25 / 3, abs=1e-12)
    # dL/dℓθ = −r̂·A/3: [[−5/3, 1/3], [−0.5/3, 0]] — no valid token has a zero gradient
    torch.testing.assert_close(grad, T([[-5 / 3, 1 / 3], [-0.5 / 3, 0.0]], dtype=torch.float64))
    assert st["reweighted_mask"].tolist() == [[True, False], [False, False]]
    assert not st["silenced_mask"].any() and not st["clip_mask"].any()
    torch.testing.assert_close(st["gate"], T([[5.0, 0.5], [1.0, 0.0]], dtype=torch.float64))
    # seq-mean-token-mean: ((5 − 2)/2 + 0.25/1)/2 = (1.5 + 0.25)/2 = 0.875
    loss, _, _ = run(cispo_loss, ratio_max=5.0, loss_agg_mode="seq-mean-token-mean")
    assert loss == pytest.approx(0.875, abs=1e-12)
    # a floor of 0.8 lifts r = 0.5: (0,1) becomes −0.8·(−2)·(−2) = −3.2 → (5 − 3.2 + 0.25)/3
    loss, _, st = run(cispo_loss, ratio_max=5.0, ratio_min=0.8)
    assert loss == pytest.approx(2.05 / 3, abs=1e-12)
    assert st["reweighted_mask"].tolist() == [[True, True], [False, False]]


def test_sapo_golden():
    # τ = 1 where A > 0, 1.05 where A ≤ 0;  L = −(4/τ)·σ(τ(r − 1))·A
    #   (0,0): r = 6, τ = 1: σ(5) = 0.9933071491 → −4·0.9933071491·1 = −3.9732285963
    #   (0,1): r = 0.5, τ = 1.05: σ(−0.525) = 1/(1 + 1.6904588) = 0.3716838117
    #          → −(4/1.05)·0.3716838117·(−2) = 2.8318766606
    #   (1,0): r = 1: σ(0) = 0.5 → −4·0.5·0.5 = −1
    # token-mean: (−3.9732285963 + 2.8318766606 − 1)/3 = −0.7137839786
    s5 = 1 / (1 + math.exp(-5))
    s2 = 1 / (1 + math.exp(0.525))
    assert s5 == pytest.approx(0.9933071491, abs=1e-10)
    assert s2 == pytest.approx(0.3716838117, abs=1e-10)
    loss, grad, st = run(sapo_loss)
    assert loss == pytest.approx((-4 * s5 + (4 / 1.05) * s2 * 2 - 1) / 3, abs=1e-12)
    assert loss == pytest.approx(-0.7137839786, abs=1e-9)
    # gate g = 4σ(1 − σ): 4·0.99331·0.00669 = 0.026592, 4·0.37168·0.62832 = 0.934140, 1 at r = 1
    g = st["gate"]
    assert g[0, 0].item() == pytest.approx(4 * s5 * (1 - s5), abs=1e-12)
    assert g[0, 0].item() == pytest.approx(0.0265922, abs=1e-7)
    assert g[0, 1].item() == pytest.approx(0.9341398, abs=1e-7)
    assert g[1, 0].item() == 1.0
    # dL/dℓθ = dL/dr · r / 3 = −g·A·r/3: (0,0) −0.0265922·1·6/3 = −0.0531844
    assert grad[0, 0].item() == pytest.approx(-g[0, 0].item() * 6 / 3, abs=1e-12)
    assert grad[1, 0].item() == pytest.approx(-1 * 0.5 * 1 / 3, abs=1e-12)
    # damped by more than half: only (0,0)
    assert st["reweighted_mask"].tolist() == [[True, False], [False, False]]


def test_gmpo_golden():
    # ε = 0.4 in log space.  Sequence 0: δ = [ln 6 = 1.792, ln 0.5 = −0.693], A = [1, −2]
    #   A > 0: δ′ = min(1.792, 0.4) = 0.4;   A < 0: δ′ = −min(0.693, 0.4) = −0.4
    #   ρ_0 = exp((0.4 − 0.4)/2) = 1, Ā_0 = (1 − 2)/2 = −0.5 → L = 0.5 on both tokens
    # Sequence 1: δ = 0, A = 0.5 → ρ_1 = 1, L = −0.5
    # token-mean: (0.5 + 0.5 − 0.5)/3 = 0.1666667; seq-mean-token-mean: (0.5 − 0.5)/2 = 0
    loss, grad, st = run(gmpo_loss)
    assert loss == pytest.approx(0.5 / 3, abs=1e-12)
    # both clips bind in sequence 0 (its gradient is zero); sequence 1: −Ā·ρ/3 = −0.5/3
    torch.testing.assert_close(grad, T([[0.0, 0.0], [-0.5 / 3, 0.0]], dtype=torch.float64))
    assert st["clip_mask"].tolist() == [[True, True], [False, False]]
    assert st["clip_high_mask"].tolist() == [[True, False], [False, False]]
    assert st["silenced_mask"].tolist() == [[True, True], [False, False]]
    assert st["gate"][0, 0].item() == pytest.approx(1.0)
    loss, _, _ = run(gmpo_loss, loss_agg_mode="seq-mean-token-mean")
    assert loss == pytest.approx(0.0, abs=1e-12)
    # a range of 2.0 clips neither token of sequence 0: ρ_0 = exp((ln 6 + ln 0.5)/2) = √3,
    # L = 0.5·√3 on both tokens → token-mean (2·0.5·√3 − 0.5)/3
    loss, _, st = run(gmpo_loss, log_clip=2.0)
    assert loss == pytest.approx((math.sqrt(3) - 0.5) / 3, abs=1e-12)
    assert st["gate"][0, 1].item() == pytest.approx(math.sqrt(3))


# One sequence of four tokens on-policy (r = 1, so the PPO clip never binds):
# ℓθ = [−1, −2, −3, −4], mean −2.5.
CL = T([[-1.0, -2.0, -3.0, -4.0]], dtype=torch.float64)
CM = torch.ones(1, 4, dtype=torch.bool)


def test_clip_cov_golden():
    # A = [2, 1, −1, −2] (mean 0): cov = A·(ℓθ + 2.5) = [2·1.5, 1·0.5, −1·−0.5, −2·−1.5]
    #                                               = [3, 0.5, 0.5, 3]
    # candidates (1 < cov < 5): tokens 0 and 3.  PPO loss per token −A·1 = [−2, −1, 1, 2]
    A = T([[2.0, 1.0, -1.0, -2.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    # ratio 0.25: k = max(⌊0.25·4⌋, 1) = 1 token drawn at random from {0, 3}
    for seed in range(6):
        g.manual_seed(seed)
        lt = CL.clone().requires_grad_(True)
        loss, st = clip_cov_loss(lt, CL, CL, A, CM, ratio=0.25, generator=g)
        loss.backward()
        (drawn,) = st["cov_mask"][0].nonzero().flatten().tolist()
        assert drawn in (0, 3)
        # zeroing token 0: (0 − 1 + 1 + 2)/4 = 0.5; token 3: (−2 − 1 + 1 + 0)/4 = −0.5
        assert loss.item() == pytest.approx(0.5 if drawn == 0 else -0.5, abs=1e-12)
        assert lt.grad[0, drawn].item() == 0.0
        assert st["cov_selected"] == 1 and st["cov_candidates"] == 2
        assert st["cov_threshold"] == pytest.approx(3.0)
    # ratio 0.5: k = 2, both drawn → (−1 + 1)/4 = 0
    loss, st = clip_cov_loss(CL, CL, CL, A, CM, ratio=0.5, generator=g)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    assert st["silenced_mask"].tolist() == [[True, False, False, True]]
    # a band that excludes 3 (ub = 2) leaves no candidate: PPO-clip, (−2 − 1 + 1 + 2)/4 = 0
    loss, st = clip_cov_loss(CL, CL, CL, A, CM, ratio=0.5, cov_ub=2.0, generator=g)
    assert st["cov_selected"] == 0 and math.isnan(st["cov_threshold"])


def test_kl_cov_golden():
    # A = [2, 1, −1, −3], mean −0.25: cov = (A + 0.25)·(ℓθ + 2.5)
    #   = [2.25·1.5, 1.25·0.5, −0.75·−0.5, −2.75·−1.5] = [3.375, 0.625, 0.375, 4.125]
    # δ = ℓθ − ℓp = [0.1, 0, 0, −0.2]; ratio 0.25 → k = 1: the top token is 3 (cov 4.125)
    # L = −A·r: [−2e^0.1, −1, 1, 3e^−0.2] and token 3 gets + 1·|−0.2|
    #   = [−2.2103418, −1, 1, 2.4561922 + 0.2]; mean = 0.4458504/4 = 0.1114626
    A = T([[2.0, 1.0, -1.0, -3.0]], dtype=torch.float64)
    lp = CL - T([[0.1, 0.0, 0.0, -0.2]], dtype=torch.float64)
    lt = CL.clone().requires_grad_(True)
    loss, st = kl_cov_loss(lt, lp, lp, A, CM, ratio=0.25)
    expected = (-2 * math.exp(0.1) - 1 + 1 + 3 * math.exp(-0.2) + 0.2) / 4
    assert expected == pytest.approx(0.1114626, abs=1e-7)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert st["cov_mask"].tolist() == [[False, False, False, True]]
    assert st["reweighted_mask"].tolist() == [[False, False, False, True]]
    assert st["cov_threshold"] == pytest.approx(4.125)
    assert st["cov_penalty_kl"] == pytest.approx(0.2)
    loss.backward()
    # d/dℓθ_3 of (3r + |δ|)/4 with δ < 0: (3·e^−0.2 − 1)/4
    assert lt.grad[0, 3].item() == pytest.approx((3 * math.exp(-0.2) - 1) / 4, abs=1e-12)
    # ratio 0.5 → k = 2: tokens 3 and 0; threshold = 3.375
    _, st = kl_cov_loss(CL, lp, lp, A, CM, ratio=0.5)
    assert st["cov_mask"].tolist() == [[True, False, False, True]]
    assert st["cov_threshold"] == pytest.approx(3.375)


# ------------------------------------------------------------------ naive per-token loops


def naive_weights(lp, lb, m, mode, cap):
    """(w, m_loss) per token; mode None | token_truncate | token_mask (legacy) | rs_mask."""
    B, Tn = len(lp), len(lp[0])
    w = [[1.0] * Tn for _ in range(B)]
    ml = [[bool(m[i][t]) for t in range(Tn)] for i in range(B)]
    if mode is None:
        return w, ml
    for i in range(B):
        for t in range(Tn):
            raw = math.exp(lp[i][t] - lb[i][t])
            if mode == "token_truncate":
                w[i][t] = min(raw, cap)
            elif raw > cap:
                w[i][t] = 0.0
                if mode == "rs_mask":
                    ml[i][t] = False
            else:
                w[i][t] = raw
            if not ml[i][t]:
                w[i][t] = 0.0
    return w, ml


def naive_aggregate(L, w, m, ml, agg):
    B, Tn = len(L), len(L[0])
    n0 = max(sum(1 for i in range(B) for t in range(Tn) if m[i][t]), 1)
    rows = [i for i in range(B) if any(m[i])]
    sums = [sum(L[i][t] * w[i][t] for t in range(Tn) if ml[i][t]) for i in range(B)]
    if agg == "token-mean":
        return sum(sums) / n0
    n_seq = max(len(rows), 1)
    if agg == "seq-mean-token-mean":
        return sum(sums[i] / max(sum(m[i]), 1) for i in rows) / n_seq
    if agg == "seq-mean-token-sum":
        return sum(sums[i] for i in rows) / n_seq
    return sum(sums[i] for i in rows) / (n_seq * Tn)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def naive_per_token(name, lt, lp, A, ml, opts, cov_mask=None):
    """Per-token losses L (before the behaviour weight) from each paper's formula."""
    B, Tn = len(lt), len(lt[0])
    L = [[0.0] * Tn for _ in range(B)]
    for i in range(B):
        valid = [t for t in range(Tn) if ml[i][t]]
        if name == "gmpo":
            eps, hi = opts["log_clip"], opts["log_clip"]
            clipped = []
            for t in valid:
                d = lt[i][t] - lp[i][t]
                s = (A[i][t] > 0) - (A[i][t] < 0)
                c = max(-eps, min(hi, d))
                clipped.append(s * min(s * d, s * c))
            rho = math.exp(sum(clipped) / max(len(valid), 1))
            a_bar = sum(A[i][t] for t in valid) / max(len(valid), 1)
        for t in range(Tn):
            r = math.exp(lt[i][t] - lp[i][t])
            a = A[i][t]
            if name == "cispo":
                r_hat = min(r, opts["ratio_max"])
                L[i][t] = -r_hat * a * lt[i][t]
            elif name == "sapo":
                tau = opts["temperature_pos"] if a > 0 else opts["temperature_neg"]
                L[i][t] = -(4 / tau) * sigmoid(tau * (r - 1)) * a
            elif name == "gmpo":
                L[i][t] = -a_bar * rho
            elif name == "kl_cov":
                L[i][t] = -a * r + (
                    opts["coef"] * abs(lt[i][t] - lp[i][t]) if cov_mask[i][t] else 0
                )
            elif name == "clip_cov":
                eps = opts["eps_clip"]
                L[i][t] = 0.0 if cov_mask[i][t] else max(-a * r, -a * min(max(r, 1 - eps), 1 + eps))
    return L


def naive_cov(lt, A, ml):
    cells = [(i, t) for i in range(len(lt)) for t in range(len(lt[0])) if ml[i][t]]
    a_mean = sum(A[i][t] for i, t in cells) / len(cells)
    l_mean = sum(lt[i][t] for i, t in cells) / len(cells)
    return {(i, t): (A[i][t] - a_mean) * (lt[i][t] - l_mean) for i, t in cells}


AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
FNS = {
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gmpo": gmpo_loss,
    "kl_cov": kl_cov_loss,
    "clip_cov": clip_cov_loss,
}


@pytest.mark.parametrize("case", range(250))
def test_objectives_match_naive_loops(case):
    rng = random.Random(7000 + case)
    name = ["cispo", "sapo", "gmpo", "kl_cov", "clip_cov"][case % 5]
    B, Tn = rng.randint(1, 4), rng.randint(1, 6)
    lt = [[rng.uniform(-3, 0) for _ in range(Tn)] for _ in range(B)]
    lp = [[x + rng.gauss(0, 0.5) for x in row] for row in lt]
    lb = [[x + rng.gauss(0, 0.5) for x in row] for row in lp]
    A = [[rng.choice([0.0, rng.gauss(0, 2)]) for _ in range(Tn)] for _ in range(B)]
    m = [[rng.random() < 0.8 for _ in range(Tn)] for _ in range(B)]
    m[0][0] = True
    agg = rng.choice(AGGS)
    mode = rng.choice([None, "token_truncate", "token_mask", "rs_mask"])
    cap = rng.choice([1.5, 2.0, 5.0])
    opts = {
        "cispo": {"ratio_max": rng.choice([1.2, 2.0, 5.0])},
        "sapo": {
            "temperature_pos": rng.choice([0.5, 1.0, 2.0]),
            "temperature_neg": rng.choice([1.05, 3.0]),
        },
        "gmpo": {"log_clip": rng.choice([0.1, 0.4, 1.0])},
        "kl_cov": {"ratio": rng.choice([0.0, 0.1, 0.3]), "coef": rng.choice([0.5, 1.0])},
        "clip_cov": {
            "ratio": rng.choice([0.0, 0.2, 0.5]),
            "cov_lb": -0.5,
            "cov_ub": 2.0,
            "eps_clip": 0.2,
        },
    }[name]
    weight_kw = {}
    if mode in ("token_truncate", "token_mask"):
        weight_kw = {"behave_imp_weight_mode": mode, "behave_imp_weight_cap": cap}
    elif mode == "rs_mask":
        weight_kw = {"rejection_sampling": RejectionSampling(upper=cap)}
    tt = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    extra = {"generator": torch.Generator().manual_seed(case)} if name == "clip_cov" else {}
    loss, stats = FNS[name](
        tt(lt),
        tt(lp),
        tt(lb),
        tt(A),
        torch.tensor(m),
        loss_agg_mode=agg,
        **opts,
        **weight_kw,
        **extra,
    )
    w, ml = naive_weights(lp, lb, m, mode, cap)
    cov_mask = None
    if name in ("kl_cov", "clip_cov"):
        cov = naive_cov(lt, A, ml)
        n_valid = sum(map(sum, ml))
        k = 0 if opts["ratio"] == 0 or n_valid == 0 else max(int(opts["ratio"] * n_valid), 1)
        if name == "kl_cov":
            top = sorted(cov, key=lambda c: -cov[c])[:k]
            cov_mask = [[(i, t) in top for t in range(Tn)] for i in range(B)]
            assert stats["cov_mask"].tolist() == cov_mask
        else:
            # The draw is random: check it against the naive candidate set, then use it.
            def clipped(i, t):
                r = math.exp(lt[i][t] - lp[i][t])
                return (A[i][t] > 0 and r > 1.2) or (A[i][t] < 0 and r < 0.8)

            cand = {c for c, v in cov.items() if -0.5 < v < 2.0 and not clipped(*c)}
            cov_mask = stats["cov_mask"].tolist()
            drawn = {(i, t) for i in range(B) for t in range(Tn) if cov_mask[i][t]}
            assert drawn <= cand and len(drawn) == min(k, len(cand))
    L = naive_per_token(name, lt, lp, A, ml, opts, cov_mask)
    expected = naive_aggregate(L, w, m, ml, agg)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


# ------------------------------------------------------------------ hypothesis properties


@st.composite
def batches(draw, max_b=3, max_t=5, spread=(0.0, 0.05, 0.5)):
    B = draw(st.integers(1, max_b))
    Tn = draw(st.integers(1, max_t))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lt = -torch.rand(B, Tn, generator=g, dtype=torch.float64) * 4
    lp = lt + torch.randn(B, Tn, generator=g, dtype=torch.float64) * draw(st.sampled_from(spread))
    adv = torch.randn(B, Tn, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(B, Tn, generator=g) < 0.8
    return lt, lp, adv, mask


def grad_of(fn, lt, lp, adv, mask, **kw):
    x = lt.clone().requires_grad_(True)
    loss, stats = fn(x, lp, lp, adv, mask, **kw)
    loss.backward()
    return loss, x.grad, stats


@given(batches(spread=(0.0, 0.5, 2.0)), st.sampled_from([1.2, 2.0, 5.0]), st.sampled_from(AGGS))
def test_cispo_gradient_never_zero_on_a_valid_token(inp, ratio_max, agg):
    lt, lp, adv, mask = inp
    _, grad, _ = grad_of(cispo_loss, lt, lp, adv, mask, ratio_max=ratio_max, loss_agg_mode=agg)
    live = mask & (adv != 0)
    assert (grad[live] != 0).all()
    # and it points the REINFORCE way: −sign(A)
    assert (torch.sign(grad[live]) == -torch.sign(adv[live])).all()
    assert (grad[~mask] == 0).all()


def unclipped(lt, lp, adv, mask, agg):
    # −A·r, aggregated: PPO with a clip range no ratio here can reach
    return ppo_actor_loss(lt, lp, lp, adv, mask, eps_clip=1e6, loss_agg_mode=agg)[0]


@given(batches(), st.sampled_from(AGGS))
def test_sapo_tends_to_the_unclipped_objective_as_temperatures_vanish(inp, agg):
    lt, lp, adv, mask = inp
    x = lt.clone().requires_grad_(True)
    ref = unclipped(x, lp, adv, mask, agg)
    ref.backward()
    for tau, tol in ((1e-2, 5e-2), (1e-4, 5e-4)):
        loss, grad, _ = grad_of(
            sapo_loss,
            lt,
            lp,
            adv,
            mask,
            temperature_pos=tau,
            temperature_neg=tau,
            loss_agg_mode=agg,
        )
        torch.testing.assert_close(grad, x.grad, rtol=tol, atol=tol * (1 + x.grad.abs().max()))
        # L = −(2/τ)·A − (r − 1)·A + O(τ²) = unclipped − (2/τ − 1)·A: remove the constant,
        # whose aggregate is (2/τ − 1)·agg(−A) = (2/τ − 1)·(the unclipped loss at r = 1)
        u1 = unclipped(lt, lt, adv, mask, agg).item()
        assert loss.item() - (2 / tau - 1) * u1 == pytest.approx(ref.item(), abs=tol)


@given(
    st.floats(0.01, 5.0),
    st.floats(0.0, 4.0),
    st.floats(1e-4, 1e-2),
    st.sampled_from([1.0, -1.0, 2.5]),
)
def test_sapo_gate_is_smooth_and_one_on_policy(tau, r, h, a):
    # The gradient in r is −g(r)·A with g = 4σ(1−σ) ∈ (0, 1], g(1) = 1, Lipschitz in r with
    # constant 4·max|σ(1−σ)(1−2σ)|·τ = τ/(1.5√3) ≈ 0.385·τ: no cliff anywhere.
    def gate(rv):
        lp = torch.zeros(1, 1, dtype=torch.float64)
        lt = torch.full((1, 1), math.log(rv), dtype=torch.float64, requires_grad=True)
        loss, st_ = sapo_loss(
            lt,
            lp,
            lp,
            torch.full((1, 1), a, dtype=torch.float64),
            torch.ones(1, 1, dtype=torch.bool),
            temperature_pos=tau,
            temperature_neg=tau,
        )
        (dl,) = torch.autograd.grad(loss, lt)  # dL/dℓθ = dL/dr · r
        return -dl.item() / (a * rv), st_["gate"].item()

    r = max(r, 1e-3)
    g1, stat_g = gate(r)
    g2, _ = gate(r + h)
    assert g1 == pytest.approx(stat_g, rel=1e-9)
    assert 0 < g1 <= 1
    assert abs(g2 - g1) <= tau / (1.5 * math.sqrt(3)) * h * (1 + 1e-6) + 1e-12
    assert gate(1.0)[0] == pytest.approx(1.0, abs=1e-12)


@given(
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.1, 0.2, 0.4]),
    st.sampled_from(AGGS),
)
def test_gmpo_equals_token_ppo_when_ratios_in_a_sequence_are_equal(B, Tn, seed, eps, agg):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, Tn, generator=g, dtype=torch.float64) * 4
    delta = torch.randn(B, 1, generator=g, dtype=torch.float64) * 0.5  # one ratio per sequence
    lt = lp + delta
    adv = (torch.randn(B, 1, generator=g, dtype=torch.float64) * 2).expand(B, Tn).clone()
    mask = torch.rand(B, Tn, generator=g) < 0.8
    got, g_gmpo, _ = grad_of(gmpo_loss, lt, lp, adv, mask, log_clip=eps, loss_agg_mode=agg)
    want, g_ppo, _ = grad_of(
        ppo_actor_loss,
        lt,
        lp,
        adv,
        mask,
        eps_clip=1 - math.exp(-eps),
        eps_clip_higher=math.exp(eps) - 1,
        loss_agg_mode=agg,
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(g_gmpo, g_ppo, rtol=1e-9, atol=1e-12)


@given(
    batches(),
    st.sampled_from([0.1, 0.2]),
    st.sampled_from([None, 3.0]),
    st.sampled_from(AGGS),
    st.sampled_from([None, "token_mask", "token_truncate"]),
)
def test_clip_cov_with_ratio_zero_is_ppo_clip(inp, eps, c_clip, agg, mode):
    lt, lp, adv, mask = inp
    lb = lp + 0.3
    kw = {"eps_clip": eps, "c_clip": c_clip, "loss_agg_mode": agg}
    if mode:
        kw.update(behave_imp_weight_mode=mode, behave_imp_weight_cap=2.0)
    x1, x2 = lt.clone().requires_grad_(True), lt.clone().requires_grad_(True)
    got, s1 = clip_cov_loss(x1, lp, lb, adv, mask, ratio=0.0, cov_lb=-1e9, cov_ub=1e9, **kw)
    want, s2 = ppo_actor_loss(x2, lp, lb, adv, mask, **kw)
    got.backward()
    want.backward()
    assert got.item() == want.item()
    assert torch.equal(x1.grad, x2.grad)
    for k in ("clip_mask", "dual_clip_mask", "importance_weight"):
        assert torch.equal(s1[k], s2[k])
    assert s1["cov_selected"] == 0


@given(batches(), st.sampled_from(AGGS))
def test_kl_cov_with_ratio_zero_is_the_unclipped_objective(inp, agg):
    lt, lp, adv, mask = inp
    x = lt.clone().requires_grad_(True)
    ref = unclipped(x, lp, adv, mask, agg)
    ref.backward()
    got, grad, st_ = grad_of(kl_cov_loss, lt, lp, adv, mask, ratio=0.0, loss_agg_mode=agg)
    assert got.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, x.grad)
    assert not st_["reweighted_mask"].any()


@given(batches(), st.sampled_from(list(FNS)), st.sampled_from(AGGS))
def test_masked_positions_never_influence_any_objective(inp, name, agg):
    lt, lp, adv, mask = inp
    kw = {"loss_agg_mode": agg}
    if name in ("clip_cov", "kl_cov"):
        kw["ratio"] = 0.3
    if name == "clip_cov":
        kw.update(cov_lb=-1e9, cov_ub=1e9)
    junk = torch.randn_like(lt) * 5

    def f(x_lt, x_lp, x_adv):
        extra = {"generator": torch.Generator().manual_seed(1)} if name == "clip_cov" else {}
        return FNS[name](x_lt, x_lp, x_lp, x_adv, mask, **kw, **extra)[0]

    a = f(lt, lp, adv)
    b = f(torch.where(mask, lt, junk), torch.where(mask, lp, junk), torch.where(mask, adv, junk))
    assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-12)


def test_one_dimensional_inputs_are_one_sequence():
    for name, fn in FNS.items():
        kw = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
        l2, s2 = fn(LT[:1], LP[:1], LP[:1], ADV[:1], MASK[:1], **kw)
        kw = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
        l1, s1 = fn(LT[0], LP[0], LP[0], ADV[0], MASK[0], **kw)
        assert l1.item() == l2.item(), name
        assert s1["silenced_mask"].shape == (2,)


@pytest.mark.parametrize(
    "objective, options, msg",
    [
        ("cispo", {"c_clip": 3.0}, "c_clip means nothing under policy_loss 'cispo'"),
        ("cispo", {"eps_clip": 0.3}, "eps_clip means nothing under policy_loss 'cispo'"),
        (
            "sapo",
            {"eps_clip_higher": 0.28},
            "eps_clip_higher means nothing under policy_loss 'sapo'",
        ),
        (
            "ppo",
            {"sapo": {"temperature_pos": 2.0}},
            "sapo.temperature_pos means nothing under policy_loss 'ppo'",
        ),
        (
            "kl_cov",
            {"clip_cov": {"ratio": 0.1}},
            "clip_cov.ratio means nothing under policy_loss 'kl_cov'",
        ),
        (
            "gmpo",
            {"cispo": {"ratio_max": 3.0}},
            "cispo.ratio_max means nothing under policy_loss 'gmpo'",
        ),
        ("cispo", {"cispo": {"ratio_max": 1.0}}, "cispo.ratio_max: must be a finite number > 1"),
        (
            "cispo",
            {"cispo": {"ratio_min": 1.0}},
            "cispo.ratio_min: must be a finite number in [0, 1)",
        ),
        (
            "sapo",
            {"sapo": {"temperature_neg": 0.0}},
            "sapo.temperature_neg: must be a finite number > 0",
        ),
        ("gmpo", {"gmpo": {"log_clip": 0.0}}, "gmpo.log_clip: must be a finite number > 0"),
        (
            "clip_cov",
            {"clip_cov": {"cov_lb": 5.0}},
            "clip_cov.cov_lb (5.0) must be < clip_cov.cov_ub (5.0)",
        ),
        ("kl_cov", {"kl_cov": {"ratio": 1.5}}, "kl_cov.ratio: must be a finite number in [0, 1]"),
        ("nope", {}, "policy_loss must be one of ppo, cispo, sapo, gmpo, clip_cov, kl_cov"),
    ],
)
def test_meaningless_or_bad_options_name_both(objective, options, msg):
    from harness.core.configtools import from_dict

    with pytest.raises(ValueError, match=None) as err:
        from_dict(PPOActorConfig, {"policy_loss": objective, **options}, "ppo")
    assert msg in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("objective", ["gmpo", "clip_cov", "kl_cov"])
def test_sequence_level_means_nothing_for_sequence_or_covariance_objectives(objective):
    with pytest.raises(ValueError, match="importance_sampling_level 'sequence' means nothing"):
        PPOActorConfig(policy_loss=objective, importance_sampling_level="sequence")
    PPOActorConfig(policy_loss="cispo", importance_sampling_level="sequence")
    PPOActorConfig(policy_loss="sapo", importance_sampling_level="sequence")


@given(
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["cispo", "sapo"]),
    st.sampled_from(AGGS),
)
def test_sequence_level_equals_token_level_when_ratios_agree(B, Tn, seed, name, agg):
    # GSPO's sequence ratio is the geometric mean of the token ratios: with one ratio and one
    # advantage per sequence the two levels must give the same loss and gradient.
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, Tn, generator=g, dtype=torch.float64) * 4
    lt = lp + torch.randn(B, 1, generator=g, dtype=torch.float64) * 0.7
    adv = (torch.randn(B, 1, generator=g, dtype=torch.float64) * 2).expand(B, Tn).clone()
    mask = torch.rand(B, Tn, generator=g) < 0.8
    kw = {"ratio_max": 1.5} if name == "cispo" else {}
    tok, g_tok, _ = grad_of(FNS[name], lt, lp, adv, mask, loss_agg_mode=agg, **kw)
    seq, g_seq, _ = grad_of(
        FNS[name], lt, lp, adv, mask, loss_agg_mode=agg, importance_sampling_level="sequence", **kw
    )
    assert seq.item() == pytest.approx(tok.item(), rel=1e-9, abs=1e-12)
    # each token's loss depends on its sequence's mean log-ratio, whose gradient 1/n is shared by
    # the n identical token losses: per-token gradients agree as well
    torch.testing.assert_close(g_seq, g_tok, rtol=1e-9, atol=1e-12)
