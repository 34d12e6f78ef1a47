"""`harness ablate --cells-per-worker K` with the vLLM engine as the sampler: a worker trains the
cells of a pack on one base model and samples them from one engine serving their adapters
(harness/sampling/vllm_adapters.py).

Slow (an engine start per pack on a loaded 2-core machine); skipped with a reason where the
engine is not installed (``python tools/install_engine.py``; ``make test`` does it). The local
sampler's version, with the unpacked histories and the faults: test_packing_sweep.py.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.model.engine_support import engine_installed
from harness.sweep.scheduler.spec import trial_key
from tests.support.study_reads import mlflow_runs, trials

pytest.importorskip("peft")
optuna.logging.set_verbosity(optuna.logging.WARNING)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
    ),
]

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
BASE = {
    "task": "reverse",
    # Heads of 32 for the engine (its CPU attention takes no smaller head size).
    "tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128},
    "model_options": {"lora": LORA},
    "rollout": {
        "prompts_per_step": 2,
        "n_samples": 2,
        "max_new_tokens": 5,
        "sampler_backend": "vllm",
    },
    "ppo": {"ppo_n_minibatches": 2, "entropy_coef": 0.05},  # a gradient at zero reward
    "eval": {"every": 0, "n_prompts": 4},
    "threads": 1,
}
CELLS = ["lr=0.01", "lr=0.03"]


def test_a_packed_engine_grid_completes_every_cell_seed_exactly_once(tmp_path: Path):
    """A 2-cell x 2-seed LoRA grid with the engine, 2 cells per worker, one worker (one engine
    at a time on the shared cores): two packs (the seed is a base field), every (cell, seed)
    complete once, each child run finished, tagged with its pack and sampled by the engine."""
    doc = {
        "name": "engine",
        "base": BASE,
        "grid": {"optim.lr": [0.01, 0.03]},
        "seeds": 2,
        "steps": 3,
        "baseline": {"optim.lr": 0.01},
        "metric": "final/reward",
    }
    exp = tmp_path / "engine.yaml"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    args = ["ablate", str(exp), "--results-dir", str(results)]
    r = CliRunner().invoke(app, [*args, "--workers", "1", "--cells-per-worker", "2"])
    assert r.exit_code == 0, r.output

    ts = trials(results, "engine")
    assert sorted((trial_key(t), t.state.name) for t in ts) == [
        ((c, s), "COMPLETE") for c in CELLS for s in (0, 1)
    ]  # each (cell, seed) exactly once, nothing failed or retried
    number = {trial_key(t): t.number for t in ts}
    client, runs = mlflow_runs(results, "engine")
    children = [r for r in runs if r.data.tags.get("harness.role") == "child"]
    assert sorted(r.info.status for r in children) == ["FINISHED"] * 4
    for run in children:
        tags = run.data.tags
        seed = int(tags["seed"])
        assert tags["harness.pack"] == f"{number[(CELLS[0], seed)]},{number[(CELLS[1], seed)]}"
        assert any(v.startswith("vLLM engine") for v in tags.values()), tags
        rewards = client.get_metric_history(run.info.run_id, "objective/reward")
        assert sorted(m.step for m in rewards) == [0, 1, 2]
    assert (results / "engine" / "report.md").exists()
