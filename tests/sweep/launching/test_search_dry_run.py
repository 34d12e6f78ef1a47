"""`harness search --dry-run`: validates the file, prints the space TPE samples (a row per field),
the budget in points, runs and steps, the objectives, the pruner and the estimated wall time,
and writes nothing; a packed search says how its points pack.  The estimate is within a factor
of 2 of the real search's wall (slow)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import harness.sweep.launching.search_estimating as search_estimating
from harness.cli import app
from harness.sweep.scheduler.estimate import RunCosts, SweepCosts
from harness.sweep.scheduler.search_estimate import estimate_search_wall_time
from harness.sweep.scheduler.spec import StudySpec
from tests.support.experiments import grid_file, search_file, smoke_base
from tests.support.packing import lora_base
from tests.sweep.scheduler.test_estimate import _harness, seconds_of

PARAMS = {
    "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    "ppo.c_clip": {"type": "categorical", "choices": [None, 3.0]},
    "rollout.max_new_tokens": {"type": "int", "low": 3, "high": 6},
}


def _measured(spec, workers, command_s=0.0, k=1):
    """The measurement stood in by fixed costs (the pure arithmetic is tested with the
    estimate; the real measurement by the slow test below): what the CLI hands on."""
    study = StudySpec.from_experiment(spec)
    probed = {
        label: (study.run_config(points, 0), RunCosts(step_s=1.0))
        for label, points in search_estimating.probe_points(spec).items()
    }
    _measured.calls.append((workers, k))
    return estimate_search_wall_time(spec, workers, probed, SweepCosts(command_s=command_s), k)


def _dry_run(tmp_path: Path, monkeypatch, exp: Path, *flags: str):
    _measured.calls = []
    monkeypatch.setattr(search_estimating, "measured_search_wall_time", _measured)
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app, ["search", str(exp), "--dry-run", *flags, "--results-dir", str(results)]
    )
    assert not results.exists() and list(scratch.iterdir()) == []  # a dry run writes nothing
    return r


def test_the_dry_run_prints_the_space_the_budget_and_the_estimate(tmp_path, monkeypatch):
    base = {**smoke_base(), "task": "reverse"}
    exp = search_file(
        tmp_path, "sdry", base, n_trials=5, params=PARAMS, pruner="median", seeds=3, steps=4
    )
    r = _dry_run(tmp_path, monkeypatch, exp, "--workers", "2")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "sdry: 5 points x 3 seeds = at most 15 runs" in out
    rows = {
        m.group(1): m.groups()[1:]
        for m in re.finditer(r"│ (\S+) +│ (\S+) +│ (.+?) +│ (\S+) +│", out)
    }
    assert rows["optim.lr"] == ("float", "[0.0001, 0.01]", "log")
    assert rows["ppo.c_clip"] == ("categorical", "null, 3.0", "choices")
    assert rows["rollout.max_new_tokens"] == ("int", "[3, 6]", "linear")
    assert "objective final/reward (maximize); pruner median (once 4 points have finished" in out
    assert "4 steps per run; step budget at most 60 steps" in out
    assert _measured.calls == [(2, 1)]
    head = out[out.index("estimated wall time") :].splitlines()
    # Median pruning: the first 4 points at 3 seeds, the fifth at one: 13 to 15 runs.
    assert head[0].startswith("estimated wall time with 2 worker(s): ")
    assert head[1].startswith("  13-15 runs: ")
    assert head[-1].startswith(
        "  measured on this machine by 2 probe run(s): rollout.max_new_tokens"
    )


def test_a_packed_search_dry_run_says_how_its_points_pack(tmp_path, monkeypatch):
    params = {"optim.lr": PARAMS["optim.lr"]}
    exp = search_file(tmp_path, "spack", lora_base(), n_trials=4, params=params, seeds=2, steps=3)
    r = _dry_run(tmp_path, monkeypatch, exp, "--workers", "1", "--cells-per-worker", "2")
    assert r.exit_code == 0, r.output
    assert (
        "packing: up to 2 points per worker: each seed of the points a worker asks for" in r.stdout
    )
    assert _measured.calls == [(1, 2)]
    assert ", up to 2 packed in each (per run: " in r.stdout
    assert "no searched field changes what a run costs" in r.stdout


def test_a_grid_file_is_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    exp = grid_file(tmp_path / "g.yaml", "g", smoke_base(), {"ppo.eps_clip": [0.1, 0.2]})
    r = _dry_run(tmp_path, monkeypatch, exp)
    assert r.exit_code == 2 and _measured.calls == []
    assert r.stderr.strip().splitlines() == [
        f"error: {exp}: has no search section; run a grid with `harness ablate`"
    ]


@pytest.mark.slow  # two dry runs and the search, each a fresh process: about 3 min loaded
def test_the_estimate_is_within_a_factor_of_2_of_a_real_search(tmp_path):
    """As the grid's: the dry run, the search and the dry run again back to back, so their mean
    sees the load the search saw.  No pruner and one run shape: the estimate is one number."""
    base = {
        **smoke_base(),
        "task": "reverse",
        "warm_start": {"steps": 20},
        "eval": {"n_prompts": 16, "every": 5},
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 6},
    }
    exp = search_file(tmp_path, "svsreal", base, n_trials=4, seeds=2, steps=10)
    argv = ["search", str(exp), "--workers", "2", "--results-dir", str(tmp_path / "results")]
    estimates = []
    for when in ("before", "after"):
        if when == "after":
            done, wall = _harness(*argv, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-2000:]
        dry, _ = _harness(*argv, "--dry-run", cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr[-2000:]
        head = re.search(r"estimated wall time with 2 worker\(s\): (.*)", dry.stdout)
        assert head is not None and " to " not in head.group(1), dry.stdout[-2000:]
        estimates.append(seconds_of(head.group(1)))
    estimate = sum(estimates) / 2
    print(f"estimates {estimates}, wall {wall:.1f} s")
    assert 0.5 <= estimate / wall <= 2.0, (estimates, wall)
