"""`harness search --dry-run` states the search's wall time before launch: the points that bound
what a point costs are probed (each searched field that changes a run's cost at each end), and
the range runs from every point stopped as early as the search stops points to every point at
every seed (harness/sweep/scheduler/search_estimate.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from harness.config.experiment import load_experiment
from harness.sweep.scheduler.estimate import RunCosts, SweepCosts
from harness.sweep.scheduler.search_estimate import (
    cost_fields,
    estimate_search_wall_time,
    probe_points,
    search_estimate_text,
    seeds_range,
)
from harness.sweep.scheduler.spec import StudySpec

LR = {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}
TOKENS = {"type": "int", "low": 4, "high": 8}


def _spec(tmp_path: Path, params: dict, seeds=2, n_trials=6, **search):
    doc = {
        "name": "s",
        "base": {"task": "reverse", "rollout": {"prompts_per_step": 2, "n_samples": 2}},
        "search": {"n_trials": n_trials, "params": params, **search},
        "seeds": seeds,
        "steps": 10,
        "metric": "final/reward",
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_experiment(path)


@pytest.mark.parametrize(
    ("pruner", "seeds", "n_trials", "want"),
    [
        ("median", 3, 24, ((4 * 3 + 20 * 1) / 24, 3)),  # the first 4 points finish, then 1 seed
        ("median", 3, 2, (3.0, 3)),  # fewer points than the median pruner's start: all seeds
        ("wilcoxon", 3, 24, (2.0, 3)),  # its first test comes after 2 seeds
        ("wilcoxon", 1, 24, (1.0, 1)),
        ("none", 3, 24, (3.0, 3)),
    ],
)
def test_the_seeds_a_point_runs_follow_how_the_search_stops_points(
    tmp_path, pruner, seeds, n_trials, want
):
    spec = _spec(tmp_path, {"optim.lr": LR}, seeds=seeds, n_trials=n_trials, pruner=pruner)
    got = seeds_range(spec)
    assert math.isclose(got[0], want[0]) and got[1] == want[1]


def test_racing_runs_each_point_from_the_plans_min_to_its_max(tmp_path):
    plan = {"min": 2, "max": 6, "batch": 2, "decide": "baseline"}
    spec = _spec(tmp_path, {"optim.lr": LR}, seeds=plan)
    assert seeds_range(spec) == (2.0, 6)


def test_only_fields_that_change_a_runs_cost_are_probed_at_each_end(tmp_path):
    n_samples = {"type": "categorical", "choices": [2, 4, 8]}
    spec = _spec(
        tmp_path, {"optim.lr": LR, "rollout.max_new_tokens": TOKENS, "rollout.n_samples": n_samples}
    )
    low = {"optim.lr": 1e-4, "rollout.max_new_tokens": 4, "rollout.n_samples": 2}
    assert probe_points(spec) == {
        "search low ends": low,
        "rollout.max_new_tokens=8": {**low, "rollout.max_new_tokens": 8},
        "rollout.n_samples=4": {**low, "rollout.n_samples": 4},
        "rollout.n_samples=8": {**low, "rollout.n_samples": 8},
    }
    assert cost_fields(spec) == ["rollout.max_new_tokens", "rollout.n_samples"]
    # A learning rate or a clip range costs nothing: one probe times every point.
    lr_only = _spec(
        tmp_path, {"optim.lr": LR, "ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}}
    )
    assert list(probe_points(lr_only)) == ["search low ends"] and cost_fields(lr_only) == []


def _probed(spec, costs: dict[str, RunCosts]):
    study = StudySpec.from_experiment(spec)
    points = probe_points(spec)
    return {label: (study.run_config(points[label], 0), c) for label, c in costs.items()}


def test_the_range_from_naive_sums_over_points_seeds_and_packs(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = _spec(tmp_path, {"optim.lr": LR, "rollout.max_new_tokens": TOKENS}, pruner="median")
    cheap = RunCosts(step_s=0.5, setup_s=3.0, eval_s=1.0, trial_s=0.5)
    dear = RunCosts(step_s=1.0, setup_s=3.0, eval_s=1.0, trial_s=0.5)
    probed = _probed(spec, {"search low ends": cheap, "rollout.max_new_tokens=8": dear})
    once = SweepCosts(command_s=1.0, stores_s=2.0, worker_s=3.0, report_s=4.0)
    est = estimate_search_wall_time(spec, 2, probed, once, k=2)

    # A run: setup + 10 steps + 2 evaluations (the start, the last) + bookkeeping.
    runs = {"cheap": 3.0 + 10 * 0.5 + 2 * 1.0 + 0.5, "dear": 3.0 + 10 * 1.0 + 2 * 1.0 + 0.5}

    # Naively: every run's parts but the setup, and one setup per pack of 2 points and seed.
    def spread(run_s: float, seeds_of_points: list[int]) -> float:
        total = sum(seeds * (run_s - 3.0) for seeds in seeds_of_points)
        packs = [seeds_of_points[i : i + 2] for i in range(0, len(seeds_of_points), 2)]
        total += sum(max(p) * 3.0 for p in packs)  # a pack's setup, per seed it runs
        return total / 2

    high = spread(runs["dear"], [2] * 6)
    # Low: the first 4 points at both seeds, the other 2 pruned at their first.
    low = spread(runs["cheap"], [2, 2, 2, 2, 1, 1])
    idle = 4 / 2  # runs past 2 heartbeats end at a uniform point of one
    fixed = 1.0 + 2.0 + 3.0 + 4.0 + idle
    assert math.isclose(est.high_s, fixed + high) and math.isclose(est.runs_s, high)
    # The model pays the mean seeds per point for each pack: the same total here.
    assert math.isclose(est.low_s, fixed + low, rel_tol=0.05)
    assert est.runs == 12 and est.packed == 2 and est.probes == 2
    text = search_estimate_text(spec, est, 2)
    lines = text.splitlines()
    assert lines[0].startswith("estimated wall time with 2 worker(s): ")
    assert (
        "(every point after the first 4 pruned at its first seed, each as cheap as the " in lines[0]
    )
    assert "(every point at every seed, each as costly as the costliest probe)" in lines[0]
    assert lines[1].startswith("  10-12 runs: ") and ", up to 2 packed in each" in lines[1]
    assert "0.50-1.00 s per step" in lines[1]
    assert lines[3] == (
        "  measured on this machine by 2 probe run(s): rollout.max_new_tokens at each end, the "
        "other fields at their low ends; a point setting several of them high at once may cost "
        "more"
    )


def test_one_shape_and_no_pruner_is_one_number(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = _spec(tmp_path, {"optim.lr": LR}, pruner="none", n_trials=4)
    c = RunCosts(step_s=1.0, setup_s=2.0, sft_step_s=0.0)
    est = estimate_search_wall_time(spec, 1, _probed(spec, {"search low ends": c}), SweepCosts())
    # 4 points x 2 seeds x (2 s setup + 10 steps + 0 s evaluations), one worker: no idle wait.
    assert math.isclose(est.low_s, 4 * 2 * 12.0) and est.low_s == est.high_s
    text = search_estimate_text(spec, est, 1)
    assert text.splitlines()[0] == "estimated wall time with 1 worker(s): 1 min 36 s"
    assert text.splitlines()[1].startswith("  8 runs: 1 min 36 s with 1 worker(s) (per run: ")
    assert text.splitlines()[-1] == (
        "  measured on this machine by 1 probe run: no searched field changes what a run costs"
    )


def test_a_warm_start_is_paid_once_per_seed_unless_a_searched_field_changes_it(tmp_path):
    doc_params = {"optim.lr": LR}
    spec = _spec(tmp_path, doc_params, pruner="none", n_trials=4)
    spec.base["warm_start"] = {"steps": 10}
    c = RunCosts(step_s=1.0, sft_step_s=0.5)
    est = estimate_search_wall_time(spec, 1, _probed(spec, {"search low ends": c}), SweepCosts())
    # 4 points x 2 seeds x 10 steps, and one warm start of 10 x 0.5 s per seed.
    assert math.isclose(est.runs_s, 4 * 2 * 10.0 + 2 * 5.0)
    searched = _spec(tmp_path, {"warm_start.steps": {"type": "int", "low": 10, "high": 20}},
                     pruner="none", n_trials=4)  # fmt: skip
    probed = _probed(searched, {"search low ends": c, "warm_start.steps=20": c})
    est = estimate_search_wall_time(searched, 1, probed, SweepCosts())
    # Each point its own warm start of up to 20 x 0.5 s, per seed.
    assert math.isclose(est.runs_s, 4 * 2 * 10.0 + 4 * 2 * 10.0)
