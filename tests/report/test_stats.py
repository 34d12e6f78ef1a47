"""harness.report.stats against hand-computed values and against scipy directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from harness.report import stats as S
from harness.report.stats import Interval

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


# ---------------------------------------------------------------------------------------- IQM


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        ([5.0], 5.0),  # n < 4: no trimming, the plain mean
        ([1.0, 2.0, 10.0], 13.0 / 3.0),
        ([4.0, 1.0, 3.0, 2.0], 2.5),  # floor(0.25*4) = 1 per end -> mean(2, 3)
        ([1, 2, 3, 4, 5, 6, 7, 100], 4.5),  # drop 1 and 100 -> mean(2..7)
        ([0, 0, 1, 1, 1, 9, 50], 12.0 / 5.0),  # n = 7: one per end -> mean(0, 1, 1, 1, 9)
    ],
)
def test_iqm_hand_computed(x, expected):
    assert S.iqm(x) == pytest.approx(expected)


def test_iqm_empty_and_nan():
    assert math.isnan(S.iqm([]))
    assert math.isnan(S.iqm([1.0, np.nan, 2.0, 3.0, 4.0]))


def test_iqm_axis_matches_rows_and_propagates_nan():
    a = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, np.nan, 3.0, 4.0]])
    out = S.iqm(a, axis=-1)
    assert out[0] == pytest.approx(2.5) and math.isnan(out[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=40))
def test_iqm_equals_scipy_trim_mean(xs):
    assert S.iqm(xs) == pytest.approx(sps.trim_mean(xs, 0.25), rel=1e-12, abs=1e-9)


def test_median():
    assert S.median([3.0, 1.0, 2.0, 10.0]) == 2.5
    assert math.isnan(S.median([]))


# ---------------------------------------------------------------------------------- bootstrap


def test_bootstrap_reproducible_and_seed_dependent():
    x = np.random.default_rng(0).normal(size=12)
    a = S.bootstrap_ci(x, np.mean, seed=7)
    assert a == S.bootstrap_ci(x, np.mean, seed=7)
    assert a != S.bootstrap_ci(x, np.mean, seed=8)


@pytest.mark.parametrize("method", ["percentile", "bca"])
@pytest.mark.parametrize("stat", [np.mean, np.median, S.iqm])
def test_ci_contains_point(method, stat):
    rng = np.random.default_rng(1)
    for n in (3, 5, 10, 30):
        iv = S.bootstrap_ci(rng.gamma(2.0, size=n), stat, method=method, seed=n)
        assert iv.low <= iv.point <= iv.high


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_bootstrap_equals_scipy_with_same_generator(method):
    x = np.random.default_rng(2).exponential(size=9)
    ours = S.bootstrap_ci(x, np.mean, n_boot=3000, seed=11, method=method)
    ref = sps.bootstrap(
        (x,), np.mean, n_resamples=3000, method=method, rng=np.random.default_rng(11)
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((ref.low, ref.high), rel=1e-12)
    assert ours.point == pytest.approx(np.mean(x))


def test_non_vectorized_statistic_gives_same_interval():
    x = np.random.default_rng(3).normal(size=8)
    a = S.bootstrap_ci(x, np.mean, seed=1)
    b = S.bootstrap_ci(x, lambda v: float(np.mean(v)), seed=1)
    assert (a.point, a.low, a.high) == pytest.approx((b.point, b.low, b.high), rel=1e-12)


def test_large_normal_sample_ci_close_to_t_interval():
    x = np.random.default_rng(4).normal(loc=1.0, scale=2.0, size=1000)
    iv = S.mean_ci(x, n_boot=4000, seed=0)
    lo, hi = sps.t.interval(0.95, df=x.size - 1, loc=x.mean(), scale=sps.sem(x))
    assert iv.width == pytest.approx(hi - lo, rel=0.10)
    assert iv.low == pytest.approx(lo, abs=0.1 * (hi - lo))
    assert iv.high == pytest.approx(hi, abs=0.1 * (hi - lo))


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_bootstrap_degenerate_inputs(method):
    assert S.bootstrap_ci([3.0], np.mean, method=method) == Interval(3.0, 3.0, 3.0)
    assert S.bootstrap_ci([2.0, 2.0, 2.0], S.iqm, method=method) == Interval(2.0, 2.0, 2.0)
    for bad in ([], [1.0, np.nan]):
        iv = S.bootstrap_ci(bad, np.mean, method=method)
        assert all(math.isnan(v) for v in (iv.point, iv.low, iv.high))


def test_bootstrap_rejects_bad_arguments():
    with pytest.raises(ValueError):
        S.bootstrap_ci([1.0, 2.0], np.mean, confidence=1.5)
    with pytest.raises(ValueError):
        S.bootstrap_ci([1.0, 2.0], np.mean, method="basic")  # type: ignore[arg-type]


def test_iqm_ci_and_mean_ci_points():
    x = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert S.iqm_ci(x).point == pytest.approx(3.0)  # drop 1 and 100
    assert S.mean_ci(x).point == pytest.approx(22.0)


# ---------------------------------------------------------------------- stratified bootstrap


def test_stratified_resample_keeps_per_task_counts_and_values():
    data = {"b": [10.0, 11.0, 12.0], "a": [1.0, 2.0], "c": [100.0, 101.0, 102.0, 103.0]}
    res = S.stratified_resample(data, n_boot=500, seed=3)
    assert list(res) == ["a", "b", "c"]  # sorted task order
    for task, mat in res.items():
        assert mat.shape == (500, len(data[task]))
        assert set(np.unique(mat)) <= set(data[task])
    assert set(np.unique(res["c"])) == set(data["c"])  # 500 draws hit every value
    again = S.stratified_resample(dict(reversed(list(data.items()))), n_boot=500, seed=3)
    assert all(np.array_equal(res[t], again[t]) for t in res)


def test_stratified_one_task_equals_plain_bootstrap():
    x = np.random.default_rng(5).normal(size=10)
    a = S.stratified_bootstrap_ci({"t": x}, S.iqm, seed=4)
    assert a == S.bootstrap_ci(x, S.iqm, seed=4)


def test_stratified_pooled_vs_task_mean_points():
    data = {"a": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "b": [1.0, 1.0]}
    pooled = S.stratified_bootstrap_ci(data, np.mean)
    per_task = S.stratified_bootstrap_ci(data, np.mean, aggregate="task_mean")
    assert pooled.point == pytest.approx(2 / 8)
    assert per_task.point == pytest.approx(0.5)
    # Each task is constant, so every stratified replicate equals the point: zero-width CI.
    assert pooled.low == pooled.high == pytest.approx(0.25)


def test_stratified_ci_differs_from_unstratified():
    data = {"a": [0.0, 0.1, 0.2], "b": [1.0, 1.1, 1.2]}
    strat = S.stratified_bootstrap_ci(data, np.mean, seed=0)
    flat = S.bootstrap_ci(np.concatenate(list(data.values())), np.mean, seed=0)
    assert strat.point == pytest.approx(flat.point)
    assert strat.width < flat.width  # between-task variance is not resampled


# ---------------------------------------------------------------- probability of improvement


def _naive_poi(x, y):
    total = 0.0
    for a in x:
        for b in y:
            total += 1.0 if a > b else 0.5 if a == b else 0.0
    return total / (len(x) * len(y))


def test_poi_hand_computed():
    assert S.probability_of_improvement([1, 2, 3], [2, 2]) == pytest.approx(3 / 6)
    assert S.probability_of_improvement([3, 4], [1, 2, 3]) == pytest.approx(5.5 / 6)
    assert S.probability_of_improvement([5, 6], [1, 2]) == 1.0
    assert S.probability_of_improvement([1, 2], [5, 6]) == 0.0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=12),
    st.lists(st.integers(0, 5), min_size=1, max_size=12),
)
def test_poi_equals_mannwhitney_and_double_loop(x, y):
    p = S.probability_of_improvement(x, y)
    assert p == pytest.approx(_naive_poi(x, y), abs=1e-12)
    u = sps.mannwhitneyu(x, y, alternative="greater").statistic
    assert p == pytest.approx(u / (len(x) * len(y)), abs=1e-12)
    assert S.probability_of_improvement(x, x) == pytest.approx(0.5)


def test_poi_tasks_average_and_nan():
    x = {"a": [3, 4], "b": [1, 2]}
    y = {"a": [1, 2, 3], "b": [5, 6]}
    assert S.probability_of_improvement(x, y) == pytest.approx((5.5 / 6 + 0.0) / 2)
    assert math.isnan(S.probability_of_improvement([1.0, np.nan], [0.0]))
    with pytest.raises(ValueError):
        S.probability_of_improvement(x, [1.0])


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_poi_ci_equals_scipy_two_sample_bootstrap(method):
    rng = np.random.default_rng(6)
    x, y = rng.normal(0.5, 1.0, size=7), rng.normal(0.0, 1.0, size=5)
    ours = S.probability_of_improvement_ci(x, y, n_boot=2000, seed=9, method=method)

    def stat(a, b, axis=-1):
        u = sps.mannwhitneyu(a, b, axis=axis, alternative="greater").statistic
        return u / (a.shape[axis] * b.shape[axis])

    ref = sps.bootstrap(
        (x, y), stat, n_resamples=2000, method=method, rng=np.random.default_rng(9)
    ).confidence_interval
    assert ours.point == pytest.approx(_naive_poi(x, y))
    assert (ours.low, ours.high) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_poi_ci_self_comparison_is_centered():
    x = np.random.default_rng(7).normal(size=10)
    iv = S.probability_of_improvement_ci(x, x)
    assert iv.point == 0.5 and iv.low < 0.5 < iv.high


def test_poi_ci_stratified():
    x = {"a": [3.0, 4.0, 5.0], "b": [1.0, 2.0, 2.5]}
    y = {"a": [1.0, 2.0, 3.0], "b": [5.0, 6.0, 7.0]}
    iv = S.probability_of_improvement_ci(x, y, seed=1)
    assert iv.point == pytest.approx(S.probability_of_improvement(x, y))
    assert 0.0 <= iv.low <= iv.point <= iv.high <= 1.0
    assert iv.high <= 0.5 + 1e-12  # task b is always lost, so the average is at most 0.5


# ------------------------------------------------------------------------------ separation


def test_cis_overlap_and_inseparable_cells():
    base = Interval(0.5, 0.4, 0.6)
    assert S.cis_overlap(Interval(0.65, 0.55, 0.75), base)
    assert S.cis_overlap(Interval(0.7, 0.6, 0.8), base)  # touching counts as overlap
    assert not S.cis_overlap(Interval(0.8, 0.7, 0.9), base)
    assert S.cis_overlap(Interval(math.nan, math.nan, math.nan), base)
    cells = {"base": base, "b": Interval(0.8, 0.7, 0.9), "a": Interval(0.55, 0.45, 0.65)}
    assert S.inseparable_cells(cells, "base") == ["a"]
    with pytest.raises(KeyError):
        S.inseparable_cells(cells, "nope")


def test_seeds_to_separate():
    a, b = Interval(0.6, 0.5, 0.7), Interval(0.5, 0.4, 0.6)  # h = 0.1 + 0.1, d = 0.1
    assert S.seeds_to_separate(a, b, 5) == 20.0  # 5 * (0.2 / 0.1)^2
    assert S.seeds_to_separate(Interval(0.9, 0.85, 0.95), b, 5) == 5.0  # already apart
    assert S.seeds_to_separate(b, b, 5) == math.inf


# ----------------------------------------------------------------------------- cell summary


def test_summarize_cell_values():
    vals = [0.2, 0.4, 0.6, 0.8, np.nan]
    base = [0.1, 0.3, 0.5]
    c = S.summarize_cell(vals, baseline=base, collapsed=[0, 1, 0, 0, np.nan], seed=1)
    assert (c.n_seeds, c.n_used, c.n_diverged) == (5, 4, 1)  # NaN score counted as diverged
    assert c.iqm.point == pytest.approx(0.5)  # [0.2, 0.4, 0.6, 0.8] -> mean(0.4, 0.6)
    assert c.mean.point == pytest.approx(0.5)
    assert c.median == pytest.approx(0.5)
    assert c.p_improve is not None
    assert c.p_improve.point == pytest.approx(_naive_poi([0.2, 0.4, 0.6, 0.8], base))
    assert c.collapse_rate == pytest.approx(0.25)  # NaN flag ignored
    assert c.iqm == S.iqm_ci([0.2, 0.4, 0.6, 0.8], seed=1)
    assert c == S.summarize_cell(vals, baseline=base, collapsed=[0, 1, 0, 0, np.nan], seed=1)


def test_summarize_cell_flags_and_dict():
    c = S.summarize_cell([1.0, 2.0, 3.0], diverged=[0, 1, 0])
    assert c.p_improve is None and math.isnan(c.collapse_rate) and c.n_diverged == 1
    d = c.as_dict("cell/")
    assert d["cell/n_seeds"] == 3.0 and d["cell/iqm"] == pytest.approx(2.0)
    assert math.isnan(d["cell/p_improve_low"])
    assert all(isinstance(v, float) for v in d.values())


def test_summarize_cell_with_tasks():
    vals = {"a": [0.1, 0.2, 0.3], "b": [0.7, 0.8, np.inf]}
    c = S.summarize_cell(vals, baseline={"a": [0.0, 0.1], "b": [0.5, 0.6]})
    assert (c.n_seeds, c.n_used, c.n_diverged) == (6, 5, 1)
    assert c.iqm.point == pytest.approx(S.iqm([0.1, 0.2, 0.3, 0.7, 0.8]))
    assert c.p_improve is not None and c.p_improve.point == pytest.approx((5.5 / 6 + 1.0) / 2)


# ---------------------------------------------------------------------- performance profile


def test_performance_profile_hand_computed():
    prof = S.performance_profile({"a": [0.1, 0.5, 0.9, 0.5], "b": [np.nan, 1.0]}, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(prof["a"], [1.0, 0.25, 0.0])  # strictly greater than tau
    np.testing.assert_allclose(prof["b"], [0.5, 0.5, 0.0])  # NaN never exceeds tau


def test_performance_profile_bands():
    taus = np.linspace(0.0, 1.0, 11)
    x = np.random.default_rng(8).uniform(size=10)
    band = S.performance_profile_ci({"a": x}, taus, seed=2)["a"]
    np.testing.assert_allclose(band.point, S.performance_profile({"a": x}, taus)["a"])
    assert np.all(band.low <= band.point) and np.all(band.point <= band.high)
    assert np.all(band.low >= 0.0) and np.all(band.high <= 1.0)
    again = S.performance_profile_ci({"a": x, "other": [1.0]}, taus, seed=2)["a"]
    np.testing.assert_array_equal(band.low, again.low)  # independent of the other cells


# --------------------------------------------------------------------------------- curve fit


def test_sigmoid_fit_recovers_parameters():
    steps = np.arange(0, 1000, 5.0)
    r0, a, c_mid, b = 0.1, 0.8, 200.0, 1.5
    rewards = r0 + (a - r0) * steps**b / (steps**b + c_mid**b)  # = 1 / (1 + (c_mid / t)^b)
    fit = S.fit_saturating_curve(steps, rewards)
    assert fit.ok, fit.reason
    assert fit.asymptote == pytest.approx(a, rel=0.05)
    assert fit.half_step == pytest.approx(c_mid, rel=0.05)
    assert fit.exponent == pytest.approx(b, rel=0.05)
    assert fit.r0 == pytest.approx(r0, rel=0.05)
    assert not fit.extrapolated
    np.testing.assert_allclose(fit.predict(steps), rewards, atol=1e-3)


def test_exponential_fit_recovers_parameters():
    steps = np.arange(300.0)
    rewards = 0.9 - (0.9 - 0.2) * np.exp(-steps / 60.0)
    fit = S.fit_saturating_curve(steps, rewards, form="exponential")
    assert fit.ok, fit.reason
    assert fit.asymptote == pytest.approx(0.9, rel=0.05)
    assert fit.half_step == pytest.approx(60.0 * math.log(2.0), rel=0.05)


def test_fit_flags_extrapolated_asymptote():
    steps = np.arange(100.0)
    rewards = steps**2 / (steps**2 + 500.0**2)  # C_mid = 500, far beyond the data
    fit = S.fit_saturating_curve(steps, rewards)
    assert fit.ok and fit.extrapolated


@pytest.mark.parametrize(
    ("steps", "rewards"),
    [
        ([0, 1, 2], [0.1, 0.2, 0.3]),  # too few points
        (np.arange(10), np.full(10, 0.5)),  # no variation
        (np.arange(10), [np.nan] * 10),  # nothing finite
        (np.arange(10), np.arange(5)),  # length mismatch
        (np.arange(-5, 5), np.arange(10)),  # negative steps
        (["a", "b"], [1, 2]),  # not numbers
    ],
)
def test_fit_never_raises_on_bad_data(steps, rewards):
    fit = S.fit_saturating_curve(steps, rewards)
    assert not fit.ok and fit.reason and math.isnan(fit.asymptote)


# ------------------------------------------------------------- optional rliable cross-check


def test_against_rliable_when_installed():
    try:
        from rliable import metrics
    except Exception:  # ImportError, or arch failing under pandas 3
        pytest.skip("rliable not importable")
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))  # (runs, tasks)
    assert S.iqm(x) == pytest.approx(metrics.aggregate_iqm(x))
    tasks_x = {str(t): x[:, t] for t in range(3)}
    tasks_y = {str(t): y[:, t] for t in range(3)}
    assert S.probability_of_improvement(tasks_x, tasks_y) == pytest.approx(
        metrics.probability_of_improvement(x, y)
    )
