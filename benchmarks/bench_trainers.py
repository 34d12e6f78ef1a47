"""Both trainers on the same cell: per-step time, and learning curves on the default run config.

* **Per-step time**: ``harness.run.trainers.train`` with ``trainer: harness`` and ``trainer: trl`` on
  one cell (the default run config's model, task and batch: 16 prompts × 8 samples, 10 new tokens,
  4 minibatches × 1 epoch, GRPO group normalization, no adv_norm, no warm start, no eval); the
  median of each trainer's own ``perf/step_time`` after the warm-up steps.  Both times cover
  sampling, scoring, advantages, every optimizer step and the per-step metrics; TRL's also covers
  its Trainer bookkeeping (data loader, logging) — what a user of either trainer waits for.
* **Learning curves**: ``experiments/run-default.yaml`` (300-step warm start, 200 steps) with
  ``ppo.adv_norm: null`` (TRL cannot express it), both trainers, ``--seeds`` seeds each; held-out
  greedy reward (``eval/reward``, every 25 steps) and the sampled reward (``objective/reward``,
  mean of 25-step windows), mean over seeds.

    .venv/bin/python benchmarks/bench_trainers.py [--steps 20] [--seeds 2] [--threads 1] [--jobs 4]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

from harness.config import build_run_config, load_yaml  # noqa: E402
from harness.run.trainers import train  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Trainers: harness PPO loop vs TRL GRPOTrainer (trainer: trl)"


def step_times(trainer: str, steps: int, warmup: int, threads: int) -> tuple[float, float]:
    cfg = build_run_config(
        load_yaml(ROOT / "experiments" / "run-default.yaml"),
        {
            "trainer": trainer,
            "steps": steps,
            "threads": threads,
            "warm_start.steps": 0,
            "ppo.adv_norm": None,
            "eval.every": 0,
            "eval.n_prompts": 1,
        },
    )
    with tempfile.TemporaryDirectory() as d:
        res = train(cfg, results_dir=d)
    assert res.status == "completed", res.reason
    t = res.history["perf/step_time"][warmup:]
    r = res.history["perf/rollout_time"][warmup:]
    return statistics.median(t), statistics.median(r)


def _curve(args: tuple[str, int, int, str]) -> dict[str, list[float]]:
    trainer, seed, threads, results_dir = args
    warnings.filterwarnings("ignore")
    cfg = build_run_config(
        load_yaml(ROOT / "experiments" / "run-default.yaml"),
        {"trainer": trainer, "seed": seed, "threads": threads, "ppo.adv_norm": None},
    )
    res = train(cfg, results_dir=results_dir)
    assert res.status == "completed", res.reason
    rw = res.history["objective/reward"]
    return {
        "eval/reward": [v for v in res.history["eval/reward"] if math.isfinite(v)],
        "objective/reward": [statistics.mean(rw[i : i + 25]) for i in range(0, len(rw), 25)],
    }


def curves(seeds: int, threads: int, results_dir: str, jobs: int) -> dict[str, dict]:
    """Both trainers' curves, mean over seeds; the runs go to ``jobs`` processes (warm starts
    first, one per seed, so the cache is written once)."""
    from concurrent.futures import ProcessPoolExecutor

    args = [(t, s, threads, results_dir) for t in ("harness", "trl") for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        first = list(pool.map(_curve, args[:seeds]))
        out = first + list(pool.map(_curve, args[seeds:]))
    res: dict[str, dict] = {}
    for i, t in enumerate(("harness", "trl")):
        runs = out[i * seeds : (i + 1) * seeds]
        res[t] = {
            k: [statistics.mean(col) for col in zip(*(r[k] for r in runs), strict=True)]
            for k in ("eval/reward", "objective/reward")
        }
    return res


def curve_tables(ch: dict, ct: dict, seeds: int) -> str:
    rows = "\n".join(
        f"| {25 * (i + 1)} | {x:.3f} | {y:.3f} |"
        for i, (x, y) in enumerate(zip(ch["eval/reward"], ct["eval/reward"], strict=True))
    )
    wins = "\n".join(
        f"| {25 * i}–{25 * i + 24} | {x:.3f} | {y:.3f} |"
        for i, (x, y) in enumerate(zip(ch["objective/reward"], ct["objective/reward"], strict=True))
    )
    return f"""**Learning curves**, {seeds} seed(s) per trainer (same warm start and prompts), mean over seeds.

Held-out greedy reward (`eval/reward`, 64 prompts):

| step | harness | TRL |
|---|---|---|
{rows}

