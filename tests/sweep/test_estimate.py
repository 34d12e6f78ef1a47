"""`harness ablate --dry-run` states the estimated wall time: each run's measured setup, steps,
evaluations and warm start, spread over the workers, plus a worker's start; one probe per
distinct run shape, a range under adaptive seeds; within a factor of 2 of a real sweep."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from harness.config.experiment import load_experiment
from harness.sweep.scheduler.estimate import (
    RunCosts,
    duration_text,
    estimate_text,
    estimate_wall_time,
    evals_per_run,
    probe_run,
    shape_key,
)
from harness.sweep.scheduler.spec import StudySpec

EXPERIMENT = """
name: est
base: {task: reverse, warm_start: {steps: 7}, rollout: {prompts_per_step: 2, n_samples: 2}}
grid:
  ppo.eps_clip: [0.2, 10.0]          # same shape: one probe for both
  rollout.max_new_tokens: [4, 8]     # another shape
seeds: SEEDS
steps: 50
baseline: {ppo.eps_clip: 0.2, rollout.max_new_tokens: 4}
metric: final/reward
"""


def _spec(tmp_path: Path, seeds: str):
    path = tmp_path / "e.yaml"
    path.write_text(EXPERIMENT.replace("SEEDS", seeds))
    return load_experiment(path)


def test_one_probe_per_shape_and_the_grid_arithmetic(tmp_path):
    spec = _spec(tmp_path, "3")
    probed = []

    def probe(cfg):  # 0.1 s per step at 4 new tokens, 0.3 s at 8
        probed.append(cfg.rollout.max_new_tokens)
        return 0.1 if cfg.rollout.max_new_tokens == 4 else 0.3

    est = estimate_wall_time(spec, workers=2, probe=probe, start=lambda: 0.0)
    assert sorted(probed) == [4, 8] and est.probes == 2
    # (2 cells x 0.1 + 2 cells x 0.3) s/step x 50 steps x 3 seeds / 2 workers = 60 s
    assert math.isclose(est.low_s, 60.0) and math.isclose(est.high_s, 60.0)
    assert est.warm_start_steps == 7
    text = estimate_text(est, 2)
    assert text.startswith("estimated wall time with 2 worker(s): 1 min 00 s (0.10-0.30 s per step")
    assert "2 probe run(s)" in text and "warm start 7 steps per seed" in text


def test_setup_evaluations_warm_start_and_worker_start_count(tmp_path):
    spec = _spec(tmp_path, "2")

    def probe(cfg):
        return RunCosts(step_s=0.1, setup_s=4.0, eval_s=2.0, sft_step_s=0.05)

    est = estimate_wall_time(spec, workers=2, probe=probe, start=lambda: 6.0)
    # A run: 4 s setup + 50 x 0.1 s steps + 3 evaluations (start, after step 25, last) x 2 s
    # = 15 s; 4 cells.  A seed's warm start (one key: the cells share model and task):
    # 7 x 0.05 s = 0.35 s.  (4 x 15 + 0.35) s x 2 seeds / 2 workers + 6 s worker start = 66.35 s
    assert math.isclose(est.high_s, 66.35) and math.isclose(est.low_s, 66.35)
    text = estimate_text(est, 2)
    assert "4.0 s setup per run" in text and "2.0 s per evaluation" in text
    assert "6 s worker start" in text


def test_one_long_run_bounds_the_wall_from_below(tmp_path):
    spec = _spec(tmp_path, "1")
    est = estimate_wall_time(
        spec, workers=64, probe=lambda cfg: RunCosts(step_s=1.0, setup_s=10.0), start=lambda: 0.0
    )
    # 64 workers cannot finish faster than one run: 10 s + 50 steps x 1 s (+ 0 s of evals).
    assert math.isclose(est.high_s, 60.0)


def test_evaluations_per_run_count_the_start_the_every_and_the_last(tmp_path):
    study = StudySpec.from_experiment(_spec(tmp_path, "1"))
    cfg = study.cell_config("eps_clip=0.2 max_new_tokens=4", 0)
    assert evals_per_run(cfg) == 3  # every 25 of 50 steps: the start, after step 25, the last
    assert evals_per_run(replace(cfg, eval=replace(cfg.eval, every=0))) == 2  # start and last
    every = replace(cfg, eval=replace(cfg.eval, every=20))
    assert evals_per_run(every) == 4  # start, after steps 20 and 40, and the last (step 50)
    assert evals_per_run(replace(cfg, steps=40, eval=replace(cfg.eval, every=20))) == 3


def test_adaptive_seeds_give_a_range_from_first_look_to_max(tmp_path):
    spec = _spec(tmp_path, "{min: 3, max: 9, batch: 2}")
    est = estimate_wall_time(spec, workers=1, probe=lambda cfg: 0.2, start=lambda: 0.0)
    # 4 cells x 0.2 s x 50 steps = 40 s per seed: 3 seeds at least, 9 at most
    assert math.isclose(est.low_s, 120.0) and math.isclose(est.high_s, 360.0)
    assert "2 min 00 s (every cell decided at its first look) to 6 min 00 s" in estimate_text(
        est, 1
    )


def test_shape_ignores_what_does_not_change_a_steps_cost(tmp_path):
    study = StudySpec.from_experiment(_spec(tmp_path, "2"))
    a = study.cell_config("eps_clip=0.2 max_new_tokens=4", 0)
    b = study.cell_config("eps_clip=10 max_new_tokens=4", 1)
    c = study.cell_config("eps_clip=0.2 max_new_tokens=8", 0)
    assert shape_key(a) == shape_key(b) != shape_key(c)


def test_the_probe_measures_a_real_run(tmp_path):
    study = StudySpec.from_experiment(_spec(tmp_path, "1"))
    cfg = study.cell_config("eps_clip=0.2 max_new_tokens=4", 0)
    costs = probe_run(cfg)
    assert 0.0 < costs.step_s < 60.0
    assert 0.0 < costs.eval_s < 60.0 and 0.0 <= costs.setup_s < 120.0
    assert 0.0 < costs.sft_step_s < 60.0  # the probe trained 3 of the 7 warm-start steps


def test_durations_read_as_text():
    assert [duration_text(s) for s in (42, 200, 7500)] == ["42 s", "3 min 20 s", "2 h 05 min"]
