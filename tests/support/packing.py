"""What the packing tests share: the LoRA run a pack trains, a grid of two cells that pack, the
two cells whose packed histories are compared with their unpacked runs, a pack with a failing
trial, what a packed sweep left in its stores, and a packed sweep's command held mid-pack for a
fault (tests/hooks/sitecustomize.py) and its rerun."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.run.packing import run_packed
from harness.sweep.scheduler.spec import trial_key
from tests.hooks.kill_at import rerun_to_the_end
from tests.support.study_reads import mlflow_runs, trials
from tests.support.tiny import TINY

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "tests" / "hooks"

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
# Dropout draws from the global RNG, so each trial's RNG streams are load-bearing in a pack.
LORA_DROPOUT = {**LORA, "dropout": 0.1}
# Heads of 32 for the engine (its CPU attention takes no smaller head size).
TINY_ENGINE = {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128}

# The cells of :func:`lora_grid`: two learning rates, so the cells differ in every update.
CELLS = ["lr=0.01", "lr=0.03"]

# Two cells of one pack compared with their unpacked runs: KL to the base, a staleness ring and
# a cached warm start in both (``HISTORY_COMMON``), each its own clip range and learning rate.
HISTORY_COMMON = {
    "ppo.kl_ctl": 0.1,
    "rollout.staleness": 1,
    "warm_start.steps": 3,
    "warm_start.batch_size": 4,
}
HISTORY_CELLS = [{"ppo.eps_clip": 0.1, "optim.lr": 1e-2}, {"ppo.eps_clip": 0.3, "optim.lr": 3e-2}]


def lora_base(
    *, engine: bool = False, lora: dict[str, Any] = LORA, eval_every: int = 0
) -> dict[str, Any]:
    """The run a pack trains: the reverse task on a one-layer tiny model with ``lora``, 2
    prompts x 2 completions of at most 5 tokens a step, one thread; ``engine``: sampled by the
    vLLM engine, on :data:`TINY_ENGINE`."""
    rollout: dict[str, Any] = {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5}
    if engine:
        rollout["sampler_backend"] = "vllm"
    return {
        "task": "reverse",
        "tiny": dict(TINY_ENGINE if engine else TINY),
        "model_options": {"lora": dict(lora)},
        "rollout": rollout,
        "ppo": {"ppo_n_minibatches": 2, "entropy_coef": 0.05},  # a gradient at zero reward
        "eval": {"every": eval_every, "n_prompts": 4},
        "threads": 1,
    }


def lora_grid(tmp_path: Path, name: str, base: dict[str, Any] | None = None, **over: Any) -> Path:
    """``tmp_path/NAME.yaml``: a grid over :data:`CELLS` from ``base`` (by default
    :func:`lora_base`), one seed of 3 steps; ``over`` adds or replaces top-level keys."""
    doc = {
        "name": name,
        "base": base or lora_base(),
        "grid": {"optim.lr": [0.01, 0.03]},
        "seeds": 1,
        "steps": 3,
        "baseline": {"optim.lr": 0.01},
        "metric": "final/reward",
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def child_runs(results: Path, name: str) -> tuple[Any, list[Any]]:
    """(client, the child runs) of experiment ``name`` in the MLflow store under ``results``."""
    client, runs = mlflow_runs(results, name)
    return client, [r for r in runs if r.data.tags.get("harness.role") == "child"]


def assert_one_pack_per_seed(
    results: Path, name: str, seeds: tuple[int, ...] = (0, 1)
) -> tuple[dict[tuple[str, int] | None, int], Any, list[Any]]:
    """Check a packed :func:`lora_grid` sweep: each (cell, seed) COMPLETE exactly once (nothing
    failed or retried), every child run FINISHED, and each seed's runs trained in one pack (the
    seed is a base field: their ``harness.pack`` tag names the seed's trials).  Returns
    (trial number by (cell, seed), the MLflow client, the child runs)."""
    ts = trials(results, name)
    assert sorted((trial_key(t), t.state.name) for t in ts) == [
        ((c, s), "COMPLETE") for c in CELLS for s in seeds
    ]  # each (cell, seed) exactly once, nothing failed or retried
    number = {trial_key(t): t.number for t in ts}
    client, children = child_runs(results, name)
    assert sorted(r.info.status for r in children) == ["FINISHED"] * len(CELLS) * len(seeds)
    for run in children:
        seed = int(run.data.tags["seed"])
        want = ",".join(str(number[(c, seed)]) for c in CELLS)
        assert run.data.tags["harness.pack"] == want, run.data.tags
    return number, client, children


def run_pack_with_a_broken_tracker(cfg: Callable[..., Any], results_dir: Path) -> list[Any]:
    """A pack of ``cfg()`` and ``cfg(optim.lr=1e-2)`` whose first trial's tracker raises
    ``RuntimeError: tracking store unreachable`` at step 1 (after the step is recorded)."""

    def broken_tracker(step: int, metrics: Any) -> None:
        if step == 1:
            raise RuntimeError("tracking store unreachable")

    return run_packed(
        [cfg(), cfg(**{"optim.lr": 1e-2})],
        [{"results_dir": results_dir, "on_metrics": broken_tracker}, {"results_dir": results_dir}],
    )


def assert_same_histories(
    got: dict[Any, dict[str, list[float]]], want: dict[Any, dict[str, list[float]]]
) -> None:
    """Each run's metric histories in ``got`` equal ``want``'s to 1e-5 relative (NaN for NaN):
    a packed run against its unpacked twin on the tiny model at fp32."""
    for key, metrics in want.items():
        assert got[key].keys() == metrics.keys(), key
        for m, xs in metrics.items():
            ys = got[key][m]
            assert len(ys) == len(xs), (key, m)
            for x, y in zip(xs, ys, strict=True):
                if math.isnan(x):
                    assert math.isnan(y), (key, m)
                else:
                    assert y == pytest.approx(x, rel=1e-5, abs=1e-12), (key, m)


def hooked(
    tmp_path: Path, command: str, exp: Path, *extra: str
) -> tuple[list[str], dict[str, str], Path, Path]:
    """``harness COMMAND EXP`` packed (one worker, 2 per worker) as a subprocess's command,
    ``extra`` appended; its environment with the hold installed (the worker holds once the
    pack's second run recorded its first step, its pid in the marker); the results directory;
    the marker."""
    results, marker = tmp_path / "results", tmp_path / "held"
    cmd = [sys.executable, "-m", "harness", command, str(exp), "--workers", "1"]
    cmd += ["--cells-per-worker", "2", "--results-dir", str(results), *extra]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT)]),
        "HARNESS_TEST_HOLD_SECOND_RUN": str(marker),
        "HARNESS_HEARTBEAT_S": "1",  # a killed worker's trials go stale within seconds
    }
    return cmd, env, results, marker


def rerun(cmd: list[str]) -> None:
    """Run a :func:`hooked` command again without the hold, to its end."""
    rerun_to_the_end(cmd, {**os.environ, "HARNESS_HEARTBEAT_S": "1"}, ROOT)
