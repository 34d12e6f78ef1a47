"""Seeds that decide, by simulation (vectorized, pure): the error rates of the equivalence rule
and of ``decide: ranking`` stay within 1 − confidence under repeated looks, the seeds an
adaptive study saves against a fixed design of the same power, and the study's allocation
(``harness.report.allocation``) agrees with the simulated rule study by study — so the rates
measured here are those of the code that allocates seeds.  (The wrong better/worse rate on
identical cells against a baseline is in tests/report/test_sequential.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.report.allocation import AdaptivePlan, allocate
from harness.report.sequential import (
    SeedPlan,
    fixed_design_seeds,
    sequential_verdicts,
    simulate,
    simulate_ranking,
)

PLAN = SeedPlan(min=3, max=15, batch=3, confidence=0.95, margin=0.5)
STUDIES = 20_000
SLACK = 3 * math.sqrt(0.05 * 0.95 / STUDIES)  # three binomial standard errors


def test_equivalent_is_called_wrongly_at_most_alpha_when_the_difference_is_the_margin() -> None:
    """A true difference exactly at ±margin is not equivalent: called so at most α of the time
    (the worst case of the equivalence rule; further out it is rarer)."""
    for effect in (PLAN.margin, -PLAN.margin):
        r = simulate(effect, PLAN, studies=STUDIES, seed=21)
        assert r["equivalent"] <= PLAN.alpha + SLACK, r
    further = simulate(2 * PLAN.margin, PLAN, studies=STUDIES, seed=22)
    assert further["equivalent"] < 0.005


def test_identical_cells_are_mostly_called_equivalent_and_early() -> None:
    r = simulate(0.0, SeedPlan(3, 24, 2, 0.95, margin=1.0), studies=STUDIES, seed=23)
    assert r["better"] + r["worse"] <= 0.05 + SLACK
    assert r["equivalent"] > 0.9
    assert r["mean_seeds"] < 0.7 * 24  # the fixed design would run 24


@pytest.mark.parametrize("cells", [2, 3, 4])
def test_ranking_identical_cells_names_a_winner_at_most_alpha(cells: int) -> None:
    r = simulate_ranking([0.0] * cells, PLAN, studies=STUDIES, seed=24 + cells)
    assert r["better"] <= PLAN.alpha + SLACK, r
    assert r["wrong_winner"] == r["better"]  # every winner of identical cells is wrong


def test_ranking_tied_leaders_are_not_told_apart_but_a_clear_winner_is() -> None:
    tied = simulate_ranking([2.0, 2.0, 0.0], PLAN, studies=STUDIES, seed=31)
    assert tied["wrong_winner"] <= PLAN.alpha + SLACK, tied
    clear = simulate_ranking([2.0, 0.5, 0.0], PLAN, studies=STUDIES, seed=32)
    assert clear["better"] > 0.95 and clear["wrong_winner"] < 0.001
    assert clear["mean_seeds"] < 0.5 * PLAN.max


def test_a_three_cell_study_spends_fewer_seeds_than_the_fixed_design_of_equal_power() -> None:
    """One clearly better cell (1.5 sd), one identical (0) and one slightly different (half the
    margin): the fixed design that finds the clear cell with the adaptive design's power runs
    that many seeds in every cell; the adaptive one spends fewer in the clear cell, and in all
    three together far fewer than the fixed design at max."""
    plan = SeedPlan(3, 24, 2, 0.95, margin=1.0)
    clear = simulate(1.5, plan, studies=STUDIES, seed=41)
    same = simulate(0.0, plan, studies=STUDIES, seed=42)
    slight = simulate(0.5, plan, studies=STUDIES, seed=43)
    assert clear["better"] > 0.99 and clear["mean_seeds"] < 9
    assert same["equivalent"] > 0.85 and same["better"] + same["worse"] <= 0.05 + SLACK
    assert slight["mean_seeds"] > max(clear["mean_seeds"], same["mean_seeds"])
    fixed = fixed_design_seeds(1.5, 1.0, plan, clear["better"])
    assert clear["mean_seeds"] < 0.8 * fixed, (clear, fixed)
    adaptive_total = clear["mean_seeds"] + same["mean_seeds"] + slight["mean_seeds"]
    assert adaptive_total < 0.6 * 3 * plan.max  # the fixed design at max: 72 seeds


def test_the_study_allocation_takes_the_simulated_decisions() -> None:
    """Study by study, ``allocate`` (what the workers run) stops each cell at the look and with
    the verdict the vectorized rule gives, so the simulated rates are the study's."""
    rng = np.random.default_rng(5)
    plan = SeedPlan(3, 15, 3, 0.95, margin=0.5)
    d = rng.standard_normal((150, plan.max)) + rng.choice([0.0, 0.4, 2.0], size=(150, 1))
    verdicts, used = sequential_verdicts(d, plan)
    adaptive = AdaptivePlan(plan, "baseline")
    for i in range(d.shape[0]):
        scores = {"base": dict.fromkeys(range(plan.max), 0.0), "cell": dict(enumerate(d[i]))}
        state = allocate(scores, ["base", "cell"], adaptive, baseline="base")["cell"]
        assert (state.status, state.released) == (verdicts[i], used[i]), i
