"""`harness ablate --dry-run` states the estimated wall time: each run's measured setup, steps,
evaluations, tracker calls, study bookkeeping and warm start, spread over the workers, plus what
the sweep spends once (the command's start, the stores, a worker's start and exit, the idle wait
for the last run, the report); one probe per distinct run shape, a range under adaptive seeds;
within a factor of 2 of a real sweep's wall."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.sweep.scheduler.estimate import (
    RunCosts,
    SweepCosts,
    duration_text,
    estimate_text,
    estimate_wall_time,
    evals_per_run,
    idle_wait_s,
    probe_run,
    shape_key,
    timed_probe,
)
from harness.sweep.scheduler.spec import StudySpec
from harness.tracking import MemoryTracker

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


def test_one_probe_per_shape_and_the_grid_arithmetic(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = _spec(tmp_path, "3")
    probed = []

    def probe(cfg, label):  # 0.1 s per step at 4 new tokens, 0.3 s at 8
        probed.append((cfg.rollout.max_new_tokens, cfg.threads))
        return 0.1 if cfg.rollout.max_new_tokens == 4 else 0.3

    est = estimate_wall_time(spec, workers=2, probe=probe)
    # One probe per shape, with the one torch thread a sweep's worker gives each run.
    assert sorted(probed) == [(4, 1), (8, 1)] and est.probes == 2
    # (2 cells x 0.1 + 2 cells x 0.3) s/step x 50 steps x 3 seeds / 2 workers = 60 s, and the
    # idle wait: runs of 10 s on average outlast a 4 s heartbeat, so half of one: 2 s.
    assert math.isclose(est.runs_s, 60.0) and math.isclose(est.idle_s, 2.0)
    assert math.isclose(est.low_s, 62.0) and math.isclose(est.high_s, 62.0)
    assert est.warm_start_steps == 7 and est.runs == 12
    text = estimate_text(est, 2)
    assert text.startswith("estimated wall time with 2 worker(s): 1 min 02 s\n")
    assert "  12 runs: 1 min 00 s with 2 worker(s) (per run: 0.10-0.30 s per step" in text
    assert "2.0 s idle wait for the last run" in text
    assert "2 probe run(s)" in text and "warm start 7 steps per seed" in text


def test_every_part_of_a_run_and_of_the_sweep_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = _spec(tmp_path, "2")
    costs = RunCosts(
        step_s=0.1, setup_s=4.0, eval_s=2.0, sft_step_s=0.05, tracker_s=0.5, log_s=0.01, trial_s=0.2
    )
    once = SweepCosts(command_s=3.0, stores_s=1.0, worker_s=6.0, report_s=2.0)
    asked = []

    def sweep():  # called after the probes: the report is timed over their runs
        asked.append(len(probed))
        return once

    probed = []

    def probe(cfg, label):
        probed.append(label)
        return costs

    est = estimate_wall_time(spec, workers=2, probe=probe, sweep=sweep)
    assert asked == [2]
    # A run: 4 s setup + 50 steps x (0.1 s + 0.01 s of logging) + 3 evaluations (start, after
    # step 25, last) x 2 s + 0.5 s tracker + 0.2 s bookkeeping = 16.2 s; 4 cells.  A seed's warm
    # start (one key: the cells share model and task): 7 x 0.05 s = 0.35 s.
    # (4 x 16.2 + 0.35) s x 2 seeds / 2 workers = 65.15 s; once: 3 + 1 + 6 + 2 s, and the idle
    # wait (16.2 s runs outlast the 4 s heartbeat: 2 s) = 14 s.
    assert math.isclose(est.runs_s, 65.15) and math.isclose(est.high_s, 79.15)
    assert math.isclose(est.low_s, 79.15)
    text = estimate_text(est, 2)
    assert "4.0 s setup" in text and "2.0 s per evaluation" in text
    assert "1.0 s tracker" in text  # 0.5 s + 50 x 0.01 s of step logs
    assert "0.20 s study bookkeeping" in text
    assert text.splitlines()[2] == (
        "  once: 3.0 s command start, 1.0 s study and tracker opened, 6.0 s worker start and "
        "exit, 2.0 s idle wait for the last run, 2.0 s report"
    )


def test_one_long_run_bounds_the_wall_from_below(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = _spec(tmp_path, "1")
    est = estimate_wall_time(spec, workers=64, probe=lambda cfg, label: RunCosts(1.0, 10.0))
    # 64 workers cannot finish faster than one run: 10 s + 50 steps x 1 s (+ 0 s of evals),
    # then half a heartbeat of idle wait.
    assert math.isclose(est.runs_s, 60.0) and math.isclose(est.high_s, 62.0)


def test_the_idle_wait_is_what_is_left_of_a_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "10")
    spec = _spec(tmp_path, "1")
    assert idle_wait_s(spec, workers=1, run_s=2.0) == 0.0  # nobody else to wait for
    assert idle_wait_s(spec, workers=2, run_s=2.0) == 9.0  # ends 1 s into a 10 s sleep
    assert idle_wait_s(spec, workers=2, run_s=100.0) == 5.0  # a uniform point of a sleep
    adaptive = _spec(tmp_path, "{min: 3, max: 9, batch: 2}")
    assert idle_wait_s(adaptive, workers=2, run_s=100.0) == 0.25  # a 0.5 s tick, not a beat


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
    est = estimate_wall_time(spec, workers=1, probe=lambda cfg, label: 0.2)
    # 4 cells x 0.2 s x 50 steps = 40 s per seed: 3 seeds at least, 9 at most
    assert math.isclose(est.low_s, 120.0) and math.isclose(est.high_s, 360.0)
    assert estimate_text(est, 1).startswith(
        "estimated wall time with 1 worker(s): 2 min 00 s (every cell decided at its first look) "
        "to 6 min 00 s (every cell at max seeds)\n"
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
    assert costs.tracker_s == costs.log_s == 0.0  # recorded nowhere


def test_a_tracked_probe_times_the_tracker_and_is_recorded(tmp_path):
    study = StudySpec.from_experiment(_spec(tmp_path, "1"))
    cfg = study.cell_config("eps_clip=0.2 max_new_tokens=4", 0, threads=1)
    tracker = MemoryTracker()
    got = timed_probe(cfg, tracker, experiment="est", run_name="probe")
    assert got.result.status == "completed" and got.result.steps_done == 2
    run = tracker.runs[got.run_id]
    assert run.status == "FINISHED" and len(run.metrics["perf/step_time"]) == 2
    assert 0.0 < got.costs.log_s < 10.0 and 0.0 < got.costs.tracker_s < 30.0
    assert 0.0 < got.costs.step_s < 60.0


def test_the_dry_run_prints_the_breakdown_and_leaves_nothing(tmp_path, monkeypatch):
    """The CLI's dry run measures the sweep's parts in a scratch directory it removes."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = tmp_path / "e.yaml"
    path.write_text(SWEEP)
    out = CliRunner().invoke(
        app,
        ["ablate", str(path), "--dry-run", "--workers", "2", "--results-dir", str(tmp_path / "r")],
    )
    assert out.exit_code == 0, out.output
    lines = out.output[out.output.index("estimated wall time") :].splitlines()
    assert re.fullmatch(r"estimated wall time with 2 worker\(s\): [0-9 a-z]+", lines[0]), lines
    assert lines[1].startswith("  4 runs: ") and "study bookkeeping" in lines[1], lines
    assert "tracker" in lines[1] and "warm start 20 steps per seed" in lines[1], lines
    once = dict(
        (what, float(v))
        for v, what in re.findall(
            r"([0-9.]+) s ([a-z ]+?)(?:,|$)", lines[2].removeprefix("  once: ")
        )
    )
    assert set(once) == {
        "command start",
        "study and tracker opened",
        "worker start and exit",
        "idle wait for the last run",
        "report",
    }, lines[2]
    assert all(v > 0 for v in once.values()), once
    assert lines[3] == "  measured on this machine by 1 probe run(s)"
    assert not (tmp_path / "r").exists()  # a dry run writes nothing
    assert list(scratch.iterdir()) == []  # and its scratch stores are gone


