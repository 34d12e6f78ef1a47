"""Sweep orchestration: its share of trial wall time, and 2 workers against 1 on 2 cores.

Reference run: the same 4 trials (2 cells x 2 seeds of experiments/default.yaml, its default
trial length of 100 steps) with `harness ablate --workers 1`.  Measured:

* orchestration cost = 1 − Σ(training-loop time of each run) / (wall time of the whole
  `harness ablate` command with 1 worker) — process start, imports, Optuna enqueue/claim/tell,
  MLflow run creation, per-step metric logging and run closing all count as orchestration;
  goal ≤ 5 %;
* throughput = wall(1 worker) / wall(2 workers); goal ≥ 1.7×.

Warm starts are trained once beforehand into a shared cache so that both sweeps do the same work.

    .venv/bin/python benchmarks/bench_sweep.py [--steps 100]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--steps", type=int, default=None, help="steps per run (default: default.yaml's)"
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    doc = yaml.safe_load((ROOT / "experiments" / "default.yaml").read_text())
    doc["name"] = "bench-sweep"
    doc["grid"] = {"ppo.c_clip": [None, 3.0]}
    doc["seeds"] = 2
    doc["baseline"] = {"ppo.c_clip": None}
    if args.steps:
        doc["steps"] = args.steps
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    exp = work / "bench.yaml"
    exp.write_text(yaml.safe_dump(doc))

    # Train the warm starts once (one per seed), then give each sweep a copy of the cache.
    warm = work / "warm"
    from harness.config import build_run_config
    from harness.train import run

    base = dict(doc["base"])
    for seed in (0, 1):
        run(build_run_config({**base, "steps": 1, "seed": seed, "threads": 1}), results_dir=warm)

    rows = {}
    for workers in (1, 2):
        results = work / f"w{workers}"
        results.mkdir()
        shutil.copytree(warm / "warmstart", results / "warmstart")
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "ablate",
                str(exp),
                "--workers",
                str(workers),
                "--results-dir",
                str(results),
                "--no-report",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - t0
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
        exp_id = client.get_experiment_by_name("bench-sweep").experiment_id
        runs = [
            r for r in client.search_runs([exp_id]) if r.data.tags.get("harness.role") == "child"
        ]
        train = sum(r.data.metrics["final/wall_time"] for r in runs)
        rows[workers] = (wall, train, len(runs))
        print(
            f"{workers} worker(s): wall {wall:.1f} s, training loops {train:.1f} s over {len(runs)} runs"
        )
    wall1, train1, n = rows[1]
    wall2, _, _ = rows[2]
    overhead = 1.0 - train1 / wall1
    speedup = wall1 / wall2
    print(
        f"orchestration share (1 worker): {overhead:.1%}   throughput 2 vs 1 workers: {speedup:.2f}x"
    )
    body = (
        f"Command: `.venv/bin/python benchmarks/bench_sweep.py{' --steps ' + str(args.steps) if args.steps else ''}`.  "
        f"{n} trials (2 cells x 2 seeds of experiments/default.yaml, {doc['steps']} steps each), warm starts "
        "pre-trained into a shared cache. Reference: the same sweep with `--workers 1`.\n\n"
        "| sweep | wall time (s) | Σ training-loop time (s) | orchestration share | throughput vs 1 worker |\n"
        "|---|---|---|---|---|\n"
        f"| `--workers 1` (reference) | {wall1:.1f} | {train1:.1f} | **{overhead:.1%}** (goal ≤ 5 %) | 1.00× |\n"
        f"| `--workers 2` | {wall2:.1f} | {rows[2][1]:.1f} | — | **{speedup:.2f}×** (goal ≥ 1.7×) |\n\n"
        "Orchestration = everything that is not the training loop: process start and imports, "
        "Optuna enqueue/claim/tell and heartbeats, MLflow run creation, batched per-step logging "
        "and closing."
    )
    if not args.no_record:
        record("Sweep orchestration and worker scaling", body)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
