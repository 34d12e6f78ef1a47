"""Peer agreement: each correction against a straightforward transcription of the peer's formula
(TRL 1.16 vllm_importance_sampling_* and off_policy_mask_threshold, verl
algorithm.rollout_correction, SkyRL off_policy_correction), loss AND gradient on random tensors.

The peers' per-token surrogate is the vanilla PPO clip, multiplied by their weight and mask and
aggregated as each aggregates (TRL / SkyRL: pre-filter token mean; verl decoupled rollout_rs:
post-filter)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from harness.ppo.corrections import Correction, Filter
from harness.ppo.objectives import cispo_loss, ppo_actor_loss
from harness.ppo.objectives.reinforce import reinforce_loss
from tests.support.peer_inputs import assert_agree, correction_inputs

EPS = 0.2


def clip_pg(lt, lold, A):
    r = torch.exp(lt - lold)
    return torch.maximum(-A * r, -A * r.clamp(1 - EPS, 1 + EPS))


def ours(lt, lp, lb, A, M, c, loss=ppo_actor_loss, **kw):
    out, _ = loss(lt, lp, lb, A, M, correction=c, **kw)
    return out


# --------------------------------------------------------------------------- TRL 1.16


def trl_rho(lp, lb, M, mode, cmin, cmax):
    delta = torch.nan_to_num((lp - lb) * M, nan=0.0)
    rho = torch.exp(delta) if mode.startswith("token") else torch.exp(delta.sum(-1, keepdim=True))
    if mode.endswith("truncate"):
        return rho.clamp(min=cmin, max=cmax)
    out = torch.zeros_like(rho, dtype=torch.bool)
    if cmin is not None:
        out |= rho < cmin
    if cmax is not None:
        out |= rho > cmax
    return torch.where(out, torch.zeros_like(rho), rho)


def trl_loss(lt, lp, lb, A, M, mode=None, cmin=None, cmax=None, opsm=None):
    pg = clip_pg(lt, lp, A)
    Mf = M.to(lt.dtype)
    if opsm is not None:
        d = torch.nan_to_num((lb - lt.detach()) * Mf, nan=0.0)
        mean = d.sum(-1) / Mf.sum(-1).clamp(min=1)
        keep = (A[:, 0] >= 0) | (mean <= opsm)
        pg = pg * keep[:, None]
    if mode is not None:
        pg = pg * trl_rho(lp, lb, M, mode, cmin, cmax)
    return (pg * Mf).sum() / Mf.sum().clamp(min=1)


TRL_CASES = {
    "token_truncate": (
        "token_truncate",
        0.8,
        1.2,
        Correction(weight="token", clip_min=0.8, clip_max=1.2),
    ),
    "token_mask": (
        "token_mask",
        0.8,
        1.2,
        Correction(weight="token", clip_min=0.8, clip_max=1.2, zero_outside=True),
    ),
    "sequence_truncate": (
        "sequence_truncate",
        None,
        1.5,
        Correction(weight="sequence_product", clip_max=1.5),
    ),
    "sequence_mask": (
        "sequence_mask",
        0.5,
        1.5,
        Correction(weight="sequence_product", clip_min=0.5, clip_max=1.5, zero_outside=True),
    ),
}


@pytest.mark.parametrize("case", sorted(TRL_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_trl_vllm_importance_sampling(case, seed):
    mode, cmin, cmax, c = TRL_CASES[case]
    lt, lp, lb, A, M = correction_inputs(seed)
    assert_agree(trl_loss(lt, lp, lb, A, M, mode, cmin, cmax), ours(lt, lp, lb, A, M, c), lt)


def test_trl_presets_are_trl_modes():
    lt, lp, lb, A, M = correction_inputs(3)
    assert_agree(
        trl_loss(lt, lp, lb, A, M, "token_mask", None, 3.0),
        ours(lt, lp, lb, A, M, "token_mis"),
        lt,
    )
    assert_agree(
        trl_loss(lt, lp, lb, A, M, "sequence_mask", None, 3.0),
        ours(lt, lp, lb, A, M, "seq_mis"),
        lt,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_off_policy_mask_with_token_is(seed):
    lt, lp, lb, A, M = correction_inputs(seed)
    delta = 0.05  # small enough that some negative rows are dropped
    c = Correction(
        weight="token",
        clip_max=1.3,
        filters=(
            Filter(
                level="sequence",
                metric="k1",
                agg="mean",
                upper=delta,
                reference="current",
                negative_advantage_only=True,
            ),
        ),
    )
    peer = trl_loss(lt, lp, lb, A, M, "token_truncate", None, 1.3, opsm=delta)
    assert_agree(peer, ours(lt, lp, lb, A, M, c), lt)


def test_opsm_preset_is_trl_threshold_and_drops_only_negative_rows():
    lt, lp, lb, A, M = correction_inputs(4)
    lb = lb.clone()
    lb[1] -= 0.0  # row 1: unchanged
    lb[2] += 1.0  # row 2 far off-policy: drop it if A < 0
    A = A.clone()
    A[2] = -A[2].abs()
    A[3] = A[3].abs()
    lb[3] += 1.0  # positive advantage: kept however far
    peer = trl_loss(lt, lp, lb, A, M, opsm=0.5)
    assert_agree(peer, ours(lt, lp, lb, A, M, "opsm"), lt)
    _, stats = ppo_actor_loss(lt, lp, lb, A, M, correction="opsm")
    dropped = stats["correction_masked"]
    assert dropped[2][M[2]].all() and not dropped[3].any()


# --------------------------------------------------------------------------- verl


# verl-project/verl, the commits its functions are transcribed from.
VERL_HELPER = "be3e5054f4ad962743a1308b608228126fb10b02"  # verl/trainer/ppo/rollout_corr_helper.py
VERL_TORCH_F = "f6ea48d1900bcb86ca38dec38ae82b36b3468ec3"  # verl/utils/torch_functional.py
VERL_CORE = "5b98636684f9e4881697a4ad46ddf5bf6f8f5fdc"  # verl/trainer/ppo/core_algos.py


def verl_masked_sum(values, mask, axis=None):
    """verl/utils/torch_functional.py ``masked_sum`` at VERL_TORCH_F."""
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    """verl/utils/torch_functional.py ``masked_mean`` at VERL_TORCH_F: Σ / (n + 1e-8)."""
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_distributed_masked_mean(local_tensor, local_mask):
    """verl/utils/torch_functional.py ``distributed_masked_mean`` at VERL_TORCH_F on one rank
    (its two all_reduce calls are then the identity): Σ / n, no ε."""
    local_tensor = local_tensor * local_mask
    local_sum = torch.sum(local_tensor)
    local_num = torch.sum(local_mask)
    return local_sum / local_num


def verl_is_weights(lp, lb, M, level, threshold, batch_normalize=False, distributed=False):
    """verl/trainer/ppo/rollout_corr_helper.py ``compute_rollout_correction_weights`` at
    VERL_HELPER with log_ratio = ℓp − ℓb: (ρ, metrics["rollout_is_batch_norm_factor"] or None).
    A bool M is passed as a mask of the log-probs' dtype (float64 here; verl's trainer passes its
    int64 attention mask, see test_verl_batch_normalize_epsilon_under_an_int_mask).
    ``distributed``: the ``torch.distributed.is_initialized()`` branch, which verl takes when it
    builds ρ inside the actor's loss (bypass mode)."""
    response_mask = M.to(lp.dtype) if M.dtype == torch.bool else M
    log_ratio = lp - lb
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw = raw * response_mask
    if isinstance(threshold, str):  # IcePop "lower_upper"
        lo, hi = (float(x) for x in threshold.split("_"))
        kept = (raw >= lo) & (raw <= hi)
        rho = torch.where(kept, raw, torch.zeros_like(raw))
    else:  # TIS
        rho = raw.clamp(max=threshold)
    rho = rho.detach()
    factor = None
    if batch_normalize:
        mask_float = response_mask.to(dtype=rho.dtype)
        if level == "token":
            if distributed:
                weights_mean = verl_distributed_masked_mean(rho, mask_float)
            else:
                weights_mean = verl_masked_mean(rho, response_mask)
        else:
            seq_weights = verl_masked_mean(rho, response_mask, axis=-1)
            seq_mask = (response_mask.sum(dim=-1) > 0).to(dtype=rho.dtype)
            if distributed:
                weights_mean = verl_distributed_masked_mean(seq_weights, seq_mask)
            else:
                weights_mean = (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if weights_mean > 1e-8:
            rho = rho / weights_mean
            factor = weights_mean.item()
        else:
            factor = 1.0
    return rho, factor


def verl_is(lp, lb, M, level, threshold, batch_normalize=False, distributed=False):
    return verl_is_weights(lp, lb, M, level, threshold, batch_normalize, distributed)[0]


def verl_rs(lp, lb, M, options, thresholds):
    L = (lp - lb).clamp(-20, 20)
    stats = {"k1": -L, "k2": 0.5 * L * L, "k3": torch.exp(L) - 1 - L}
    n = M.sum(-1, keepdim=True)
    keep = torch.ones_like(M)
    for opt, thr in zip(options, thresholds, strict=True):
        level, k = opt.rsplit("_", 1)
        x = stats[k]
        if level == "token":
            s = x
        elif level == "seq_sum":
            s = (x * M).sum(-1, keepdim=True)
        elif level == "seq_mean":
            s = (x * M).sum(-1, keepdim=True) / (n + 1e-8)
        else:  # seq_max
            s = torch.where(M, x, torch.full_like(x, -math.inf)).max(-1, keepdim=True).values
            s = torch.where(n > 0, s, torch.zeros_like(s))
        if k == "k1":
            if isinstance(thr, str):
                lo, hi = (float(v) for v in thr.split("_"))
            else:
                lo, hi = 1 / thr, thr
            ok = (s >= math.log(lo)) & (s <= math.log(hi))
        else:
            ok = s <= thr
        keep = keep & ok
    return M & keep


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    """verl/trainer/ppo/core_algos.py ``agg_loss`` at VERL_CORE on one rank without global batch
    info (dp_size 1; batch_num_tokens and global_batch_size are this batch's counts)."""
    dp_size = 1
    if loss_agg_mode == "token-mean":
        batch_num_tokens = loss_mask.sum()
        return verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        global_batch_size = seq_mask.sum()
        return verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        global_batch_size = seq_mask.sum()
        return verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    assert loss_agg_mode == "seq-mean-token-sum-norm"
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    return torch.sum(seq_losses) / loss_mask.shape[-1]


def verl_loss(lt, lp, lb, A, M, rho=None, mask=None, loss_agg_mode="token-mean"):
    pg = clip_pg(lt, lp, A)
    if rho is not None:
        pg = pg * rho
    mask = M if mask is None else mask
    return verl_agg_loss(pg, mask.to(lt.dtype), loss_agg_mode)


VERL_IS = {
    "token_tis": ("token", 1.1, Correction(weight="token", clip_max=1.1, log_clamp=20.0)),
    "seq_tis": (
        "sequence",
        1.5,
        Correction(weight="sequence_product", clip_max=1.5, log_clamp=20.0),
    ),
    "token_icepop": (
        "token",
        "0.8_1.25",
        Correction(weight="token", clip_min=0.8, clip_max=1.25, zero_outside=True, log_clamp=20.0),
    ),
    "seq_icepop": (
        "sequence",
        "0.5_2.0",
        Correction(
            weight="sequence_product", clip_min=0.5, clip_max=2.0, zero_outside=True, log_clamp=20.0
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(VERL_IS))
@pytest.mark.parametrize("batch_normalize", [False, True])
def test_verl_rollout_is(case, batch_normalize):
    level, thr, c = VERL_IS[case]
    c = Correction(**{**c.__dict__, "batch_normalize": batch_normalize})
    lt, lp, lb, A, M = correction_inputs(5)
    rho = verl_is(lp, lb, M, level, thr, batch_normalize)
    assert_agree(verl_loss(lt, lp, lb, A, M, rho), ours(lt, lp, lb, A, M, c), lt)


def test_verl_presets_match_verl_presets():
    lt, lp, lb, A, M = correction_inputs(6)
    for name, (level, thr) in {
        "token_tis": ("token", 2.0),
        "seq_tis": ("sequence", 2.0),
        "icepop": ("token", "0.5_5.0"),
    }.items():
        rho = verl_is(lp, lb, M, level, thr)
        assert_agree(verl_loss(lt, lp, lb, A, M, rho), ours(lt, lp, lb, A, M, name), lt)


def _filter(opt, thr):
    level, k = opt.rsplit("_", 1)
    agg = {"token": "mean", "seq_sum": "sum", "seq_mean": "mean", "seq_max": "max"}[level]
    lvl = "token" if level == "token" else "sequence"
    if k == "k1":
        lo, hi = (float(v) for v in thr.split("_"))
        return Filter(level=lvl, metric="k1", agg=agg, lower=math.log(lo), upper=math.log(hi))
    return Filter(level=lvl, metric=k, agg=agg, upper=thr)


VERL_RS = [
    (["token_k1"], ["0.8_1.25"]),
    (["seq_sum_k1"], ["0.5_2.0"]),
    (["seq_mean_k1"], ["0.95_1.05"]),
    (["token_k2"], [0.02]),
    (["seq_mean_k3"], [0.02]),
    (["seq_max_k2"], [0.05]),
    (["seq_sum_k2", "token_k1"], [0.2, "0.7_1.4"]),  # stacked
]


@pytest.mark.parametrize("options,thresholds", VERL_RS)
def test_verl_rollout_rs_post_filter_denominator(options, thresholds):
    lt, lp, lb, A, M = correction_inputs(7)
    mask = verl_rs(lp, lb, M, options, thresholds)
    assert 0 < int(mask.sum()) < int(M.sum())  # the filter bites, and not everything
    c = Correction(
        filters=tuple(_filter(o, t) for o, t in zip(options, thresholds, strict=True)),
        denominator="post",
    )
    assert_agree(verl_loss(lt, lp, lb, A, M, mask=mask), ours(lt, lp, lb, A, M, c), lt)


def test_verl_geo_rs_token_tis():
    """ "Geo-RS-Token-TIS": rollout_is=token with rollout_rs=seq_mean_k1."""
    lt, lp, lb, A, M = correction_inputs(8)
    mask = verl_rs(lp, lb, M, ["seq_mean_k1"], ["0.95_1.05"])
    rho = verl_is(lp, lb, M, "token", 1.2)
    c = Correction(
        weight="token",
        clip_max=1.2,
        log_clamp=20.0,
        filters=(_filter("seq_mean_k1", "0.95_1.05"),),
        denominator="post",
    )
    assert_agree(verl_loss(lt, lp, lb, A, M, rho, mask), ours(lt, lp, lb, A, M, c), lt)


def test_verl_bypass_ppo_clip_with_rs_against_current_policy():
    lt, _, lb, A, M = correction_inputs(9)
    # bypass: ℓp := ℓb, RS from sg(ℓθ) vs ℓb inside the loss, pre-filter denominator.
    mask = verl_rs(lt.detach(), lb, M, ["seq_mean_k3"], [0.04])
    assert 0 < int(mask.sum()) < int(M.sum())
    pg = clip_pg(lt, lb, A)
    peer = (pg * mask).sum() / M.sum()
    c = Correction(bypass=True, filters=(Filter(level="sequence", metric="k3", upper=0.04),))
    assert_agree(peer, ours(lt, lb, lb, A, M, c), lt)


def verl_bypass_reinforce(lt, lb, A, M, level, threshold, batch_normalize=False):
    """verl bypass_mode with loss_type reinforce (verl-project/verl
    verl/trainer/ppo/core_algos.py ``compute_policy_loss_bypass_mode`` →
    ``compute_policy_loss_reinforce``; weights from rollout_corr_helper.py with sg(ℓθ) in the
    place of old_log_prob): L = −A·ℓθ·ρ, token-mean over the caller's mask."""
    rho = verl_is(lt.detach(), lb, M, level, threshold, batch_normalize, distributed=True)
    return verl_agg_loss(-A * lt * rho, M.to(lt.dtype), "token-mean")


def test_verl_bypass_token_reinforce_is_cispo_under_bypass():
    """verl bypass + reinforce + rollout_is=token, threshold C: the same loss and gradient as
    cispo (ratio_max C) under preset bypass (min(exp(clamp(x, ±20)), C) = min(exp(x), C) here)."""
    lt, _, lb, A, M = correction_inputs(10)
    peer = verl_bypass_reinforce(lt, lb, A, M, "token", 1.1)
    assert_agree(peer, ours(lt, lb, lb, A, M, "bypass", loss=cispo_loss, ratio_max=1.1), lt)
    c = Correction(bypass=True, weight="token", clip_max=1.1, log_clamp=20.0)
    assert_agree(
        verl_bypass_reinforce(lt, lb, A, M, "token", 1.1),
        ours(lt, lb, lb, A, M, c, reinforce_loss),
        lt,
    )


def test_verl_bypass_pg_is_is_sequence_level():
    """verl's ``RolloutCorrectionConfig.bypass_pg_is()`` (rollout_is="sequence", threshold 2.0,
    loss_type reinforce): ρ_i = min(exp(clamp(Σ_t M(ℓθ − ℓb), ±20)), 2) broadcast over the row,
    = preset bypass_pg_is under policy_loss reinforce; 200 float64 draws to 1e-12.  The token
    form (cispo under bypass) does not equal it."""
    g = torch.Generator().manual_seed(33)
    capped = 0
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        lb = lt.detach() + (lb - lp)  # the sampler drifts from the current policy
        x = lt.detach().clone().requires_grad_(True)
        peer = verl_bypass_reinforce(x, lb, A, M, "sequence", 2.0)
        (g_peer,) = torch.autograd.grad(peer, x)
        y = lt.detach().clone().requires_grad_(True)
        mine, stats = reinforce_loss(y, lb, lb, A * M, M, correction="bypass_pg_is")
        (g_mine,) = torch.autograd.grad(mine, y)
        torch.testing.assert_close(mine.detach(), peer.detach(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(g_mine, g_peer, rtol=1e-12, atol=1e-13)
        capped += int(stats["correction_truncated"].any())
    assert capped > 20  # the threshold 2 binds on many draws
    lt, _, lb, A, M = correction_inputs(10)
    lb = lb - 0.3  # rows far enough off that the sequence product exceeds 2
    token = ours(lt, lb, lb, A, M, "bypass", loss=cispo_loss, ratio_max=2.0)
    assert not torch.allclose(token, verl_bypass_reinforce(lt, lb, A, M, "sequence", 2.0))


def _exact_mean(rho, M, level):
    """ρ̄ without verl's ε: the plain mean over valid tokens, or over non-empty rows."""
    if level == "token":
        return float(rho[M].mean())
    rows = M.any(-1)
    return float((rho.sum(-1)[rows] / M.sum(-1)[rows]).mean())


def _assert_weights_agree(got, g_got, stats, want, g_want, rho, factor):
    torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(stats["behave_imp_weight"], rho, rtol=1e-12, atol=1e-13)
    assert stats["correction_norm_factor"] == pytest.approx(factor, rel=1e-12, abs=0)


@pytest.mark.parametrize("case", sorted(VERL_IS))
def test_verl_batch_normalize_with_its_epsilons_float64_draws(case):
    """``rollout_is_batch_normalize`` in decoupled mode (verl builds ρ on the driver, without a
    process group): loss, gradient, ρ and the norm factor equal ``compute_rollout_correction_
    weights`` (rollout_corr_helper.py at VERL_HELPER) through verl's PPO loss on 200 float64
    draws to 1e-12.  The plain mean misses verl's by more than that: the test sees the ε."""
    level, thr, base = VERL_IS[case]
    c = Correction(**{**base.__dict__, "batch_normalize": True})
    g = torch.Generator().manual_seed(35)
    sees_eps = 0
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        rho, factor = verl_is_weights(lp, lb, M, level, thr, batch_normalize=True)
        x = lt.detach().clone().requires_grad_(True)
        want = verl_loss(x, lp, lb, A, M, rho)
        (g_want,) = torch.autograd.grad(want, x)
        y = lt.detach().clone().requires_grad_(True)
        got, stats = ppo_actor_loss(y, lp, lb, A * M, M, correction=c)
        (g_got,) = torch.autograd.grad(got, y)
        _assert_weights_agree(got, g_got, stats, want, g_want, rho, factor)
        plain = _exact_mean(verl_is(lp, lb, M, level, thr), M, level)
        sees_eps += plain != pytest.approx(factor, rel=1e-12, abs=0)
    assert sees_eps > 150


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_verl_bypass_batch_normalize_is_the_distributed_mean(level):
    """In bypass mode verl builds ρ inside the actor's loss, under torch.distributed, so its
    batch means are ``distributed_masked_mean``'s Σ/n (no ε) over the tokens, or over the rows'
    ``masked_mean`` (with ε).  Preset bypass_pg_is (and its token form) with batch_normalize
    under reinforce: loss, gradient, ρ and the factor on 200 float64 draws to 1e-12."""
    weight = "token" if level == "token" else "sequence_product"
    c = Correction(weight=weight, clip_max=2.0, log_clamp=20.0, bypass=True, batch_normalize=True)
    g = torch.Generator().manual_seed(36)
    differs_from_decoupled = 0
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        lb = lt.detach() + (lb - lp)
        x = lt.detach().clone().requires_grad_(True)
        want = verl_bypass_reinforce(x, lb, A, M, level, 2.0, batch_normalize=True)
        (g_want,) = torch.autograd.grad(want, x)
        rho, factor = verl_is_weights(
            lt.detach(), lb, M, level, 2.0, batch_normalize=True, distributed=True
        )
        y = lt.detach().clone().requires_grad_(True)
        got, stats = reinforce_loss(y, lb, lb, A * M, M, correction=c)
        (g_got,) = torch.autograd.grad(got, y)
        _assert_weights_agree(got, g_got, stats, want, g_want, rho, factor)
        _, decoupled = verl_is_weights(lt.detach(), lb, M, level, 2.0, batch_normalize=True)
        differs_from_decoupled += decoupled != pytest.approx(factor, rel=1e-12, abs=0)
    # Tokens: the driver's masked_mean carries the ε, the loss's distributed mean does not; rows:
    # both divide the rows' sum by their exact count.
    assert differs_from_decoupled > 150 if level == "token" else differs_from_decoupled == 0


def test_verl_batch_normalize_epsilon_under_an_int_mask():
    """What docs/corrections.md says of verl's own runs: with the int64 attention mask verl's
    trainer passes, n + 1e-8 is formed in float32 and rounds to n, so verl's ρ̄ is the plain
    mean; with a float64 mask (the comparisons above) it carries the ε, ≤ 1e-8/n apart."""
    lt, lp, lb, A, M = correction_inputs(11)
    for level in ("token", "sequence"):
        _, with_int = verl_is_weights(lp, lb, M.long(), level, 2.0, batch_normalize=True)
        _, with_float = verl_is_weights(lp, lb, M, level, 2.0, batch_normalize=True)
        plain = _exact_mean(verl_is(lp, lb, M, level, 2.0), M, level)
        assert with_int == pytest.approx(plain, rel=1e-15)
        assert with_float != pytest.approx(plain, rel=1e-12)
        assert with_float == pytest.approx(plain, rel=1e-8)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_verl_rejection_of_every_token_is_nan_in_verl_and_0_here(mode):
    """Decoupled rollout_rs that rejects every token: verl's ``agg_loss`` (core_algos.py at
    VERL_CORE) divides 0 by a surviving count of 0, so its loss is NaN (0 under
    seq-mean-token-sum-norm, which divides by T); its gradient is 0, masked_sum's torch.where
    dropping the NaN the division sends back.  The harness keeps its denominators ≥ 1 (as TRL
    clamps at 1): loss 0, the same gradient 0 (docs/corrections.md)."""
    lt, lp, lb, A, M = correction_inputs(7)
    options, thresholds = ["token_k1"], ["0.9999_1.0001"]
    mask = verl_rs(lp, lb, M, options, thresholds)
    assert M.any() and not mask.any()  # everything valid is rejected
    x = lt.detach().clone().requires_grad_(True)
    peer = verl_loss(x, lp, lb, A, M, mask=mask, loss_agg_mode=mode)
    (g_peer,) = torch.autograd.grad(peer, x)
    c = Correction(filters=(_filter(options[0], thresholds[0]),), denominator="post")
    y = lt.detach().clone().requires_grad_(True)
    got, _ = ppo_actor_loss(y, lp, lb, A, M, correction=c, loss_agg_mode=mode)
    (g_got,) = torch.autograd.grad(got, y)
    assert float(got.detach()) == 0.0
    assert torch.equal(g_got, torch.zeros_like(g_got))
    assert torch.equal(g_peer, torch.zeros_like(g_peer))
    if mode == "seq-mean-token-sum-norm":
        assert float(peer.detach()) == 0.0
    else:
        assert math.isnan(float(peer.detach()))


# --------------------------------------------------------------------------- SkyRL


def skyrl_loss(lt, lp, lb, A, M, *, outlier=None, token_mask=None, tis=None, seq_mask=None):
    lw = (lp - lb).clamp(-20, 20)
    w = torch.exp(lw)
    Mc = M.clone()
    if outlier is not None:
        lo, hi = outlier
        bad = ((w > hi) & M).any(-1) | ((w < lo) & M).any(-1)
        Mc &= ~bad[:, None]
    if token_mask is not None:
        lo, hi = token_mask
        Mc &= (w >= lo) & (w <= hi)
    rho = torch.ones_like(w)
    if tis is not None:
        kind, C = tis
        if kind == "token":
            rho = w.clamp(max=C)
        else:
            s = (lw * Mc).sum(-1, keepdim=True).clamp(-20, 20)
            rho = torch.exp(s).clamp(max=C).expand_as(w)
    if seq_mask is not None:
        kind, lo, hi = seq_mask
        n = Mc.sum(-1, keepdim=True)
        if kind == "geometric":
            v = torch.exp((lw * Mc).sum(-1, keepdim=True) / n.clamp(min=1))
        else:
            v = torch.exp((lw * Mc).sum(-1, keepdim=True).clamp(-20, 20))
        Mc &= (v >= lo) & (v <= hi)
    pg = clip_pg(lt, lp, A) * rho
    return (pg * Mc).sum() / M.sum()


def test_skyrl_four_stages_in_order():
    lt, lp, lb, A, M = correction_inputs(11, B=10)
    peer = skyrl_loss(
        lt,
        lp,
        lb,
        A,
        M,
        outlier=(0.4, 2.2),
        token_mask=(0.7, 1.5),
        tis=("sequence", 1.3),
        seq_mask=("geometric", 0.9, 1.1),
    )
    c = Correction(
        weight="sequence_product",
        clip_max=1.3,
        log_clamp=20.0,
        sequential=True,
        filters=(
            Filter(level="sequence", agg="max", upper=2.2),
            Filter(level="sequence", agg="min", lower=0.4),
            Filter(level="token", lower=0.7, upper=1.5),
            Filter(level="sequence", agg="mean", lower=0.9, upper=1.1),
        ),
    )
    assert_agree(peer, ours(lt, lp, lb, A, M, c), lt)


def test_geo_mask_preset_is_skyrl_geometric_mask_defaults():
    lt, lp, lb, A, M = correction_inputs(13, B=10)
    lp = lb + 0.01 * (lp - lb)  # near-on-policy rows, so SkyRL's 0.99/1.01 band keeps some
    peer = skyrl_loss(lt, lp, lb, A, M, seq_mask=("geometric", 0.99, 1.01))
    assert_agree(peer, ours(lt, lp, lb, A, M, "geo_mask"), lt)


@pytest.mark.parametrize(
    "kw,c",
    [
        ({"tis": ("token", 1.2)}, Correction(weight="token", clip_max=1.2, log_clamp=20.0)),
        (
            {"seq_mask": ("product", 0.5, 2.0)},
            Correction(filters=(Filter(level="sequence", agg="sum", lower=0.5, upper=2.0),)),
        ),
        (
            {"seq_mask": ("geometric", 0.97, 1.03)},
            Correction(filters=(Filter(level="sequence", agg="mean", lower=0.97, upper=1.03),)),
        ),
        ({"token_mask": (0.8, 1.25)}, Correction(filters=(Filter(lower=0.8, upper=1.25),))),
    ],
)
def test_skyrl_single_corrections(kw, c):
    lt, lp, lb, A, M = correction_inputs(12, B=10)
    assert_agree(skyrl_loss(lt, lp, lb, A, M, **kw), ours(lt, lp, lb, A, M, c), lt)


# --------------------------------------------------------------------------- TRL, called


def _trl_call(mode, cmin, cmax, lt, lp, lb, A, M, opsm=None, loss_type="bnpo"):
    """TRL 1.16 ``GRPOTrainer._compute_loss`` itself (loss_type bnpo, vLLM IS on), its loss and
    d loss / d ℓθ.  TRL computes ρ inline in ``_generate_and_score_completions`` (no function to
    call): ``_trl_ratio`` transcribes those lines (trl/trainer/grpo_trainer.py)."""
    pytest.importorskip("trl")
    from tests.support.trl_stand_in import TrainerStandIn, trl_compute_loss

    x = lt.detach().clone().requires_grad_(True)
    s = TrainerStandIn(loss_type, x)
    s.use_vllm = mode is not None
    s.vllm_importance_sampling_correction = mode is not None
    s.off_policy_mask_threshold = opsm
    more = {"sampling_per_token_logps": lb}
    if mode is not None:
        more["importance_sampling_ratio"] = _trl_ratio(lp, lb, M.to(lt.dtype), mode, cmin, cmax)
    loss = trl_compute_loss(s, lp, A[:, 0], M, **more)
    return loss, x.grad


def _trl_ratio(lp, lb, mask, mode, cmin, cmax):
    """TRL 1.16's vLLM IS weight, line for line (grpo_trainer.py, _generate_and_score_completions)."""
    diff = torch.nan_to_num((lp - lb) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=cmin, max=cmax)
    lo = cmin if cmin is not None else -math.inf
    hi = cmax if cmax is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


def _draw(g):
    """One random float64 batch: shape, lengths and mismatch spread vary with the draw."""
    B, T = int(torch.randint(2, 7, (1,), generator=g)), int(torch.randint(2, 9, (1,), generator=g))
    spread = float(torch.rand((), generator=g, dtype=torch.float64)) * 0.6
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lp = lb + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    lt = lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    M = torch.arange(T)[None] < lengths[:, None]
    A = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    return lt, lp, lb, A, M


@pytest.mark.parametrize("case", sorted(TRL_CASES))
def test_trl_vllm_importance_sampling_called_directly_float64(case):
    """200 random float64 draws: the harness's loss and gradient equal TRL's ``_compute_loss``
    to ~1e-12 (ρ is computed in float64 for float64 inputs, as TRL does)."""
    mode, cmin, cmax, c = TRL_CASES[case]
    g = torch.Generator().manual_seed(31)
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        want, g_want = _trl_call(mode, cmin, cmax, lt, lp, lb, A, M)
        x = lt.detach().clone().requires_grad_(True)
        got, _ = ppo_actor_loss(x, lp, lb, A * M, M, correction=c)
        got.backward()
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(x.grad, g_want, rtol=1e-12, atol=1e-13)


def test_trl_off_policy_mask_called_directly_float64():
    """TRL's ``get_off_policy_mask`` (through ``_compute_loss``) against preset ``opsm`` with its
    threshold, 200 float64 draws."""
    import dataclasses

    from harness.ppo.corrections import PRESETS

    base = PRESETS["opsm"].correction
    delta = 0.02  # small enough to drop some negative rows
    c = dataclasses.replace(base, filters=(dataclasses.replace(base.filters[0], upper=delta),))
    g = torch.Generator().manual_seed(32)
    dropped = 0
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        want, g_want = _trl_call(None, None, None, lt, lp, lb, A, M, opsm=delta)
        x = lt.detach().clone().requires_grad_(True)
        got, stats = ppo_actor_loss(x, lp, lb, A * M, M, correction=c)
        got.backward()
        dropped += int(stats["correction_masked"].any())
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(x.grad, g_want, rtol=1e-12, atol=1e-13)
    assert dropped > 20  # the mask acted on many draws


VESPO_CASES = {
    "token_truncate": (0.8, 1.25, Correction(weight="token", clip_min=0.8, clip_max=1.25)),
    "token_mask": (
        0.8,
        1.25,
        Correction(weight="token", clip_min=0.8, clip_max=1.25, zero_outside=True),
    ),
    # TRL's trainer refuses sequence_* modes with VESPO; its get_gamma_weights takes their
    # [B, 1] ratio all the same (log ρ_i once per row), and so does the harness's fold.
    "sequence_truncate": (None, 2.0, Correction(weight="sequence_product", clip_max=2.0)),
    "sequence_mask": (
        0.5,
        2.0,
        Correction(weight="sequence_product", clip_min=0.5, clip_max=2.0, zero_outside=True),
    ),
}


@pytest.mark.parametrize("mode", sorted(VESPO_CASES))
def test_vespo_fold_is_trls_vespo_with_vllm_is(mode):
    """TRL's VESPO with vLLM IS (``_compute_loss`` and ``get_gamma_weights`` called): ρ folded
    into W, no second multiplication = ``vespo.behaviour_weight: fold``; 200 float64 draws to
    1e-12 (loss, gradient, φ).  The default 'multiply' is another loss; under sequence_* modes
    adding log ρ_i once per token (n_i times, ρ broadcast to the row) is another φ."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    from harness.ppo.objectives.vespo import vespo_loss

    cmin, cmax, c = VESPO_CASES[mode]
    g = torch.Generator().manual_seed(34)
    differs = n_times_differs = 0
    for _ in range(200):
        lt, lp, lb, A, M = _draw(g)
        want, g_want = _trl_call(mode, cmin, cmax, lt, lp, lb, A, M, loss_type="vespo")
        x = lt.detach().clone().requires_grad_(True)
        got, stats = vespo_loss(x, lp, lb, A * M, M, correction=c, behaviour_weight="fold")
        got.backward()
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(x.grad, g_want, rtol=1e-12, atol=1e-13)
        rho = _trl_ratio(lp, lb, M.to(lt.dtype), mode, cmin, cmax)
        assert rho.shape == ((lt.shape[0], 1) if mode.startswith("sequence") else lt.shape)
        gamma = functools.partial(GRPOTrainer.get_gamma_weights, A[:, :1], lt - lp, M.to(lt.dtype))
        phi = gamma(importance_sampling_ratio=rho)
        torch.testing.assert_close(stats["gate"][:, :1], phi, rtol=1e-12, atol=1e-13)
        multiplied, _ = vespo_loss(lt.detach(), lp, lb, A * M, M, correction=c)
        differs += not torch.allclose(multiplied, got.detach(), rtol=1e-6)
        if mode.startswith("sequence"):  # ρ_i on each valid token (1 on padding: log 1 = 0)
            n_times = gamma(importance_sampling_ratio=torch.where(M, rho, 1.0))
            n_times_differs += not torch.allclose(n_times, phi, rtol=1e-6)
    assert differs > 150
    assert n_times_differs > 150 or not mode.startswith("sequence")
