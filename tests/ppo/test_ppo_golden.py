"""Golden values produced by running AReaL's own functions (float32): docs/ppo-semantics.md
"Golden values"."""

import math

import pytest
import torch

from harness.ppo import NormConfig, RejectionSampling, gae, kl_estimate, normalize, ppo_actor_loss

T = torch.tensor
LT = T([[-1.0, -0.5, -2.0, -0.1], [-0.3, -3.0, -0.7, -1.2]])
LP = T([[-1.2, -0.2, -1.0, -0.1], [-0.3, -1.0, -0.9, -1.0]])
LB = T([[-1.1, -0.4, -3.0, -0.5], [-0.2, -1.1, -0.8, -4.0]])
ADV = T([[1.0, -2.0, -1.0, 0.5], [0.0, -1.5, 2.0, 1.0]])
MASK = T([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()


def loss_of(**kw):
    return ppo_actor_loss(LT, LP, LB, ADV, MASK, **kw)


def test_case_a_symmetric_clip():
    loss, st = loss_of(eps_clip=0.2)
    assert loss.item() == pytest.approx(-0.11696153, abs=1e-7)
    assert st["clip_mask"].tolist() == [[True, True, True, False], [False, True, True, False]]


def test_case_b_clip_higher_and_dual():
    loss, st = loss_of(eps_clip=0.2, eps_clip_higher=0.28, c_clip=3.0)
    assert loss.item() == pytest.approx(-0.12613414, abs=1e-7)
    assert st["clip_mask"].tolist() == [[False, True, True, False], [False, True, False, False]]


def test_case_c_token_mask_rejection_sampling():
    loss, st = loss_of(eps_clip=0.2, c_clip=3.0, rejection_sampling=RejectionSampling(upper=2.0))
    assert loss.item() == pytest.approx(0.00329072, abs=1e-7)
    assert st["filtered_fraction"] == pytest.approx(2 / 7)
    expected_w = [[0.904837, 1.221403, 0, 0], [0.904837, 1.105171, 0.904837, 0]]
    torch.testing.assert_close(st["behave_imp_weight"], T(expected_w), atol=1e-6, rtol=0)
    expected_r = [[1.2214, 0.7408, 0.3679, 0], [1, 0.1353, 1.2214, 0.8187]]
    torch.testing.assert_close(st["importance_weight"], T(expected_r), atol=1e-4, rtol=0)


def test_case_c_legacy_token_mask_same_loss():
    loss, st = loss_of(
        eps_clip=0.2, c_clip=3.0, behave_imp_weight_mode="token_mask", behave_imp_weight_cap=2.0
    )
    assert loss.item() == pytest.approx(0.00329072, abs=1e-7)
    # legacy modes do not narrow the mask: clip statistics use the original mask
    assert st["clip_mask"][0, 2].item() is True


def test_case_d_token_clamp():
    rs = RejectionSampling(action="clamp", upper=2.0)
    assert rs.lower == 0.0
    loss, st = loss_of(eps_clip=0.2, c_clip=3.0, rejection_sampling=rs)
    assert loss.item() == pytest.approx(-0.00206092, abs=1e-7)
    assert st["behave_imp_weight"][0, 2].item() == pytest.approx(2.0)
    assert st["behave_imp_weight"][1, 3].item() == pytest.approx(2.0)
    assert st["filtered_fraction"] == pytest.approx(2 / 7)


def test_case_e_sequence_mask():
    rs = RejectionSampling(level="sequence", upper=2.0)
    loss, st = loss_of(eps_clip=0.2, rejection_sampling=rs)
    assert loss.item() == 0.0
    assert st["filtered_fraction"] == 1.0


def test_case_f_sequence_clamp():
    rs = RejectionSampling(level="sequence", action="clamp", upper=1.5)
    loss, st = loss_of(eps_clip=0.2, rejection_sampling=rs)
    assert loss.item() == pytest.approx(-0.17544229, abs=1e-7)
    w = st["behave_imp_weight"]
    assert torch.allclose(w[MASK], torch.full((7,), 1.5))
    assert st["filtered_fraction"] == 1.0


def test_case_g_gspo():
    loss, st = loss_of(eps_clip=0.2, importance_sampling_level="sequence")
    assert loss.item() == pytest.approx(0.09860061, abs=1e-7)
    r = st["importance_weight"]
    assert r[0, 0].item() == pytest.approx(math.exp(-0.36667), abs=1e-5)
    assert r[1, 0].item() == pytest.approx(0.606531, abs=1e-6)


def test_case_h_kl_k3_mask():
    rs = RejectionSampling(metric="kl_k3", upper=0.5)
    loss, st = loss_of(eps_clip=0.2, rejection_sampling=rs)
    assert loss.item() == pytest.approx(0.00329072, abs=1e-7)
    assert st["filtered_fraction"] == pytest.approx(2 / 7)


def test_dual_clip_case():
    lp = T([[-1.5, -1.5, 0.5, 0.0]])
    loss, st = ppo_actor_loss(
        torch.zeros(1, 4),
        lp,
        lp,
        T([[-1.0, 2.0, -1.0, -1.0]]),
        torch.ones(1, 4, dtype=torch.bool),
        eps_clip=0.2,
        eps_clip_higher=0.28,
        c_clip=3.0,
    )
    assert loss.item() == pytest.approx(0.56, abs=1e-6)
    torch.testing.assert_close(st["loss"], T([[3.0, -2.56, 0.8, 1.0]]))
    assert st["clip_mask"].tolist() == [[False, True, True, False]]
    assert st["dual_clip_mask"].tolist() == [[True, False, False, False]]


R8 = T([1.0, 0, 0, 0, 1, 1, 1, 1])


@pytest.mark.parametrize(
    "cfg,expected",
    [
        (
            NormConfig("group", False, "group", True, group_size=4),
            [1.49997, -0.49999, -0.49999, -0.49999, 0, 0, 0, 0],
        ),
        (
            NormConfig("group", False, "group", False, group_size=4),
            [1.73201] + [-0.57734] * 3 + [0] * 4,
        ),
        (NormConfig("group", True, None, group_size=4), [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0]),
        (
            NormConfig("group", False, "batch", True, group_size=4),
            [2.29122] + [-0.76374] * 3 + [0] * 4,
        ),
    ],
    ids=["grpo-unbiased", "grpo-biased", "rloo", "liteppo"],
)
def test_normalization_recipes(cfg, expected):
    torch.testing.assert_close(normalize(R8, cfg), T(expected), atol=2e-5, rtol=0)


@pytest.mark.parametrize("group_size", [1, 4, 3, 2])
def test_variable_group_sizes(group_size):
    # AReaL main's golden values for mixed groups; the batch's group_sizes win over group_size
    # whatever it says (AReaL code sets group_size = n_samples, here 4, with a partial group of 3).
    out = normalize(
        T([1.0, 0, 0, 1, 1, 0, 1]),
        NormConfig("group", False, "group", True, group_size=group_size),
        group_sizes=[4, 3],
    )
    torch.testing.assert_close(
        out,
        T([0.86601, -0.86601, -0.86601, 0.86601, 0.57734, -1.15468, 0.57734]),
        atol=2e-5,
        rtol=0,
    )


def test_fixed_group_size_not_dividing_is_an_error_not_500000():
    with pytest.raises(ValueError, match="group_size 2 does not divide the batch of 3"):
        normalize(T([1.0, 3.0, 5.0]), NormConfig("group", False, "group", True, group_size=2))


def test_areal_normalization_unit_values():
    loo = NormConfig(mean_leave1out=True, std_level=None)
    torch.testing.assert_close(
        normalize(T([[1.0], [2.0], [3.0], [4.0]]), loo).flatten(), T([-2, -2 / 3, 2 / 3, 2])
    )
    torch.testing.assert_close(
        normalize(T([[10.0], [20.0], [30.0]]), loo).flatten(), T([-15.0, 0.0, 15.0])
    )
    out = normalize(T([[1.0, 2, 3], [4, 5, 6]]), NormConfig(mean_leave1out=True, std_level=None))
    assert out[0, 0].item() == pytest.approx(-3.0)
    assert normalize(
        T([7.0]), NormConfig(mean_leave1out=True, std_level=None)
    ).item() == pytest.approx(7.0)
    x = T([[1.0, 2], [3, 4], [5, 6]])
    m = T([[1, 1], [1, 0], [0, 1]])
    out = normalize(x, NormConfig(mean_leave1out=True, std_unbiased=True), m)
    got = [out[0, 0], out[0, 1], out[1, 0], out[2, 1]]
    assert [v.item() for v in got] == pytest.approx([-0.9258, -0.4629, 0.0, 1.3887], abs=1e-4)
    assert out[1, 1].item() == 0.0 and out[2, 0].item() == 0.0
    # biased/unbiased ratio sqrt(3/2)
    b = normalize(T([1.0, 2, 3]), NormConfig(std_unbiased=False, eps=0.0))
    u = normalize(T([1.0, 2, 3]), NormConfig(std_unbiased=True, eps=0.0))
    assert (b[0] / u[0]).item() == pytest.approx(math.sqrt(3 / 2), rel=1e-6)


def test_zero_variance_all_zero_and_empty_mask():
    assert torch.equal(normalize(torch.zeros(6), NormConfig()), torch.zeros(6))
    assert torch.equal(normalize(torch.full((4,), 3.0), NormConfig()), torch.zeros(4))
    x = T([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(normalize(x, NormConfig(), torch.zeros(2, 2)), x)


def test_singleton_group_leave_one_out_gives_zero():
    out = normalize(T([1.0, 2.0, 3.0, 4.0]), NormConfig("group", True, "group", True, group_size=1))
    assert torch.equal(out, torch.zeros(4))


def test_singleton_group_mean_without_leave_one_out_warns():
    with pytest.warns(UserWarning, match="erased"):
        normalize(T([1.0, 2.0]), NormConfig("group", False, None, group_size=1))


# GAE and advantages example (docs/ppo-semantics.md "Golden values"): B = 2, T = 6, layout
# already rolled ("predicting").
ATTN = T([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
LOSS_MASK_TOKENS = T([[0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])
INF_LOGP = T([[0, 0, -0.5, -1, -0.2, 0], [0, 0, -0.3, -0.6, -0.9, -1.2]])
REF_LOGP = T([[0, -0.4, -1.1, -0.1, 0, 0], [0, -0.5, -0.4, -1, -1, 0]])
R = T([1.0, 0.5])
VALUES = T([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])


def _token_rewards(kl_ctl, kind):
    """AReaL's per-token rewards (docs/ppo-semantics.md "Per-token rewards"), written out for the
    golden example."""
    m = torch.roll(LOSS_MASK_TOKENS, -1, dims=1).float()
    old = torch.roll(INF_LOGP, -1, dims=1) * m
    ref = REF_LOGP * m
    lengths = ATTN.sum(1)
    no_eos = lengths == ATTN.shape[1]
    r = -kl_ctl * kl_estimate(old, ref, kind)
    for i in range(2):
        r[i, lengths[i] - 1] = 0.0
        r[i, max(int(lengths[i]) - 2, 0)] += R[i]
    return r, m, no_eos


@pytest.mark.parametrize(
    "kl_ctl,kind,gamma,lam,critic,expected,expected_returns",
    [
        (0.0, "k1", 1.0, 1.0, False, [[1, 1, 1, 1, 0, 0], [0.5, 0.5, 0.5, 0.5, 0.5, 0]], None),
        (
            0.1,
            "k1",
            1.0,
            1.0,
            False,
            [[1.01, 1.01, 1.0, 1.01, 0, 0], [0.51, 0.51, 0.53, 0.51, 0.52, 0]],
            None,
        ),
        (
            0.05,
            "k3",
            0.9,
            0.8,
            True,
            [
                [0.42367, 0.42367, 0.49157, 0.59974, 0, 0],
                [0.18174, 0.18174, 0.23983, 0.33459, 0.47893, 0],
            ],
            [
                [0.52367, 0.62367, 0.79157, 0.99974, 0.5, 0.6],
                [0.88174, 0.98174, 1.13983, 1.33459, 1.57893, 1.2],
            ],
        ),
    ],
    ids=["plain", "kl-k1", "critic-k3"],
)
def test_gae_golden(kl_ctl, kind, gamma, lam, critic, expected, expected_returns):
    r, m, no_eos = _token_rewards(kl_ctl, kind)
    values = VALUES if critic else torch.zeros_like(VALUES)
    adv, ret = gae(r, values, m, gamma=gamma, lam=lam, bootstrap=no_eos)
    torch.testing.assert_close(adv, T(expected), atol=2e-5, rtol=0)
    if expected_returns is not None:
        torch.testing.assert_close(ret, T(expected_returns), atol=2e-5, rtol=0)


def test_gae_then_batch_normalization_golden():
    r, m, no_eos = _token_rewards(0.1, "k2")
    adv, _ = gae(r, torch.zeros_like(VALUES), m, gamma=1.0, lam=1.0, bootstrap=no_eos)
    out = normalize(adv, NormConfig(), m)
    expected = [
        [0, 1.06713, 1.06899, 1.07085, 0, 0],
        [0, -0.81151, -0.80407, -0.79663, -0.79477, 0],
    ]
    torch.testing.assert_close(out, T(expected), atol=2e-5, rtol=0)


def test_kl_estimators_clamped():
    x = kl_estimate(T([-2.0, -0.5, -30.0]), torch.zeros(3), "k1")
    assert torch.equal(x, T([-2.0, -0.5, -10.0]))
    assert kl_estimate(T([1.0]), T([0.0]), "k2").item() == pytest.approx(0.5)
    assert kl_estimate(T([1.0]), T([0.0]), "k3").item() == pytest.approx(math.exp(-1) - 1 + 1)
