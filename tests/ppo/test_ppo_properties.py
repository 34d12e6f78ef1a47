"""Hypothesis properties of the math core."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.ppo import NormConfig, RejectionSampling, gae, normalize, ppo_actor_loss

settings.register_profile("harness", deadline=None, max_examples=60)
settings.load_profile("harness")


@st.composite
def loss_inputs(draw, max_b=3, max_t=5):
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    lt = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    lp = lt + torch.randn(B, T, generator=g, dtype=torch.float64) * draw(
        st.sampled_from([0.0, 0.05, 0.5])
    )
    lb = lp + torch.randn(B, T, generator=g, dtype=torch.float64) * draw(
        st.sampled_from([0.0, 0.3, 1.0])
    )
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(B, T, generator=g) < 0.8
    return lt, lp, lb, adv, mask


@given(loss_inputs(), st.sampled_from([0.1, 0.2, 0.3]))
def test_clip_is_inert_inside_the_band(inp, eps):
    lt, lp, lb, adv, mask = inp
    # keep every ratio strictly inside [1-eps, 1+eps]
    lt = lp + torch.clamp(lt - lp, -0.5 * eps, 0.5 * eps)
    clipped, st_ = ppo_actor_loss(lt, lp, lb, adv, mask, eps_clip=eps)
    unclipped = -(adv * torch.exp(lt - lp))[mask].sum() / max(int(mask.sum()), 1)
    assert clipped.item() == pytest.approx(unclipped.item(), rel=1e-9, abs=1e-12)
    assert not st_["clip_mask"].any()


@given(loss_inputs())
def test_dual_clip_never_binds_on_nonnegative_advantages(inp):
    lt, lp, lb, adv, mask = inp
    adv = adv.abs()
    a, sa = ppo_actor_loss(lt, lp, lb, adv, mask, eps_clip=0.2, c_clip=1.01)
    b, _ = ppo_actor_loss(lt, lp, lb, adv, mask, eps_clip=0.2)
    assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-15)
    assert not sa["dual_clip_mask"].any()


@given(loss_inputs())
def test_huge_c_clip_equals_no_dual_clip(inp):
    lt, lp, lb, adv, mask = inp
    a, _ = ppo_actor_loss(lt, lp, lb, adv, mask, eps_clip=0.2, c_clip=1e12)
    b, _ = ppo_actor_loss(lt, lp, lb, adv, mask, eps_clip=0.2)
    assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-15)


@given(
    loss_inputs(),
    st.sampled_from(["token_mask", "token_truncate", "sequence_mask", "sequence_truncate"]),
)
def test_behaviour_weights_are_one_when_proximal_equals_old(inp, mode):
    lt, lp, _, adv, mask = inp
    _, st_ = ppo_actor_loss(
        lt, lp, lp, adv, mask, eps_clip=0.2, behave_imp_weight_mode=mode, behave_imp_weight_cap=2.0
    )
    w = st_["behave_imp_weight"]
    assert torch.all(w[mask] == 1.0)
    assert torch.all(w[~mask] == 0.0)
    assert st_["filtered_fraction"] == 0.0


@st.composite
def norm_inputs(draw):
    B = draw(st.integers(2, 6))
    T = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, generator=g, dtype=torch.float64) * draw(
        st.sampled_from([0.1, 1.0, 50.0])
    )
    x = x + draw(st.floats(-100, 100))
    mask = torch.rand(B, T, generator=g) < 0.75
    mask[0, 0] = True
    mask[1, 0] = True
    return x, mask


@given(norm_inputs())
def test_batch_normalization_zero_mean_unit_std(inp):
    x, mask = inp
    out = normalize(x, NormConfig(eps=0.0), mask).double()
    v = out[mask]
    if x[mask].std() < 1e-6:  # degenerate: all valid entries equal
        return
    assert abs(v.mean().item()) < 1e-4
    assert v.std(unbiased=True).item() == pytest.approx(1.0, rel=1e-4)


@given(
    norm_inputs(),
    st.floats(0.01, 100),
    st.floats(-100, 100),
    st.sampled_from(["batch", "group"]),
    st.sampled_from(["batch", "group"]),
    st.booleans(),
)
def test_positive_affine_invariance(inp, scale, shift, mean_level, std_level, loo):
    x, _ = inp
    x = x[: x.shape[0] // 2 * 2]
    x = torch.cat([x, x.flip(1) * 0.5 + 1.0], dim=1)  # T >= 2: every scope holds >= 4 entries
    mask = torch.ones_like(x, dtype=torch.bool)
    cfg = NormConfig(mean_level, loo, std_level, True, eps=0.0, group_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = normalize(x, cfg, mask)
        b = normalize(x * scale + shift, cfg, mask)
    # entries whose scope has (near) zero spread are ill-conditioned; compare the rest
    ok = (a.abs() < 1e3) & (b.abs() < 1e3)
    torch.testing.assert_close(a[ok], b[ok], rtol=1e-3, atol=1e-3)


@given(
    norm_inputs(),
    st.sampled_from([None, "batch", "group"]),
    st.sampled_from([None, "batch", "group"]),
    st.booleans(),
)
def test_masked_positions_never_influence_normalize(inp, mean_level, std_level, loo):
    x, mask = inp
    cfg = NormConfig(mean_level, loo, std_level, True, group_size=1)
    junk = x.clone()
    junk[~mask] = (
        torch.tensor([float("nan"), float("inf"), -1e30, 7.0])
        .repeat(x.numel())[: int((~mask).sum())]
        .double()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = normalize(x, cfg, mask)
        b = normalize(junk, cfg, mask)
    assert torch.equal(a[mask], b[mask])
    if mean_level is not None or std_level is not None:
        assert torch.all(b[~mask] == 0)


@given(
    loss_inputs(),
    st.sampled_from(["token", "sequence"]),
    st.sampled_from([None, "token_mask", "sequence_truncate"]),
    st.sampled_from(
        ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    ),
)
def test_masked_positions_never_influence_loss(inp, level, mode, agg):
    lt, lp, lb, adv, mask = inp
    junk = lambda t: torch.where(mask, t, torch.full_like(t, -123.0))  # noqa: E731
    kw = dict(
        eps_clip=0.2,
        c_clip=3.0,
        importance_sampling_level=level,
        loss_agg_mode=agg,
        behave_imp_weight_mode=mode or "disabled",
        behave_imp_weight_cap=2.0 if mode else None,
    )
    a, sa = ppo_actor_loss(lt, lp, lb, adv, mask, **kw)
    b, sb = ppo_actor_loss(junk(lt), junk(lp), junk(lb), junk(adv), mask, **kw)
    assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-15)
    for k in ("clip_mask", "dual_clip_mask", "clip_low_mask", "clip_high_mask"):
        assert torch.equal(sa[k], sb[k])


@given(
    st.integers(1, 4),
    st.integers(1, 10),
    st.integers(0, 10**6),
    st.sampled_from([1.0, 0.9]),
    st.sampled_from([1.0, 0.8, 0.0]),
)
def test_masked_positions_never_influence_gae_on_valid_tokens(B, T, seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) < 0.6
    a, _ = gae(r, v, m, gamma=gamma, lam=lam)
    r2 = torch.where(m, r, torch.full_like(r, 99.0))
    b, _ = gae(r2, v, m, gamma=gamma, lam=lam)
    assert torch.equal(a, b)


def test_sign_aware_clip_masks_partition_clip_mask():
    g = torch.Generator().manual_seed(3)
    lt = -torch.rand(4, 8, generator=g)
    lp = lt + torch.randn(4, 8, generator=g)
    adv = torch.randn(4, 8, generator=g)
    m = torch.rand(4, 8, generator=g) < 0.8
    _, s = ppo_actor_loss(lt, lp, lp, adv, m, eps_clip=0.2, eps_clip_higher=0.28)
    r = torch.exp(lt - lp)
    assert torch.equal(s["clip_low_mask"], m & (adv < 0) & (r < 0.8))
    assert torch.equal(s["clip_high_mask"], m & (adv > 0) & (r > 1.28))
    assert torch.equal(s["clip_low_mask"] | s["clip_high_mask"], s["clip_mask"])


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(eps_clip=0.0), "eps_clip: must be a finite number > 0; got 0.0"),
        (
            dict(eps_clip=0.2, eps_clip_higher=-0.1),
            "eps_clip_higher: must be a finite number >= 0; got -0.1",
        ),
        (dict(eps_clip=0.2, c_clip=1.0), "c_clip: must be a finite number > 1; got 1.0"),
        (
            dict(eps_clip=0.2, behave_imp_weight_mode="token_mask", behave_imp_weight_cap=1.0),
            "behave_imp_weight_cap: must be a finite number > 1; got 1.0",
        ),
        (
            dict(eps_clip=0.2, behave_imp_weight_mode="bogus"),
            "behave_imp_weight_mode: must be one of 'disabled', ",
        ),
        (
            dict(eps_clip=0.2, importance_sampling_level="prompt"),
            "importance_sampling_level: must be one of 'token', 'sequence'; got 'prompt'",
        ),
        (dict(eps_clip=0.2, loss_agg_mode="sum"), "loss_agg_mode: must be one of 'token-mean', "),
        (
            dict(
                eps_clip=0.2,
                behave_imp_weight_mode="token_mask",
                rejection_sampling=RejectionSampling(),
            ),
            "not both",
        ),
    ],
)
def test_validation_errors(kw, msg):
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=msg):
        ppo_actor_loss(x, x, x, x, torch.ones(1, 2, dtype=torch.bool), **kw)


def test_shape_mismatch_and_bad_configs():
    with pytest.raises(ValueError, match="shape mismatch"):
        ppo_actor_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 3),
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1, 2, dtype=torch.bool),
            eps_clip=0.2,
        )
    with pytest.raises(
        ValueError, match="mean_level: must be one of 'batch', 'group' or null; got 'token'"
    ):
        NormConfig(mean_level="token")
    with pytest.raises(ValueError, match=r"group_size: must be an integer in \[1, 10_000\]; got 0"):
        NormConfig(group_size=0)
    with pytest.raises(ValueError, match="upper must be > 1"):
        RejectionSampling(upper=1.0)
    with pytest.raises(ValueError, match="requires metric 'ratio'"):
        RejectionSampling(action="clamp", metric="kl_k3", upper=1.0)
    with pytest.raises(ValueError, match="must be <= upper"):
        RejectionSampling(lower=3.0, upper=2.0)
    with pytest.raises(ValueError, match="agg 'max' has no effect at level 'token'"):
        RejectionSampling(agg="max")


def test_gradient_flows_only_through_logprobs():
    lt = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    lp = torch.tensor([[-1.1, -0.5, -1.0]], requires_grad=True)
    loss, _ = ppo_actor_loss(
        lt,
        lp,
        lp.detach(),
        torch.tensor([[1.0, -1.0, 0.5]]),
        torch.ones(1, 3, dtype=torch.bool),
        eps_clip=0.2,
    )
    loss.backward()
    assert lt.grad is not None and lt.grad.abs().sum() > 0
    assert lp.grad is None
