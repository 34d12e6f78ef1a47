"""Experiment files written for a test: the smoke experiment's base run and a small search."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"

# The search space most search tests use: one float range.
EPS_CLIP_RANGE = {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}}


def smoke_base() -> dict[str, Any]:
    """The base run of ``experiments/smoke.yaml``."""
    return dict(yaml.safe_load(SMOKE.read_text())["base"])


def search_file(
    tmp_path: Path,
    name: str,
    base: dict[str, Any],
    *,
    n_trials: int = 2,
    params: dict[str, Any] | None = None,
    pruner: str = "none",
    seeds: int = 1,
    steps: int = 2,
    search_extra: dict[str, Any] | None = None,
    **more: Any,
) -> Path:
    """``tmp_path/search.yaml``: a search named ``name`` over ``params`` (by default
    :data:`EPS_CLIP_RANGE`) from ``base``; ``search_extra`` adds keys to the ``search:``
    block (objectives, sampler, ...), ``more`` adds or replaces top-level keys."""
    search = {"n_trials": n_trials, "params": params or EPS_CLIP_RANGE, "pruner": pruner}
    search.update(search_extra or {})
    doc = {"name": name, "base": base, "search": search, "seeds": seeds, "steps": steps, **more}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# A model smaller than the tiny one, for sweeps whose training is beside the point.
SMALL_TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 16}


def small_experiment(
    tmp_path: Path,
    name: str,
    task: str,
    *,
    seeds: int = 1,
    base: dict[str, Any] | None = None,
    **more: Any,
) -> Path:
    """``tmp_path/NAME.yaml``: ``experiments/smoke.yaml`` renamed ``name``, 2 steps of ``seeds``
    seeds, its base run on ``task`` with :data:`SMALL_TINY` sampling 2 prompts × 2 completions
    of at most 3 tokens; ``base`` adds entries to the base run, ``more`` top-level keys (a
    ``grid``, a ``baseline``)."""
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name=name, seeds=seeds, steps=2, **more)
    doc["base"].update(task=task, **(base or {}))
    doc["base"]["tiny"] = dict(SMALL_TINY)
    doc["base"]["rollout"] = {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 3}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_ablate(
    exp: Path, results: Path, env: dict[str, str], stderr: IO[str]
) -> subprocess.Popen[bytes]:
    """``python -m harness ablate EXP --results-dir RESULTS`` started from the repository root
    with ``env``, its stdout dropped and its stderr written to ``stderr``."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "ablate", str(exp), "--results-dir", str(results)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def grid_file(
    path: Path,
    name: str,
    base: dict[str, Any],
    grid: dict[str, list[Any]],
    *,
    seeds: int = 1,
    steps: int = 2,
    **more: Any,
) -> Path:
    """``path``: a grid experiment named ``name`` over ``grid`` from ``base``; ``more`` adds
    top-level keys (a ``metric``, a ``baseline``)."""
    doc = {"name": name, "base": base, "grid": grid, "seeds": seeds, "steps": steps, **more}
    path.write_text(yaml.safe_dump(doc))
    return path
