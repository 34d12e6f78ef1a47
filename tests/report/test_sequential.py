"""Sequential seed decisions (harness.report.sequential): golden verdicts, the interval against
scipy, and by simulation: the error rate under repeated looks and the seeds saved."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from harness.report.sequential import (
    SeedPlan,
    decide,
    fixed_design_seeds,
    look_alpha,
    paired_interval,
    simulate,
)

PLAN = SeedPlan(min=3, max=24, batch=2, confidence=0.95, margin=0.3)
STUDIES = 20_000
# Three binomial standard errors above α: a test that fails only when the rate really is above.
SLACK = 3 * math.sqrt(0.05 * 0.95 / STUDIES)


def test_looks_are_min_then_every_batch_then_max():
    assert PLAN.looks() == [3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 24]
    assert SeedPlan(min=4, max=10, batch=3).looks() == [4, 7, 10]
    assert SeedPlan(min=5, max=5).looks() == [5]
    assert PLAN.next_look(4) == 5 and PLAN.next_look(24) == 24 and PLAN.next_look(99) == 24


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"min": 1}, "seeds.min"),
        ({"min": 5, "max": 4}, "seeds.max"),
        ({"batch": 0}, "seeds.batch"),
        ({"confidence": 1.0}, "seeds.confidence"),
        ({"margin": -0.1}, "seeds.margin"),
        ({"margin": math.inf}, "seeds.margin"),
    ],
)
def test_a_bad_plan_names_its_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SeedPlan(**kwargs)


def test_one_look_spends_all_of_alpha_and_more_looks_spend_less_each():
    single = look_alpha(SeedPlan(min=8, max=8, confidence=0.95))
    assert single == pytest.approx(0.05, abs=0.003)
    many = look_alpha(PLAN)
    # Twelve looks: each much stricter than 5 %, yet far looser than Bonferroni's 5 %/12.
    assert 0.05 / 12 < many < 0.02
    assert look_alpha(PLAN) == many  # cached and deterministic


def test_the_interval_is_scipys_paired_t_interval():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, 9)
    mean, lo, hi = paired_interval(d, 0.9)
    ref = stats.ttest_1samp(d, 0.0).confidence_interval(0.9)
    assert mean == pytest.approx(d.mean())
    assert (lo, hi) == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_golden_verdicts():
    clear = [1.0, 1.2, 0.9, 1.1, 1.0]
    dec = decide(clear, PLAN)
    assert dec.verdict == "better" and dec.n == 5
    assert dec.estimate == pytest.approx(1.04)
    assert 0 < dec.lo < 1.04 < dec.hi
    assert decide([-x for x in clear], PLAN).verdict == "worse"
    # A metric to minimise: a higher value of the cell is worse.
    assert decide(clear, PLAN, maximize=False).verdict == "worse"
    tiny = [0.01, -0.01, 0.02, 0.0, -0.02, 0.01, 0.0]
    assert decide(tiny, PLAN).verdict == "equivalent"
    assert decide(tiny, SeedPlan(min=3, max=24, batch=2, margin=0.0)).verdict == "open"
    assert decide(clear[:2], PLAN).verdict == "open"  # below min: no interval yet
    noisy = list(np.random.default_rng(1).normal(0.0, 1.0, 24))
    last = decide(noisy, PLAN)
    assert last.verdict == "undecided" and last.n == 24 and last.lo < 0 < last.hi
    assert last.line().startswith("undecided at max (24 seeds)")
    assert dec.line().startswith("decided at 5 seeds: better by +1.04 [")


@settings(max_examples=60, deadline=None)
@given(
    d=st.lists(st.floats(-10, 10, allow_nan=False), min_size=3, max_size=24),
    shift=st.floats(-5, 5, allow_nan=False),
)
def test_shifting_every_difference_shifts_the_interval(d, shift):
    if np.std(d) < 1e-6:
        return
    a = decide(d, PLAN)
    b = decide([x + shift for x in d], PLAN)
    assert b.estimate == pytest.approx(a.estimate + shift, abs=1e-9)
    assert b.lo == pytest.approx(a.lo + shift, abs=1e-6)
    assert b.hi - b.lo == pytest.approx(a.hi - a.lo, rel=1e-6, abs=1e-9)


def _naive_wrong_rate(plan: SeedPlan, studies: int) -> float:
    """Stop at the first look whose ordinary 95 % interval excludes 0 (what must not be done)."""
    d = np.random.default_rng(3).standard_normal((studies, plan.max))
    wrong = np.zeros(studies, dtype=bool)
    for n in plan.looks():
        x = d[:, :n]
        half = stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
        wrong |= np.abs(x.mean(axis=1)) > half
    return float(wrong.mean())


def test_looking_after_every_batch_with_fixed_intervals_inflates_errors():
    assert _naive_wrong_rate(PLAN, STUDIES) > 0.15


@pytest.mark.parametrize("scores", ["normal", "skewed", "collapse"])
def test_on_identical_cells_wrong_calls_stay_within_one_minus_confidence(scores):
    r = simulate(0.0, PLAN, studies=STUDIES, seed=11, scores=scores)
    assert r["better"] + r["worse"] <= PLAN.alpha + SLACK
    # Identical cells are never called different by much more than chance in either direction.
    assert abs(r["better"] - r["worse"]) < 0.01


def test_clearly_different_cells_are_decided_with_fewer_seeds_than_a_fixed_design():
    r = simulate(1.0, PLAN, studies=STUDIES, seed=12)
    assert r["worse"] < 0.001
    power = r["better"]
    assert power > 0.9
    fixed = fixed_design_seeds(1.0, 1.0, PLAN, power)
    # The fixed design needs this many seeds in EVERY cell for the same power at 95 %.
    assert r["mean_seeds"] < 0.75 * fixed, (r, fixed)
    assert r["mean_seeds"] < 0.6 * PLAN.max


def test_the_fixed_design_count_is_the_t_tests_power():
    n = fixed_design_seeds(1.0, 1.0, SeedPlan(confidence=0.95), 0.8)
    assert n == 10  # the paired t-test needs 10 pairs for d = 1 at α = 0.05, 80 % power
