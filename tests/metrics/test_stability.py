"""harness.metrics.stability.summarize_run on hand-made histories."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.metrics.stability import RUN_SUMMARY_KEYS, summarize_run

nan = math.nan

# Steps 0..6.  Logged rewards (step 2 missing): [0.1, 0.2, 0.4, 0.3, 0.1, 0.5] at [0, 1, 3, 4, 5, 6].
HISTORY = {
    "objective/reward": [0.1, 0.2, nan, 0.4, 0.3, 0.1, 0.5],
    "eval/accuracy": [nan, nan, 0.3, nan, nan, 0.5, nan],
    "policy/approx_kl": [0.01, -0.02, 0.5, nan, 0.03, -0.2, 0.01],
    "policy/entropy": [2.0, 1.8, nan, 1.0, 0.5],
    "policy/clipfrac": [0.1, 0.3, 0.2, nan, 0.5],
    "stability/grad_norm": np.array([1.0, 1.0, 1.0, 10.0, 1.0, 1.0, 6.0]),
    "stability/nonfinite_count": [0, 0, 1, nan, 2],
    "stability/skipped_updates": [0, 1, 1, 0],
}


def test_keys_and_types():
    out = summarize_run(HISTORY)
    assert tuple(out) == RUN_SUMMARY_KEYS
    assert all(type(v) is float for v in out.values())


def test_reward_summaries():
    out = summarize_run(HISTORY, last_k=2, reward_threshold=0.35)
    assert out["final/reward"] == pytest.approx((0.1 + 0.5) / 2)
    assert out["best/reward"] == pytest.approx(0.5)
    assert out["final/reward_auc"] == pytest.approx(1.6 / 6)
    assert out["final/steps_to_threshold"] == 3.0  # the step index, not the logged position
    # peaks 0.1 0.2 0.4 0.4 0.4 0.5, drawdowns 0 0 0 0.1 0.3 0 -> 0.3 at peak 0.4
    assert out["stability/max_drawdown"] == pytest.approx(0.3)
    assert out["stability/max_drawdown_frac"] == pytest.approx(0.75)
    assert out["stability/collapsed"] == 1.0
    assert summarize_run(HISTORY, collapse_fraction=0.8)["stability/collapsed"] == 0.0


def test_last_k_larger_than_run_and_threshold_never_hit():
    out = summarize_run(HISTORY, last_k=100, reward_threshold=0.9)
    assert out["final/reward"] == pytest.approx(1.6 / 6)
    assert math.isnan(out["final/steps_to_threshold"])
    assert math.isnan(summarize_run(HISTORY)["final/steps_to_threshold"])  # no threshold


def test_smoothed_drawdown():
    out = summarize_run(HISTORY, smooth=2)
    # trailing means .1 .15 .3 .35 .2 .3; peaks .1 .15 .3 .35 .35 .35; max drawdown .15 at .35
    assert out["stability/max_drawdown"] == pytest.approx(0.15)
    assert out["stability/max_drawdown_frac"] == pytest.approx(0.15 / 0.35)
    assert out["stability/collapsed"] == 0.0


def test_drawdown_frac_undefined_for_nonpositive_peak():
    out = summarize_run({"objective/reward": [-1.0, -0.5, -2.0]})
    assert out["stability/max_drawdown"] == pytest.approx(1.5)
    assert math.isnan(out["stability/max_drawdown_frac"])
    assert math.isnan(out["stability/collapsed"])


def test_monotone_reward_has_no_drawdown():
    out = summarize_run({"objective/reward": [0.1, 0.2, 0.3]})
    assert out["stability/max_drawdown"] == 0.0
    assert out["stability/max_drawdown_frac"] == 0.0
    assert out["stability/collapsed"] == 0.0


def test_eval_and_kl():
    out = summarize_run(HISTORY)
    assert out["final/eval_accuracy"] == 0.5
    mags = [0.01, 0.02, 0.5, 0.03, 0.2, 0.01]
    assert out["stability/max_approx_kl"] == pytest.approx(0.5)
    assert out["stability/mean_approx_kl"] == pytest.approx(sum(mags) / 6)
    assert out["stability/kl_over_threshold"] == 2.0  # absolute |kl| > 0.1: 0.5 and 0.2
    assert summarize_run(HISTORY, kl_threshold=0.3)["stability/kl_over_threshold"] == 1.0


def test_kl_spikes_are_relative_to_the_run():
    # |kl| logged: .01 .02 .5 .03 .2 .01; tested from the 4th value on:
    # .03 vs 5*median(.01,.02,.5)=.1 no; .2 vs 5*.025 yes; .01 vs 5*.03 no
    out = summarize_run(HISTORY)
    assert out["stability/kl_spikes"] == 1.0
    assert summarize_run(HISTORY, kl_spike_factor=1.5)["stability/kl_spikes"] == 1.0  # .03<.0375
    assert summarize_run(HISTORY, kl_spike_factor=1.1)["stability/kl_spikes"] == 2.0  # .03>.0275


def test_kl_spikes_do_not_saturate_when_kl_is_high_throughout():
    # The default experiment's failure: |kl| between 0.2 and 0.9 at every step.  The absolute
    # count says 100 of 100; relative to the run's own median only the two real bursts count.
    rng = np.random.default_rng(0)
    kl = 0.3 + 0.1 * rng.random(100)
    kl[[40, 70]] = [3.0, 2.5]
    out = summarize_run({"policy/approx_kl": kl})
    assert out["stability/kl_over_threshold"] == 100.0
    assert out["stability/kl_spikes"] == 2.0


def test_kl_spikes_ignore_float_noise_and_zero_kl():
    # Inert clipping: KL is float noise around 1e-12; on-policy single updates: exactly 0.
    noise = {"policy/approx_kl": [1e-13, 2e-13, 1e-13, 4e-12, 1e-13, 3e-12]}
    assert summarize_run(noise)["stability/kl_spikes"] == 0.0
    assert summarize_run(noise, kl_spike_floor=0.0)["stability/kl_spikes"] == 2.0
    assert summarize_run({"policy/approx_kl": [0.0] * 5 + [0.5]})["stability/kl_spikes"] == 0.0


def test_grad_norm_spikes():
    assert summarize_run(HISTORY)["stability/grad_norm_spikes"] == 2.0  # 10 and 6 vs median 1
    g = {"stability/grad_norm": [1, 1, 1, 1, 1, 100, 100, 100]}
    assert summarize_run(g)["stability/grad_norm_spikes"] == 3.0
    # window 2: step 5 (median 1) spikes; then medians 50.5 and 100 absorb the new level
    assert summarize_run(g, spike_window=2)["stability/grad_norm_spikes"] == 1.0
    assert summarize_run({"stability/grad_norm": [0, 0, 0, 5]})["stability/grad_norm_spikes"] == 0
    assert summarize_run({"stability/grad_norm": [1, 1, 50]})["stability/grad_norm_spikes"] == 0


def test_clip_entropy_counts():
    out = summarize_run(HISTORY, last_k=2)
    assert out["stability/frac_high_clip"] == pytest.approx(0.5)  # .3, .5 of 4; .2 is not > .2
    assert out["stability/mean_clipfrac"] == pytest.approx((0.1 + 0.3 + 0.2 + 0.5) / 4)
    assert summarize_run(HISTORY, clipfrac_threshold=0.25)["stability/frac_high_clip"] == 0.5
    assert out["stability/entropy_ratio"] == pytest.approx(((1.0 + 0.5) / 2) / ((2.0 + 1.8) / 2))
    assert out["stability/nonfinite_events"] == 3.0
    assert out["stability/skipped_steps"] == 2.0
    assert math.isnan(
        summarize_run({"policy/entropy": [0.0, 1.0]}, last_k=1)["stability/entropy_ratio"]
    )


def test_diverged():
    out = summarize_run(HISTORY)
    assert out["stability/diverged"] == 0.0 and math.isnan(out["stability/diverged_step"])
    out = summarize_run(HISTORY, diverged_step=5)
    assert out["stability/diverged"] == 1.0 and out["stability/diverged_step"] == 5.0


@pytest.mark.parametrize(
    "history",
    [
        {},
        {"objective/reward": []},
        {"objective/reward": [nan, nan], "policy/approx_kl": [None, None]},
        {"objective/reward": ["oops"], "stability/grad_norm": object()},
        {"objective/reward": [math.inf, -math.inf]},
    ],
)
def test_missing_or_bad_metrics_give_nan(history):
    out = summarize_run(history)
    assert tuple(out) == RUN_SUMMARY_KEYS
    assert out["stability/diverged"] == 0.0
    assert all(math.isnan(v) for k, v in out.items() if k != "stability/diverged")


def test_nonfinite_values_are_ignored():
    out = summarize_run({"objective/reward": [0.2, math.inf, 0.4], "policy/approx_kl": [math.inf]})
    assert out["best/reward"] == pytest.approx(0.4)
    assert math.isnan(out["stability/max_approx_kl"])


def test_bad_parameters_raise():
    with pytest.raises(ValueError):
        summarize_run(HISTORY, last_k=0)
