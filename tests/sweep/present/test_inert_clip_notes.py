"""Before any run, the dry run says which cells' clipping cannot act (the ratio is identically 1)
and which cells therefore repeat the baseline's runs; the estimate's probe run adds no raw
Python warning of its own."""

from __future__ import annotations

import warnings
from pathlib import Path

from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.sweep.present.display import inert_clip_lines
from harness.sweep.scheduler.estimate import probe_run
from harness.sweep.scheduler.spec import StudySpec

GRID = """
name: inert
base: {task: reverse, rollout: {prompts_per_step: 2, n_samples: 2, max_new_tokens: 4}, ppo: PPO}
grid: GRID
seeds: 1
steps: 2
baseline: BASELINE
metric: final/reward
"""


def _spec(tmp_path: Path, ppo: str, grid: str, baseline: str):
    path = tmp_path / "e.yaml"
    path.write_text(GRID.replace("PPO", ppo).replace("GRID", grid).replace("BASELINE", baseline))
    return load_experiment(path)


def test_every_cell_inert_and_a_clip_only_cell_repeats_the_baseline(tmp_path):
    spec = _spec(
        tmp_path,
        "{ppo_n_minibatches: 1}",
        "{ppo.eps_clip: [0.2, 0.3], optim.lr: [1.0e-4, 2.0e-4]}",
        "{ppo.eps_clip: 0.2, optim.lr: 1.0e-4}",
    )
    lines = inert_clip_lines(spec)
    assert lines[0].startswith("note: clipping is inert in every cell (")
    # Only the cell that changes nothing but eps_clip repeats the baseline; a new lr does not.
    assert lines[1:] == [
        "note: cell 'eps_clip=0.3 lr=0.0001' differs from the baseline only in ppo.eps_clip, "
        "which cannot act here: its runs repeat the baseline's"
    ]


def test_some_cells_inert_are_named(tmp_path):
    spec = _spec(
        tmp_path,
        "{ppo_epochs: 1}",
        "{ppo.ppo_n_minibatches: [1, 2], ppo.c_clip: [null, 3.0]}",
        "{ppo.ppo_n_minibatches: 2, ppo.c_clip: null}",
    )
    lines = inert_clip_lines(spec)
    inert = [c.label for c in spec.cells if c.overrides["ppo.ppo_n_minibatches"] == 1]
    assert len(inert) == 2
    assert lines == [
        f"note: clipping is inert in 2 of 4 cells ({', '.join(inert)}) (one optimizer step per "
        "batch on fresh or recomputed log-probs: the ratio is identically 1), so eps_clip, "
        "eps_clip_higher and c_clip cannot change those runs; use ppo_n_minibatches > 1, "
        "ppo_epochs > 1 or staleness"
    ]  # the baseline is not inert: no cell repeats it


def test_no_note_where_clipping_acts(tmp_path):
    spec = _spec(
        tmp_path, "{ppo_n_minibatches: 2}", "{ppo.eps_clip: [0.2, 0.3]}", "{ppo.eps_clip: 0.2}"
    )
    assert inert_clip_lines(spec) == []


def test_the_probe_run_raises_no_warning_of_its_own(tmp_path):
    spec = _spec(
        tmp_path, "{ppo_n_minibatches: 1}", "{ppo.eps_clip: [0.2, 0.3]}", "{ppo.eps_clip: 0.2}"
    )
    cfg = StudySpec.from_experiment(spec).cell_config(spec.cells[0].label, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert probe_run(cfg).step_s > 0
    assert not [w for w in caught if "clipping is inert" in str(w.message)]


def test_the_dry_run_prints_the_notes_not_a_python_warning(tmp_path):
    path = tmp_path / "e.yaml"
    grid = "{ppo.eps_clip: [0.2, 0.3]}"
    path.write_text(
        GRID.replace("PPO", "{ppo_n_minibatches: 1}")
        .replace("GRID", grid)
        .replace("BASELINE", "{ppo.eps_clip: 0.2}")
    )
    out = CliRunner().invoke(
        app, ["ablate", str(path), "--dry-run", "--results-dir", str(tmp_path / "r")]
    )
    assert out.exit_code == 0, out.output
    assert "note: clipping is inert in every cell (" in out.output
    assert "note: cell 'eps_clip=0.3' differs from the baseline only in ppo.eps_clip" in out.output
    assert "UserWarning" not in out.output and ".py:" not in out.output
    assert not (tmp_path / "r").exists()  # a dry run writes nothing
