"""The mismatch metrics (harness/metrics/mismatch.py): golden numbers, a naive loop, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from harness.metrics import STEP_METRICS
from harness.metrics.mismatch import (
    DECOMPOSITION_KEYS,
    MISMATCH_KEYS,
    mismatch_decomposition,
    mismatch_stats,
)
from harness.metrics.stability import RUN_SUMMARY_KEYS, summarize_run

NAN = math.nan


def _golden_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows: two valid tokens, one valid token, none (NaN everywhere off the mask)."""
    behaviour = torch.tensor([[-1.0, -2.0, NAN], [-0.5, NAN, NAN], [NAN, NAN, NAN]])
    learner = torch.tensor([[-1.1, -1.8, NAN], [-0.5, 5.0, 7.0], [NAN, 3.0, NAN]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    return behaviour, learner, mask


def test_golden_numbers_by_hand():
    # log w = ℓp − ℓb on the valid tokens: −0.1, +0.2, 0; row sums 0.1, 0, (empty) 0.
    out = mismatch_stats(*_golden_batch())
    want = {
        "mismatch/kl_k1": (0.1 - 0.2 + 0.0) / 3,
        # (e^−0.1 − 1 + 0.1) + (e^0.2 − 1 − 0.2) + 0 = 0.004837418 + 0.021402758
        "mismatch/kl_k3": 0.026240176 / 3,
        "mismatch/logprob_abs_diff_mean": 0.1,
        "mismatch/logprob_abs_diff_max": 0.2,
        # |e^−1.1 − e^−1| = |0.332871084 − 0.367879441|
        "mismatch/prob_abs_diff_max": 0.035008357,
        # rows: (−3 + 2.9)/2 = −0.05, 0, and the empty row 0 (verl's n_i + 1e-8 divisor)
        "mismatch/log_ppl_diff": -0.05 / 3,
        "mismatch/ppl_ratio": (0.951229425 + 1 + 1) / 3,
        # (e^−0.2 + e^0.4 + e^0) / 3 − 1
        "mismatch/chi2_token": (0.818730753 + 1.491824698 + 1) / 3 - 1,
        # (e^0.2 + 1 + 1) / 3 − 1 (an empty row adds exp(0) − 1 = 0)
        "mismatch/chi2_seq": (1.221402758 + 2) / 3 - 1,
        # (Σw)² / (N Σw²), w = e^−0.1, e^0.2, 1
        "mismatch/ess": 3.126240176**2 / (3 * 3.310555451),
    }
    assert set(out) == set(MISMATCH_KEYS)
    for k, v in want.items():
        assert out[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k


def _naive(behaviour, learner, mask) -> dict[str, float]:
    """The definitions as plain Python loops over floats."""
    xs, dprob, rows, row_sums = [], [], [], []
    for b_row, p_row, m_row in zip(
        behaviour.tolist(), learner.tolist(), mask.tolist(), strict=True
    ):
        s, n = 0.0, 0
        for lb, lp, m in zip(b_row, p_row, m_row, strict=True):
            if m:
                xs.append(lp - lb)
                dprob.append(abs(math.exp(lp) - math.exp(lb)))
                s += lp - lb
                n += 1
        rows.append(-s / (n + 1e-8))
        row_sums.append(s)
    n = len(xs)
    w = [math.exp(x) for x in xs]
    mean_w = sum(w) / n
    return {
        "mismatch/kl_k1": sum(-x for x in xs) / n,
        "mismatch/kl_k3": sum(math.exp(x) - x - 1 for x in xs) / n,
        "mismatch/logprob_abs_diff_mean": sum(abs(x) for x in xs) / n,
        "mismatch/logprob_abs_diff_max": max(abs(x) for x in xs),
        "mismatch/prob_abs_diff_max": max(dprob),
        "mismatch/log_ppl_diff": sum(rows) / len(rows),
        "mismatch/ppl_ratio": sum(math.exp(r) for r in rows) / len(rows),
        "mismatch/chi2_token": sum(v * v for v in w) / n - 1,
        "mismatch/chi2_seq": sum(math.exp(2 * s) for s in row_sums) / len(rows) - 1,
        "mismatch/ess": 1 / (sum((v / (mean_w + 1e-8)) ** 2 for v in w) / n),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_a_naive_loop_on_random_batches(seed):
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 4
    learner = behaviour + 0.3 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=g) < 0.6
    mask[0] = False  # an empty row among them
    mask[1, 0] = True
    got = mismatch_stats(behaviour, learner, mask)
    want = _naive(behaviour, learner, mask)
    for k in MISMATCH_KEYS:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k


def test_identical_log_probs_give_zero_mismatch():
    lb = -torch.rand(3, 4)
    out = mismatch_stats(lb, lb.clone(), torch.ones(3, 4, dtype=torch.bool))
    for k in ("kl_k1", "kl_k3", "logprob_abs_diff_max", "prob_abs_diff_max", "chi2_token"):
        assert out[f"mismatch/{k}"] == 0.0, k
    assert out["mismatch/ppl_ratio"] == 1.0 and out["mismatch/ess"] == pytest.approx(1.0)


def test_k3_resolves_float32_rounding_sized_gaps():
    # A float32 sampler and learner differ by ~1e-7 per token: w − log w − 1 evaluated in
    # float32 would be pure rounding; the result must be ½·mean x² to a few percent.
    g = torch.Generator().manual_seed(0)
    lb = -torch.rand(8, 16, generator=g)
    x = 1e-7 * torch.randn(8, 16, generator=g, dtype=torch.float64)
    lp = lb.double() + x
    out = mismatch_stats(lb, lp, torch.ones(8, 16, dtype=torch.bool))
    assert out["mismatch/kl_k3"] == pytest.approx(float((x**2).mean() / 2), rel=0.05)
    assert 0 < out["mismatch/kl_k3"] < 1e-13


def test_no_valid_token_gives_nan_and_nan_off_the_mask_is_never_read():
    behaviour, learner, mask = _golden_batch()
    empty = mismatch_stats(behaviour, learner, torch.zeros_like(mask))
    assert all(math.isnan(v) for v in empty.values())
    none = torch.zeros(0, 3)
    assert all(math.isnan(v) for v in mismatch_stats(none, none, none.bool()).values())
    # NaN and huge values off the mask change nothing
    noisy = learner.clone()
    noisy[~mask] = 1e30
    assert mismatch_stats(behaviour, noisy, mask) == mismatch_stats(*_golden_batch())
    # NaN ON the mask is not hidden
    bad = behaviour.clone()
    bad[0, 0] = NAN
    assert math.isnan(mismatch_stats(bad, learner, mask)["mismatch/kl_k3"])


def test_huge_log_ratios_are_clamped_not_infinite():
    lb = torch.tensor([[-80.0, -1.0]])
    lp = torch.tensor([[-0.01, -1.0]])  # log w = 79.99 on one token
    out = mismatch_stats(lb, lp, torch.ones(1, 2, dtype=torch.bool))
    assert all(math.isfinite(v) for v in out.values())
    assert out["mismatch/chi2_token"] == pytest.approx((math.exp(40) + 1) / 2 - 1, rel=1e-9)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_stats(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))


def test_decomposition_k1_adds_exactly_and_k3_approximately():
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(6, 9, generator=g) < 0.7
    current = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    snapshot = current + 0.05 * torch.randn(6, 9, generator=g, dtype=torch.float64)  # lag
    behaviour = snapshot + 0.01 * torch.randn(6, 9, generator=g, dtype=torch.float64)  # numerics
    total = mismatch_stats(behaviour, current, mask)
    parts = mismatch_decomposition(behaviour, snapshot, current, mask)
    assert set(parts) == set(DECOMPOSITION_KEYS)
    k1 = parts["mismatch/numerics_kl_k1"] + parts["mismatch/lag_kl_k1"]
    assert k1 == pytest.approx(total["mismatch/kl_k1"], rel=1e-12, abs=1e-15)
    k3 = parts["mismatch/numerics_kl_k3"] + parts["mismatch/lag_kl_k3"]
    # k3 ≈ ½ mean x²: the sum of the parts misses exactly the cross term mean(x_num · x_lag)
    # (to third order in the log-ratios).
    x_num, x_lag = (snapshot - behaviour)[mask], (current - snapshot)[mask]
    cross = float((x_num * x_lag).mean())
    assert total["mismatch/kl_k3"] - k3 == pytest.approx(cross, abs=2e-5)
    assert k3 == pytest.approx(total["mismatch/kl_k3"], rel=0.3)
    assert parts["mismatch/lag_kl_k3"] > 10 * parts["mismatch/numerics_kl_k3"]
    # no staleness: the snapshot is the current policy, the lag is exactly 0
    fresh = mismatch_decomposition(behaviour, current, current, mask)
    assert fresh["mismatch/lag_kl_k1"] == 0.0 and fresh["mismatch/lag_kl_k3"] == 0.0
    assert fresh["mismatch/numerics_kl_k3"] == total["mismatch/kl_k3"]


def test_every_name_is_in_the_one_vocabulary_and_the_run_summary_has_the_key_ones():
    assert set(MISMATCH_KEYS) | set(DECOMPOSITION_KEYS) <= set(STEP_METRICS)
    assert {"stability/mismatch_kl_k3_mean", "stability/mismatch_kl_k3_max"} <= set(
        RUN_SUMMARY_KEYS
    )
    out = summarize_run({"mismatch/kl_k3": [1e-6, NAN, 3e-6, 2e-6]})
    assert out["stability/mismatch_kl_k3_mean"] == pytest.approx(2e-6)
    assert out["stability/mismatch_kl_k3_max"] == pytest.approx(3e-6)
    assert math.isnan(summarize_run({})["stability/mismatch_kl_k3_mean"])


def test_the_mlflow_cell_view_shows_the_mismatch_column():
    from harness.sweep.present.mlflow_view import metric_column, view_state

    cols = view_state("final/reward", "maximize")["selectedColumns"]
    assert metric_column("stability/mismatch_kl_k3_mean") in cols
    assert cols[0] == metric_column("final/reward")
