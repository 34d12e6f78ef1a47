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
from typer.testing import CliRunner

from harness.cli import app
from harness.model.engine_support import engine_installed
from tests.support.packing import assert_one_pack_per_seed, lora_base, lora_grid

pytest.importorskip("peft")
optuna.logging.set_verbosity(optuna.logging.WARNING)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
    ),
]


def test_a_packed_engine_grid_completes_every_cell_seed_exactly_once(tmp_path: Path):
    """A 2-cell x 2-seed LoRA grid with the engine, 2 cells per worker, one worker (one engine
    at a time on the shared cores): two packs (the seed is a base field), every (cell, seed)
    complete once, each child run finished, tagged with its pack and sampled by the engine."""
    exp = lora_grid(tmp_path, "engine", lora_base(engine=True), seeds=2)
    results = tmp_path / "results"
    args = ["ablate", str(exp), "--results-dir", str(results)]
    r = CliRunner().invoke(app, [*args, "--workers", "1", "--cells-per-worker", "2"])
    assert r.exit_code == 0, r.output

    _, client, children = assert_one_pack_per_seed(results, "engine")
    for run in children:
        tags = run.data.tags
        assert any(v.startswith("vLLM engine") for v in tags.values()), tags
        rewards = client.get_metric_history(run.info.run_id, "objective/reward")
        assert sorted(m.step for m in rewards) == [0, 1, 2]
    assert (results / "engine" / "report.md").exists()
