"""The math core against deliberately naive per-element loops, on hundreds of random cases.

The references below are written from docs/ppo-semantics.md with Python floats and explicit
loops; they share no code with harness.ppo.
"""

import math
import random

import pytest
import torch

from harness.ppo import NormConfig, RejectionSampling, gae, normalize, ppo_actor_loss

# ---------------------------------------------------------------- naive references


def naive_normalize(x, mask, mean_level, loo, std_level, unbiased, eps, groups):
    """x: list of rows (lists); mask same; groups: list of row-index lists (AReaL main).

    A scope is a list of rows; "singleton" means a group of one row (AReaL tests the slice's row
    count), whatever its number of tokens or valid entries.
    """
    B = len(x)
    rows_of = {"batch": [list(range(B))], "group": groups}

    def scope(level, i):
        for g in rows_of[level]:
            if i in g:
                return g
        raise AssertionError

    def one_row_group(level, i):
        return level == "group" and len(scope(level, i)) == 1

    mu = [[0.0] * len(x[i]) for i in range(B)]
    if mean_level is not None:
        for i in range(B):
            rows = scope(mean_level, i)
            vals = [(x[a][b], mask[a][b]) for a in rows for b in range(len(x[a]))]
            s = sum(v for v, k in vals if k)
            n = sum(1 for v, k in vals if k)
            for j in range(len(x[i])):
                if not loo:
                    mu[i][j] = s / n if n > 0 else 0.0
                elif one_row_group(mean_level, i):
                    mu[i][j] = x[i][j]  # main: a singleton is its own baseline
                elif n <= 1:
                    mu[i][j] = 0.0
                elif mask[i][j]:
                    mu[i][j] = (s - x[i][j]) / (n - 1)
                else:
                    mu[i][j] = s / n
    out = [[0.0] * len(x[i]) for i in range(B)]
    for i in range(B):
        for j in range(len(x[i])):
            if not mask[i][j]:
                continue  # c = (x − μ)·M = 0 on masked entries, whatever the levels
            c = x[i][j] - mu[i][j]
            if std_level is None:
                out[i][j] = c
                continue
            rows = scope(std_level, i)
            dev = [x[a][b] - mu[a][b] for a in rows for b in range(len(x[a])) if mask[a][b]]
            n = len(dev)
            ss = sum(d * d for d in dev)
            if unbiased:
                if one_row_group(std_level, i) or n <= 1:
                    sd = 1.0
                else:
                    sd = math.sqrt(ss / (n - 1))
            else:
                sd = math.sqrt(ss / n) if n > 0 else 1.0
            out[i][j] = c / (sd + eps)
    return out


def naive_loss(lt, lp, lb, A, m, eps, eps_hi, c, rs_mode, cap, level):
    """rs_mode: None | token_mask | token_truncate | sequence_mask | sequence_truncate (legacy)."""
    B, T = len(lt), len(lt[0])
    n0 = max(sum(1 for i in range(B) for t in range(T) if m[i][t]), 1)
    w = [[1.0] * T for _ in range(B)]
    if rs_mode is not None:
        for i in range(B):
            valid = [t for t in range(T) if m[i][t]]
            if rs_mode.startswith("sequence"):
                g = math.exp(sum(lp[i][t] - lb[i][t] for t in valid) / max(len(valid), 1))
            for t in range(T):
                raw = math.exp(lp[i][t] - lb[i][t]) if rs_mode.startswith("token") else g
                if rs_mode.endswith("mask"):
                    w[i][t] = 0.0 if (cap is not None and raw > cap) else raw
                else:
                    w[i][t] = min(raw, cap) if cap is not None else raw
                if not m[i][t]:
                    w[i][t] = 0.0
    total = 0.0
    per_tok = [[0.0] * T for _ in range(B)]
    for i in range(B):
        valid = [t for t in range(T) if m[i][t]]
        n_i = max(len(valid), 1)
        s_ratio = math.exp(sum(lt[i][t] - lp[i][t] for t in valid) / n_i)
        s_adv = sum(A[i][t] for t in valid) / n_i
        for t in range(T):
            if not m[i][t]:
                continue
            if level == "token":
                r, a = math.exp(lt[i][t] - lp[i][t]), A[i][t]
            else:
                r, a = s_ratio, s_adv
            rc = min(max(r, 1 - eps), 1 + (eps if eps_hi is None else eps_hi))
            L = max(-a * r, -a * rc)
            if c is not None:
                L = min(L, c * abs(a))
            L *= w[i][t]
            per_tok[i][t] = L
            total += L
    return total / n0, per_tok