def test_the_workers_start_is_measured_once_per_process_and_count(tmp_path, monkeypatch):
    """Two estimates in one process spawn the scratch workers once; past the cores the measured
    start scales by workers / cores (one core here, so that one spawn serves every count)."""
    import os

    from harness.sweep.launching import estimating
    from harness.sweep.launching.launchers.local import LocalLauncher

    spawned: list[int] = []
    real = LocalLauncher.start

    def counting(self, n, opts, resources):
        spawned.append(n)
        return real(self, n, opts, resources)

    monkeypatch.setattr(LocalLauncher, "start", counting)
    monkeypatch.setattr(estimating, "_WORKER_START_S", {})
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    path = tmp_path / "e.yaml"
    path.write_text(SWEEP)
    spec = load_experiment(path)
    with estimating.ScratchSweep(spec) as a:
        a.open_and_start(1)
    with estimating.ScratchSweep(spec) as b:
        b.open_and_start(1)
    with estimating.ScratchSweep(spec) as c:
        c.open_and_start(4)
    assert spawned == [1], spawned
    one = a._once.worker_s
    assert one > 0 and b._once.worker_s == one
    assert math.isclose(c._once.worker_s, 4 * one), (c._once.worker_s, one)


def test_durations_read_as_text():
    assert [duration_text(s) for s in (42, 200, 7500)] == ["42 s", "3 min 20 s", "2 h 05 min"]