Sampled reward (`objective/reward`, mean of each 25-step window):

| steps | harness | TRL |
|---|---|---|
{wins}
"""


def curves_from_study(study: str, results_dir: str) -> str:
    """Mean curves per trainer from a finished study whose grid has a ``trainer`` axis."""
    import optuna

    from harness.sweep.scheduler.results import load_study_data
    from harness.sweep.stores.storage import make_storage
    from harness.tracking import make_tracker

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.load_study(study_name=study, storage=make_storage(None, Path(results_dir)))
    tracker = make_tracker(None, Path(results_dir))
    data = load_study_data(st, tracker)
    by: dict[str, dict[str, list[list[float]]]] = {}
    for r in data.runs:
        if r.status != "completed" or r.run_id is None:
            continue
        t = data.cells[r.cell]["trainer"]
        d = by.setdefault(t, {"eval/reward": [], "objective/reward": []})
        evals = sorted(tracker.get_metric_history(r.run_id, "eval/reward"))
        d["eval/reward"].append([v for _, v in evals])
        rw = [v for _, v in sorted(tracker.get_metric_history(r.run_id, "objective/reward"))]
        d["objective/reward"].append(
            [statistics.mean(rw[i : i + 25]) for i in range(0, len(rw), 25)]
        )
    mean = {
        t: {k: [statistics.mean(c) for c in zip(*v, strict=True)] for k, v in d.items()}
        for t, d in by.items()
    }
    n = min(len(d["eval/reward"]) for d in by.values())
    head = (
        f"Learning curves from study `{study}` (`experiments/findings/trl-vs-harness.yaml`: "
        f"run-default's model, task, batch and warm start, 4 minibatches × 2 epochs at lr 1e-3, "
        f"no adv_norm), {n} completed seeds per trainer.\n\n"
    )
    return head + curve_tables(mean["harness"], mean["trl"], n).split("\n", 1)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="processes for the learning curves")
    ap.add_argument("--no-curves", action="store_true", help="per-step time only")
    ap.add_argument(
        "--curves-from-study",
        metavar="STUDY",
        help="take the learning curves from a finished study of both trainers (its MLflow "
        "histories under --results-dir) instead of training run-default again",
    )
    ap.add_argument("--results-dir", default="results/findings")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    h, h_roll = step_times("harness", a.steps, a.warmup, a.threads)
    t, t_roll = step_times("trl", a.steps, a.warmup, a.threads)
    print(
        f"step: harness {h * 1e3:.0f} ms (sampling {h_roll * 1e3:.0f}) | TRL {t * 1e3:.0f} ms "
        f"(generation {t_roll * 1e3:.0f}) | harness/TRL {h / t:.2f}",
        flush=True,
    )
    curve_text = ""
    if a.curves_from_study:
        curve_text = curves_from_study(a.curves_from_study, a.results_dir)
    elif not a.no_curves:
        with tempfile.TemporaryDirectory() as d:
            both = curves(a.seeds, a.threads, d, a.jobs)
        curve_text = curve_tables(both["harness"], both["trl"], a.seeds)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    print(curve_text)
    cmd = (
        f"`.venv/bin/python benchmarks/bench_trainers.py --steps {a.steps} --warmup {a.warmup} "
        f"--threads {a.threads}"
        + (
            f" --curves-from-study {a.curves_from_study} --results-dir {a.results_dir}"
            if a.curves_from_study
            else " --no-curves"
            if a.no_curves
            else f" --seeds {a.seeds} --jobs {a.jobs}"
        )
        + "`"
    )
    body = f"""Command: {cmd} ({wall:.0f} s; 1-min load average {load0:.1f} before, {load1:.1f} after — the 2 cores were shared with other work, so read the ratio, not the absolute times).

**Per-step time** (same cell: run-default's 16 prompts × 8 samples, 10 new tokens, 4 minibatches, GRPO
normalization, no adv_norm; median of each trainer's own `perf/step_time` over steps {a.warmup}–{a.steps - 1}, evaluation excluded):

| trainer | ms / step | of which sampling | harness / TRL |
|---|---|---|---|
| harness (`trainer: harness`) | {h * 1e3:.0f} | {h_roll * 1e3:.0f} | {h / t:.2f} |
| TRL GRPOTrainer (`trainer: trl`) | {t * 1e3:.0f} | {t_roll * 1e3:.0f} | 1 |

{curve_text}
"""
    if not a.no_record:
        record(SECTION, body)


if __name__ == "__main__":
    main()