def naive_gae(r, v, m, gamma, lam, boot):
    B, T = len(r), len(r[0])
    adv = [[0.0] * T for _ in range(B)]
    for i in range(B):
        next_v = v[i][T - 1] if boot[i] else 0.0
        last = 0.0
        for t in range(T - 2, -1, -1):
            delta = r[i][t] + gamma * next_v - v[i][t]
            cand = delta + gamma * lam * last
            if m[i][t]:
                last = cand
                next_v = v[i][t]
            adv[i][t] = last
    return adv


# ---------------------------------------------------------------- random cases


def random_mask(rng, B, T):
    m = [[rng.random() < 0.7 for _ in range(T)] for _ in range(B)]
    if B > 1 and rng.random() < 0.3:
        m[rng.randrange(B)] = [False] * T  # a fully masked row
    return m


@pytest.mark.parametrize("case", range(300))
def test_normalize_matches_naive(case):
    rng = random.Random(case)
    G = rng.choice([1, 2, 3, 4])
    n_groups = rng.choice([1, 2, 3])
    B = G * n_groups
    T = rng.choice([1, 3, 5])
    x = [[rng.gauss(0, 3) if rng.random() > 0.1 else 0.0 for _ in range(T)] for _ in range(B)]
    use_mask = rng.random() < 0.7
    mask = random_mask(rng, B, T) if use_mask else [[True] * T for _ in range(B)]
    mean_level = rng.choice(["batch", "group", None])
    std_level = rng.choice(["batch", "group", None])
    loo = rng.random() < 0.4
    unbiased = rng.random() < 0.5
    variable = rng.random() < 0.3
    if variable:
        sizes = []
        left = B
        while left:
            s = rng.randint(1, left)
            sizes.append(s)
            left -= s
    else:
        sizes = [G] * n_groups
    groups, start = [], 0
    for s in sizes:
        groups.append(list(range(start, start + s)))
        start += s
    # Variable groups come with the batch (group_sizes), which win over group_size as in AReaL:
    # the config keeps the nominal G, as AReaL code sets group_size = n_samples.
    cfg = NormConfig(mean_level, loo, std_level, unbiased, eps=1e-5, group_size=G)
    xt = torch.tensor(x, dtype=torch.float32)
    mt = torch.tensor(mask) if use_mask else None
    if use_mask and not any(any(r) for r in mask):
        expected = xt
    else:
        expected = torch.tensor(
            naive_normalize(x, mask, mean_level, loo, std_level, unbiased, 1e-5, groups)
        )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = normalize(xt, cfg, mt, group_sizes=sizes if variable else None)
    torch.testing.assert_close(got, expected.float(), rtol=1e-4, atol=1e-4)


MODES = [None, "token_mask", "token_truncate", "sequence_mask", "sequence_truncate"]


