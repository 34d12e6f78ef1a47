"""Ray launcher overhead per trial, against local worker processes, on the same sweep.

Reference: the same 4 trials (experiments/smoke.yaml, 2 cells x 2 seeds) run by ONE worker under
the local launcher.  For each launcher, the span from the first trial's start event to the last
trial's done event, minus each trial's recorded wall time (training plus its MLflow run, the same
code under both launchers), is what the launcher adds between trials (claim, tell, event
transport; for Ray the actor round trips); startup (process spawn, Ray connect) is reported
separately because it is paid once per sweep, not per trial.

    orchestration per trial           = (span - training time of the runs) / trials
    overhead per trial (Ray vs local) = orchestration_ray - orchestration_local
    share of trial wall time          = that / mean training time of a trial

Goal: <= 5 % at the default trial length.  Ray runs on a private loopback head (2 CPUs).

    .venv/bin/python benchmarks/bench_launchers.py [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _record import record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def sweep(launcher: Any, exp: Path, results: Path) -> dict[str, float]:
    from harness.config.experiment import load_experiment
    from harness.sweep.launching.launch import run_workers
    from harness.sweep.launching.worker import WorkerOptions
    from harness.sweep.scheduler.study import enqueue_missing, open_study
    from harness.sweep.stores.storage import make_storage
    from harness.tracking import make_tracker

    study, spec = open_study(
        load_experiment(exp),
        storage=make_storage(None, results),
        tracker=make_tracker(None, results),
        study_name=None,
        tracking_uri=None,
        command="bench",
    )
    enqueue_missing(study, spec)
    times: dict[str, list[float]] = {"start": [], "done": []}

    def on_event(e: dict[str, Any]) -> None:
        if e["event"] in times:
            times[e["event"]].append(time.perf_counter())

    t0 = time.perf_counter()
    counts = run_workers(
        launcher,
        1,
        WorkerOptions(study=study.study_name, storage=None, results_dir=results),
        total=spec.expected_trials,
        done_before=0,
        on_event=on_event,
        show_progress=False,
    )
    total = time.perf_counter() - t0
    assert counts["completed"] == spec.expected_trials, counts
    train = sum(float(t.user_attrs["wall_time"]) for t in study.get_trials())
    span = times["done"][-1] - times["start"][0]
    return {
        "total": total,
        "startup": times["start"][0] - t0,
        "span": span,
        "train": train,
        "trials": float(spec.expected_trials),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    from ray_head import PrivateRayHead

    from harness.sweep.launching.launch import make_launcher

    os.environ["RAY_AUTH_MODE"] = "disabled"
    work = Path(tempfile.mkdtemp(prefix="bench-launchers-"))
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    out: dict[str, dict[str, float]] = {}
    head = PrivateRayHead(num_cpus=2)
    head.start()
    try:
        for name in ("local", "ray"):
            doc.update(name=f"bench-{name}", steps=args.steps)
            exp = work / f"{name}.yaml"
            exp.write_text(yaml.safe_dump(doc))
            launcher = make_launcher(name, ray_address=head.address if name == "ray" else None)
            out[name] = sweep(launcher, exp, work / name)
    finally:
        head.stop()
    n = out["local"]["trials"]
    per_trial_train = out["local"]["train"] / n
    rows = []
    # Like with like: each launcher's orchestration time (span minus its own training time), so
    # that training slowed by other load on the machine does not count as launcher overhead.
    orch = {k: (m["span"] - m["train"]) / n for k, m in out.items()}
    extra = orch["ray"] - orch["local"]
    share = extra / per_trial_train
    for name, m in out.items():
        rows.append(
            f"| {name} | {m['startup']:.1f} | {m['span']:.1f} | {m['train']:.1f} | {orch[name]:.3f} |"
        )
    load = os.getloadavg()[0]
    body = "\n".join(
        [
            f"Command: `.venv/bin/python benchmarks/bench_launchers.py --steps {args.steps}` "
            f"(4 trials of experiments/smoke.yaml, 1 worker; Ray on a private 2-CPU loopback "
            f"head). Load average when it finished: {load:.1f}.",
            "",
            "| launcher | startup s | first start -> last done s | training s | orchestration s/trial |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Ray overhead per trial vs local: {extra:+.3f} s = {100 * share:+.1f} % of a "
            f"{per_trial_train:.1f} s trial (goal <= 5 % at the default trial length, which is "
            "longer, so the share there is smaller). Startup (Ray connect, process spawn) is "
            "paid once per sweep.",
        ]
    )
    print(body)
    if not args.no_record:
        record("Ray launcher overhead per trial", body)


if __name__ == "__main__":
    main()
