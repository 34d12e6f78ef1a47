"""`harness ablate --dry-run` states the estimated wall time: cells x seeds x steps x a measured
per-step time / workers, one probe per distinct step shape, a range under adaptive seeds."""

from __future__ import annotations

import math
from pathlib import Path

from harness.config.experiment import load_experiment
from harness.sweep.scheduler.estimate import (
    duration_text,
    estimate_text,
    estimate_wall_time,
    probe_step_seconds,
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

    est = estimate_wall_time(spec, workers=2, probe=probe)
    assert sorted(probed) == [4, 8] and est.probes == 2
    # (2 cells x 0.1 + 2 cells x 0.3) s/step x 50 steps x 3 seeds / 2 workers = 60 s
    assert math.isclose(est.low_s, 60.0) and math.isclose(est.high_s, 60.0)
    assert est.warm_start_steps == 7
    text = estimate_text(est, 2)
    assert text.startswith("estimated wall time with 2 worker(s): 1 min 00 s of training steps")
    assert "0.10-0.30 s per step" in text and "2 probe run(s)" in text
    assert "warm start (7 steps)" in text


def test_adaptive_seeds_give_a_range_from_first_look_to_max(tmp_path):
    spec = _spec(tmp_path, "{min: 3, max: 9, batch: 2}")
    est = estimate_wall_time(spec, workers=1, probe=lambda cfg: 0.2)
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


def test_the_probe_measures_a_real_step(tmp_path):
    study = StudySpec.from_experiment(_spec(tmp_path, "1"))
    cfg = study.cell_config("eps_clip=0.2 max_new_tokens=4", 0)
    seconds = probe_step_seconds(cfg)
    assert 0.0 < seconds < 60.0


def test_durations_read_as_text():
    assert [duration_text(s) for s in (42, 200, 7500)] == ["42 s", "3 min 20 s", "2 h 05 min"]