@pytest.mark.parametrize("case", range(300))
def test_loss_matches_naive(case):
    rng = random.Random(1000 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 6)
    lt = [[rng.uniform(-3, 0) for _ in range(T)] for _ in range(B)]
    lp = [[x + rng.gauss(0, 0.4) for x in row] for row in lt]
    lb = [[x + rng.gauss(0, 0.6) for x in row] for row in lp]
    A = [[rng.choice([0.0, rng.gauss(0, 2)]) for _ in range(T)] for _ in range(B)]
    m = random_mask(rng, B, T)
    eps = rng.choice([0.1, 0.2, 0.3])
    eps_hi = rng.choice([None, 0.28, 0.0, 0.5])
    c = rng.choice([None, 1.5, 3.0, 10.0])
    mode = rng.choice(MODES)
    cap = rng.choice([None, 1.5, 2.0, 5.0]) if mode else None
    level = rng.choice(["token", "sequence"])
    expected, per_tok = naive_loss(lt, lp, lb, A, m, eps, eps_hi, c, mode, cap, level)
    tt = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    loss, st = ppo_actor_loss(
        tt(lt),
        tt(lp),
        tt(lb),
        tt(A),
        torch.tensor(m),
        eps_clip=eps,
        eps_clip_higher=eps_hi,
        c_clip=c,
        behave_imp_weight_mode=mode or "disabled",
        behave_imp_weight_cap=cap,
        importance_sampling_level=level,
    )
    # float64 inputs: the behaviour weights are float64 too (bf16 / float32 ones: float32)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
    got_tok = torch.where(torch.tensor(m), st["loss"], torch.zeros(()))
    torch.testing.assert_close(got_tok, tt(per_tok), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", range(100))
def test_rejection_sampling_token_legacy_equivalence(case):
    """RS token/mask/ratio and token/clamp/ratio reproduce the legacy token modes' loss."""
    rng = random.Random(5000 + case)
    B, T = rng.randint(1, 3), rng.randint(2, 5)
    g = torch.Generator().manual_seed(case)
    lt = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = lt + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    lb = lp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.8
    A = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) < 0.8
    cap = rng.choice([1.5, 2.0, 5.0])
    for action, mode in (("mask", "token_mask"), ("clamp", "token_truncate")):
        a, _ = ppo_actor_loss(
            lt,
            lp,
            lb,
            A,
            m,
            eps_clip=0.2,
            rejection_sampling=RejectionSampling(action=action, upper=cap),
        )
        b, _ = ppo_actor_loss(
            lt, lp, lb, A, m, eps_clip=0.2, behave_imp_weight_mode=mode, behave_imp_weight_cap=cap
        )
        assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("case", range(300))
def test_gae_matches_naive(case):
    rng = random.Random(9000 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 12)
    r = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    v = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    m = random_mask(rng, B, T)
    gamma = rng.choice([1.0, 0.99, 0.9, 0.5, 0.0])
    lam = rng.choice([1.0, 0.95, 0.5, 0.1, 0.0])
    boot = [rng.random() < 0.5 for _ in range(B)]
    expected = naive_gae(r, v, m, gamma, lam, boot)
    adv, ret = gae(
        torch.tensor(r, dtype=torch.float64),
        torch.tensor(v, dtype=torch.float64),
        torch.tensor(m),
        gamma=gamma,
        lam=lam,
        bootstrap=torch.tensor(boot),
    )
    torch.testing.assert_close(
        adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-10
    )
    torch.testing.assert_close(ret, adv + torch.tensor(v, dtype=torch.float64))


@pytest.mark.parametrize(
    "gamma_lam", [(1.0, 0.95), (0.99, 0.5), (0.9, 0.01), (0.5, 1e-4), (1.0, 1e-9)]
)
def test_gae_long_sequences_no_underflow(gamma_lam):
    """T = 2048 with γλ well below 1: chunking must keep the recurrence exact."""
    gamma, lam = gamma_lam
    g = torch.Generator().manual_seed(0)
    B, T = 3, 2048
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) < 0.9
    adv, _ = gae(r, v, m, gamma=gamma, lam=lam, bootstrap=torch.tensor([True, False, True]))
    expected = naive_gae(r.tolist(), v.tolist(), m.tolist(), gamma, lam, [True, False, True])
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(
        adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-8, atol=1e-9
    )


