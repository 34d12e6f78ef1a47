"""rollout.async on the command line: a bad value, in a run file, in --set or on a grid axis, and
spelled rollout.async.* or rollout.asynchronous.*, is one line on stderr naming the field, exit
2, nothing written (harness run and harness ablate --dry-run); `harness fields` lists the block;
an axis over it expands into cells like any other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app

BASE = {
    "task": "reverse",
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
    "eval": {"every": 0, "n_prompts": 4},
    "steps": 2,
}
FIELDS = (
    "max_staleness",
    "weight_updates",
    "in_flight_kv",
    "partial",
    "over_sample",
    "clock",
    "update_time",
    "max_concurrent",
)


def _invoke(argv: list[str], tmp: Path) -> tuple[int, str, Path]:
    results = tmp / "results"
    r = CliRunner().invoke(app, [*argv, "--results-dir", str(results)])
    return r.exit_code, r.stderr if r.stderr is not None else r.output, results


def _refused(code: int, err: str, results: Path, expect: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], (expect, lines[0])
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))


def _run_file(tmp: Path, rollout: dict | None = None) -> Path:
    doc = {**BASE, "rollout": {**BASE["rollout"], **(rollout or {})}}
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _experiment(tmp: Path, grid: dict, rollout: dict | None = None) -> Path:
    base = {**BASE, "rollout": {**BASE["rollout"], **(rollout or {})}}
    path = tmp / "e.yaml"
    path.write_text(
        yaml.safe_dump({"name": "async-cli", "base": base, "grid": grid, "seeds": 1, "steps": 2})
    )
    return path


# --set, both spellings: (setting, what the one line says)
SET_CASES = [
    ("rollout.async.max_staleness=-1", "must be an integer in [0, 1_000]; got -1"),
    ("rollout.asynchronous.max_staleness=1001", "must be an integer in [0, 1_000]; got 1001"),
    ("rollout.async.clock=wall", "must be one of 'virtual', 'threads'; got 'wall'"),
    ("rollout.asynchronous.weight_updates=in_flight", "'in_flight' acts only with max_staleness"),
    ("rollout.async.over_sample=0.5", "must be a finite number in [1, 16]; got 0.5"),
    ("rollout.asynchronous.update_time=0", "must be an integer in [1, 1_000_000]; got 0"),
    ("rollout.async.max_concurrent=0", "must be an integer in [1, 1_000_000]; got 0"),
    ("rollout.async.partial=maybe", "must be true or false; got 'maybe'"),
    ("rollout.async.bogus=1", "unknown key (allowed: clock, in_flight_kv, max_concurrent,"),
]


@pytest.mark.parametrize("setting,expect", SET_CASES)
def test_a_bad_set_value_is_one_line_naming_the_field(setting, expect, tmp_path):
    code, err, results = _invoke(["run", str(_run_file(tmp_path)), "--set", setting], tmp_path)
    _refused(code, err, results, f"--set {setting}: {expect}")


@pytest.mark.parametrize(
    "block,expect",
    [
        (
            {"async": {"max_staleness": -1}},
            "rollout.asynchronous.max_staleness: must be an integer",
        ),
        ({"asynchronous": {"clock": "wall"}}, "rollout.asynchronous.clock: must be one of"),
        (
            {"async": {"max_staleness": 2, "in_flight_kv": "recompute"}},
            "rollout.asynchronous.in_flight_kv: 'recompute' acts only with weight_updates: in_flight",
        ),
        (
            {"async": {"max_staleness": 1}, "staleness": 2},
            "rollout.staleness: the strict fixed-lag mode, exclusive with rollout.async",
        ),
    ],
)
def test_a_bad_run_file_value_is_one_line_naming_the_field(block, expect, tmp_path):
    path = _run_file(tmp_path, block)
    code, err, results = _invoke(["run", str(path)], tmp_path)
    _refused(code, err, results, f"{path}: {expect}")


@pytest.mark.parametrize(
    "grid,rollout,expect",
    [
        (
            {"rollout.async.max_staleness": [0, -2]},
            None,
            "grid.rollout.async.max_staleness: value -2 rejected: must be an integer in [0, 1_000]",
        ),
        (
            {"rollout.asynchronous.clock": ["virtual", "wall"]},
            None,
            "grid.rollout.asynchronous.clock: value 'wall' rejected: must be one of",
        ),
        (
            {"ppo.eps_clip": [0.1, 0.2]},
            {"async": {"over_sample": 3.0}},
            "over_sample: acts only with partial: true",
        ),
    ],
)
def test_a_bad_experiment_value_is_one_line_and_the_dry_run_writes_nothing(
    grid, rollout, expect, tmp_path
):
    path = _experiment(tmp_path, grid, rollout)
    code, err, results = _invoke(["ablate", str(path), "--dry-run"], tmp_path)
    _refused(code, err, results, expect)


def test_fields_lists_the_async_block_under_either_spelling():
    for prefix in ("rollout.asynchronous", "rollout.async"):
        r = CliRunner().invoke(app, ["fields", prefix], env={"COLUMNS": "250"})
        assert r.exit_code == 0, r.output
        listed = [ln.split("\t")[0] for ln in r.output.splitlines() if ln.strip()]
        assert listed == [f"rollout.asynchronous.{f}" for f in FIELDS], listed
    r = CliRunner().invoke(app, ["fields", "rollout.asynchronous.max_staleness"])
    assert "\t0\tη: how many versions the sampler may run ahead" in r.output


def test_an_async_axis_expands_into_cells(tmp_path, monkeypatch):
    import harness.cli.commands.sweep as sweep_cmd

    # The dry run's wall-time estimate is a probe run; the cells are what this test reads.
    monkeypatch.setattr(sweep_cmd, "wall_time_line", lambda *a, **k: "estimated wall time: -")
    path = _experiment(
        tmp_path,
        {"rollout.async.max_staleness": [0, 2], "rollout.async.clock": ["virtual", "threads"]},
    )
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(path), "--dry-run", "--results-dir", str(results)])
    out = r.stdout
    assert r.exit_code == 0, r.output
    assert "async-cli: 4 cells x 1 seeds = 4 trials" in out
    rows = [ln for ln in out.splitlines() if "rollout.asynchronous.max_staleness=" in ln]
    assert len(rows) == 4
    for eta in (0, 2):
        for clock in ("virtual", "threads"):
            assert any(
                f"rollout.asynchronous.max_staleness={eta}" in ln
                and f"rollout.asynchronous.clock={clock}" in ln
                for ln in rows
            ), (eta, clock, rows)
    assert not results.exists()

    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.spec import StudySpec

    study = StudySpec.from_experiment(load_experiment(path))
    cfgs = [study.cell_config(c, 0).rollout.asynchronous for c in study.cells]
    assert sorted((a.max_staleness, a.clock) for a in cfgs) == [
        (0, "threads"),
        (0, "virtual"),
        (2, "threads"),
        (2, "virtual"),
    ]
    assert [a.enabled for a in cfgs].count(True) == 2
