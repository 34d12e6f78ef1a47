"""Shared by the adaptive-seed tests: a four-cell experiment (a baseline, a clearly better cell,
an equivalent one and a slightly different one) and a worker that tells each claimed trial a
controlled score instead of training, so the allocation runs on a real Optuna study fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"

# cell (ppo.eps_clip) -> (mean, sd) of the metric over seeds; the baseline is 0.2.
CELLS = {0.2: (0.0, 0.02), 0.1: (1.0, 0.02), 0.3: (0.0, 0.02), 0.25: (0.1, 0.4)}
BASELINE = "eps_clip=0.2"
BETTER, EQUIVALENT, SLIGHT = "eps_clip=0.1", "eps_clip=0.3", "eps_clip=0.25"
WALL = 2.0  # seconds each controlled "run" says it took
PLAN = {"min": 3, "max": 7, "batch": 2, "decide": "baseline", "confidence": 0.95, "margin": 0.3}


def write_experiment(tmp_path: Path, name: str = "adaptive", **seeds: Any) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name=name, steps=2, grid={"ppo.eps_clip": list(CELLS)})
    doc["baseline"] = {"ppo.eps_clip": 0.2}
    doc["seeds"] = {**PLAN, **seeds}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def score(cell: str, seed: int) -> float:
    """The controlled metric of (cell, seed): reproducible, independent across cells."""
    eps = float(cell.split("=")[1])
    mean, sd = CELLS[eps]
    rng = np.random.default_rng([int(eps * 1000), seed])
    return float(mean + sd * rng.standard_normal())


def open_adaptive(path: Path, results: Path) -> tuple[Any, Any]:
    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.study import enqueue_missing, open_study
    from harness.sweep.stores.storage import make_storage
    from harness.tracking import MemoryTracker

    study, spec = open_study(
        load_experiment(path),
        storage=make_storage(None, results),
        tracker=MemoryTracker(),
        study_name=None,
        tracking_uri="memory",
        command="test",
    )
    enqueue_missing(study, spec)
    return study, spec


def run_one(study: Any, spec: Any) -> tuple[str, int] | None:
    """One worker step: claim the next released trial and tell its score (None: nothing)."""
    from harness.sweep.scheduler.trials import next_trial

    trial, _ = next_trial(study, spec)
    if trial is None:
        return None
    from harness.sweep.stores.optuna_adapter import frozen_trial

    ua = frozen_trial(study, trial).user_attrs
    cell, seed = str(ua["cell"]), int(ua["seed"])
    from harness.sweep.scheduler.labels import summary_attrs

    value = score(cell, seed)
    # What a worker records of a run: its outcome, summary and wall time, then the metric.
    for k, v in {
        "outcome": "completed",
        "wall_time": WALL,
        **summary_attrs({spec.metric: value}),
    }.items():
        trial.set_user_attr(k, v)
    study.tell(trial, value)
    return cell, seed


def drain(study: Any, spec: Any) -> list[tuple[str, int]]:
    """Run trials until none is released (what workers do, one at a time)."""
    ran = []
    while (key := run_one(study, spec)) is not None:
        ran.append(key)
    return ran


def terminal_keys(study: Any) -> dict[tuple[str, int], list[str]]:
    """(cell, seed) -> the states of its trials."""
    out: dict[tuple[str, int], list[str]] = {}
    for t in study.get_trials(deepcopy=False):
        key = (str(t.user_attrs["cell"]), int(t.user_attrs["seed"]))
        out.setdefault(key, []).append(t.state.name)
    return out


# The python: reward module of the end-to-end tests: each cell's final/reward drawn from CELLS,
# one value per run (`harness ablate` with a controlled metric).
REWARDS = """
import numpy as np
import torch

# cell -> (mean, sd) of final/reward over seeds: the same numbers as tests/support/adaptive_study.py.
CELLS = {cells!r}


def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]


def _score(key):
    # One value per run: the run's seed (torch.manual_seed(cfg.seed)) and the cell, so the
    # cells are independent and every run of a cell and seed scores the same.
    mean, sd = CELLS[key]
    rng = np.random.default_rng([int(key * 1000), torch.initial_seed()])
    return float(mean + sd * rng.standard_normal())


def baseline(prompt, completion, answer):
    return _score(0.2)


def better(prompt, completion, answer):
    return _score(0.1)


def equivalent(prompt, completion, answer):
    return _score(0.3)


def slight(prompt, completion, answer):
    return _score(0.25)
"""