# ---------------------------------------------------------------- normalization edge rules
# Each case: (x, mask or None, NormConfig, group_sizes, expected), expected derived by hand from
# docs/ppo-semantics.md "Normalization" (AReaL main).  Both normalize() and the naive loop must
# give it.

E = 1e-5  # default eps
NORM_RULES = {
    # one-row group + leave-one-out: μ = x by ROW count, so a 3-token row is all 0 too
    # (rows 1-2: μ_j = (39 − x_j)/5 over their 6 tokens, e.g. 4 → 4 − 7 = −3)
    "singleton-loo-2d": (
        [[1.0, 2, 3], [4, 5, 6], [7, 8, 9]],
        None,
        NormConfig("group", True, None),
        [1, 2],
        [[0.0, 0, 0], [-3.0, -1.8, -0.6], [0.6, 1.8, 3.0]],
    ),
    # group of 2 rows with one valid entry + leave-one-out: μ ≡ 0, the value passes through
    "loo-one-valid-entry": (
        [3.0, 5.0, 1.0, 2.0],
        [True, False, True, True],
        NormConfig("group", True, None),
        [2, 2],
        [3.0, 0.0, -1.0, 1.0],
    ),
    # one-row group, unbiased group std: σ = 1 even though the row has 3 tokens ([1,3,5] → c =
    # [−2, 0, 2], token std would be 2); the 2-row group is normal (μ = 2, c = ±1, σ = sqrt(4/3))
    "singleton-unbiased-std-2d": (
        [[1.0, 3, 5], [1, 1, 1], [3, 3, 3]],
        None,
        NormConfig("group", False, "group", True),
        [1, 2],
        [
            [-2 / (1 + E), 0.0, 2 / (1 + E)],
            [-1 / (math.sqrt(6 / 5) + E)] * 3,
            [1 / (math.sqrt(6 / 5) + E)] * 3,
        ],
    ),
    # one-row group, biased std: σ = |x − μ| with μ the batch mean 3.5 → −2.5/(2.5 + eps)
    "singleton-biased-std": (
        [1.0, 2.0, 4.0, 7.0],
        None,
        NormConfig("batch", False, "group", False),
        [1, 3],
        [-2.5 / (2.5 + E)] + [d / (math.sqrt(14.75 / 3) + E) for d in (-1.5, 0.5, 3.5)],
    ),
    # one-row group, leave-one-out and biased std: c = 0 and σ = 0, so 0/(0 + eps) = 0
    "singleton-loo-biased-std": (
        [4.0, 1.0, 3.0],
        None,
        NormConfig("group", True, "group", False),
        [1, 2],
        [0.0, -2 / (2 + E), 2 / (2 + E)],
    ),
    # both levels None: c = (x − 0)·M, σ = 1, eps = 0 → masked entries are 0, valid pass through
    "none-none-masked": (
        [[1.0, 2.0], [3.0, 4.0]],
        [[True, False], [True, True]],
        NormConfig(None, False, None),
        None,
        [[1.0, 0.0], [3.0, 4.0]],
    ),
    "none-none-unmasked": (
        [[1.0, -2.0], [3.0, 4.0]],
        None,
        NormConfig(None, False, None),
        None,
        [[1.0, -2.0], [3.0, 4.0]],
    ),
    # batch leave-one-out with a single valid entry: μ ≡ 0
    "batch-loo-single-valid": (
        [5.0, 9.0],
        [True, False],
        NormConfig("batch", True, None),
        None,
        [5.0, 0.0],
    ),
}


def _rows(v):
    return [r if isinstance(r, list) else [r] for r in v]