def seconds_of(text: str) -> float:
    """The inverse of :func:`duration_text`: ``42 s``, ``3 min 20 s``, ``2 h 05 min``."""
    units = {"h": 3600, "min": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+) (h|min|s)\b", text)))


def test_durations_read_back():
    assert [seconds_of(duration_text(s)) for s in (42, 200, 7500)] == [42, 200, 7500]


SWEEP = """
name: estvsreal
base: {task: reverse, warm_start: {steps: 20}, eval: {n_prompts: 16, every: 5},
       rollout: {prompts_per_step: 2, n_samples: 2, max_new_tokens: 6}}
grid:
  ppo.eps_clip: [0.2, 10.0]          # one shape: one probe
seeds: 2
steps: 10
baseline: {ppo.eps_clip: 0.2}
metric: final/reward
"""


def _harness(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
    )
    return done, time.perf_counter() - t0


def _dry_run_estimate(argv: list[str], cwd: Path) -> tuple[float, str]:
    dry, _ = _harness(*argv, "--dry-run", cwd=cwd)
    assert dry.returncode == 0, dry.stderr[-2000:]
    head = re.search(r"estimated wall time with 2 worker\(s\): (.*)", dry.stdout)
    assert head is not None, dry.stdout[-2000:]
    return seconds_of(head.group(1)), dry.stdout[head.start() :]


@pytest.mark.slow
def test_the_estimate_is_within_a_factor_of_2_of_a_real_sweep(tmp_path):
    """The dry run, the sweep, and the dry run again, each a fresh ``harness`` process from the
    command line, back to back: the two estimates bracket the sweep in time, so their mean sees
    the load the sweep saw where the machine's load drifts (other work starting or ending on a
    shared 2-core machine moved a lone estimate by half)."""
    path = tmp_path / "e.yaml"
    path.write_text(SWEEP)
    argv = ["ablate", str(path), "--workers", "2", "--results-dir", str(tmp_path / "results")]
    before, breakdown = _dry_run_estimate(argv, tmp_path)
    done, wall = _harness(*argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    after, _ = _dry_run_estimate(argv, tmp_path)
    estimate = (before + after) / 2
    print(f"estimates {before:.0f} s and {after:.0f} s, wall {wall:.1f} s\n{breakdown}")
    assert 0.5 <= estimate / wall <= 2.0, (before, after, wall, breakdown)