@pytest.mark.parametrize("name", sorted(NORM_RULES))
def test_normalization_rules_golden_and_naive_agree(name):
    x, mask, cfg, sizes, expected = NORM_RULES[name]
    xt = torch.tensor(x, dtype=torch.float32)
    mt = None if mask is None else torch.tensor(mask)
    got = normalize(xt, cfg, mt, group_sizes=sizes)
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6
    )
    B = len(x)
    groups, start = [], 0
    for s in sizes or [B]:
        groups.append(list(range(start, start + s)))
        start += s
    m = _rows(mask) if mask is not None else [[True] * len(r) for r in _rows(x)]
    naive = naive_normalize(
        _rows(x),
        m,
        cfg.mean_level,
        cfg.mean_leave1out,
        cfg.std_level,
        cfg.std_unbiased,
        cfg.eps,
        groups,
    )
    torch.testing.assert_close(
        torch.tensor(naive, dtype=torch.float32).reshape(xt.shape),
        torch.tensor(expected, dtype=torch.float32),
        rtol=1e-6,
        atol=1e-6,
    )


# The golden normalization table and unit values (AReaL's own outputs): the naive loop agrees too.
R8 = [1.0, 0, 0, 0, 1, 1, 1, 1]
SPEC_TABLE = [
    (
        R8,
        ("group", False, "group", True),
        [4, 4],
        [1.49997, -0.49999, -0.49999, -0.49999, 0, 0, 0, 0],
    ),
    (R8, ("group", False, "group", False), [4, 4], [1.73201] + [-0.57734] * 3 + [0] * 4),
    (R8, ("group", True, None, True), [4, 4], [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0]),
    (R8, ("group", False, "batch", True), [4, 4], [2.29122] + [-0.76374] * 3 + [0] * 4),
    (
        [1.0, 0, 0, 1, 1, 0, 1],
        ("group", False, "group", True),
        [4, 3],
        [0.86601, -0.86601, -0.86601, 0.86601, 0.57734, -1.15468, 0.57734],
    ),
    ([1.0, 2, 3, 4], ("batch", True, None, True), None, [-2, -2 / 3, 2 / 3, 2]),
    ([10.0, 20, 30], ("batch", True, None, True), None, [-15.0, 0.0, 15.0]),
    ([7.0], ("batch", True, None, True), None, [7.0]),
    ([1.0, 2, 3, 4], ("group", True, "group", True), [1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0]),
]


@pytest.mark.parametrize("case", range(len(SPEC_TABLE)))
def test_naive_reference_reproduces_spec_tables(case):
    x, (ml, loo, sl, unb), sizes, expected = SPEC_TABLE[case]
    groups, start = [], 0
    for s in sizes or [len(x)]:
        groups.append(list(range(start, start + s)))
        start += s
    naive = naive_normalize([[v] for v in x], [[True]] * len(x), ml, loo, sl, unb, 1e-5, groups)
    assert [r[0] for r in naive] == pytest.approx(expected, abs=2e-5)
    got = normalize(torch.tensor(x), NormConfig(ml, loo, sl, unb), group_sizes=sizes)
    assert got.tolist() == pytest.approx(expected, abs=2e-5)


def test_group_statistics_stay_float64_unlike_areals_float32_buffer():
    """Deviation: AReaL main rounds a group mean to x's dtype before centring, an absolute error
    of up to half a float32 ulp of μ; with a large common offset that is most of the signal."""
    x = torch.tensor([1e4, 1e4 + 2**-9, 1e4 + 2 * 2**-9, 1e4 + 4 * 2**-9])  # exact in float32
    cfg = NormConfig("group", False, None)
    got = normalize(x, cfg, group_sizes=[4])
    exact = [(-7 / 4) * 2**-9, (-3 / 4) * 2**-9, (1 / 4) * 2**-9, (9 / 4) * 2**-9]
    assert got.tolist() == pytest.approx(exact, rel=1e-6)
    mu32 = x.double().mean().float()  # AReaL's float32 group buffer
    areal = (x - mu32).tolist()
    assert (
        max(abs(a - e) for a, e in zip(areal, exact, strict=True)) > 1e-4
    )  # what the deviation avoids
