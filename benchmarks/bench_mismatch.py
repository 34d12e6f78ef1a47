"""What measuring the training–inference mismatch costs a PPO step (``rollout.measure_mismatch``).

The real training loop (``harness.run.loop.run``) runs with the measurement on, and the probe's
two calls (``MismatchProbe.snapshot`` after sampling: the learner forward of the behaviour
snapshot, under staleness only; ``MismatchProbe.measure`` after the update: the ``mismatch/*``
metrics from the update's own first forward) are timed inside it by a wrapper. A second row per
shape times what the first design did, one extra no-grad learner forward of the whole batch
(``MismatchProbe.learner_logprobs``), on the same run's batches. Reported per shape: the median over steps of that time, the median ``perf/step_time``,
and their ratio. Reference: the step time of the same run (which includes the measurement, so the
ratio is its share of the step). Shapes: the default ``RunConfig`` (8 prompts x 4 samples, 12 new
tokens, one optimizer step) and the default experiment's (16 x 8, 10 new tokens, 4 epochs x 4
minibatches); the tiny model, no warm start (a random policy seldom emits EOS, so rows run to
max_new_tokens: the largest forward), evaluation off, one thread, float32, no recompute. A
staleness-1 row adds the snapshot forward.

    .venv/bin/python benchmarks/bench_mismatch.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

import harness.run.mismatch as mm  # noqa: E402
from harness.config import build_run_config  # noqa: E402
from harness.run.loop import run  # noqa: E402

CMD = ".venv/bin/python benchmarks/bench_mismatch.py"
STEPS = 30
WARMUP = 3

SHAPES: dict[str, dict[str, Any]] = {
    "default RunConfig": {},
    "default experiment (experiments/default.yaml)": {
        "rollout": {"prompts_per_step": 16, "n_samples": 8, "max_new_tokens": 10},
        "ppo": {"ppo_n_minibatches": 4, "ppo_epochs": 4},
    },
    "default RunConfig, staleness 1": {"rollout": {"staleness": 1}},
}


def timed_run(over: dict[str, Any]) -> tuple[float, float, float]:
    """Medians over the measured steps: ms the probe took, ms an extra whole-batch forward
    takes, and the step's ms without that extra forward."""
    spent: list[float] = []
    extra: list[float] = []
    step_spent = [0.0]
    orig_measure, orig_snapshot = mm.MismatchProbe.measure, mm.MismatchProbe.snapshot

    def measure(self, model, rb, *a, **kw):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = orig_measure(self, model, rb, *a, **kw)
        spent.append(step_spent[0] + time.perf_counter() - t)
        step_spent[0] = 0.0
        t = time.perf_counter()
        self.learner_logprobs(model, rb)  # the alternative: one more forward of the batch
        extra.append(time.perf_counter() - t)
        return out

    def snapshot(self, *a, **kw):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = orig_snapshot(self, *a, **kw)
        step_spent[0] += time.perf_counter() - t
        return out

    mm.MismatchProbe.measure, mm.MismatchProbe.snapshot = measure, snapshot  # type: ignore[method-assign]
    try:
        cfg = build_run_config(
            {
                "steps": STEPS + WARMUP,
                "warm_start": {"steps": 0},
                "eval": {"every": 0, "n_prompts": 4},
                "threads": 1,
                **over,
            }
        )
        res = run(cfg)
    finally:
        mm.MismatchProbe.measure, mm.MismatchProbe.snapshot = orig_measure, orig_snapshot  # type: ignore[method-assign]
    assert res.status == "completed", res.reason
    # The last step also runs the final evaluation, outside perf/step_time: drop it.
    # The extra forward ran inside the step's timer: take it back out of the step time.
    steps = [t - e for t, e in zip(res.history["perf/step_time"], extra, strict=True)][WARMUP:-1]
    ms = 1000.0
    return (
        statistics.median(spent[WARMUP:-1]) * ms,
        statistics.median(extra[WARMUP:-1]) * ms,
        statistics.median(steps) * ms,
    )


def main() -> None:
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    rows = []
    for name, over in SHAPES.items():
        probe_ms, extra_ms, step_ms = timed_run(over)
        rows.append(
            f"| {name} | {probe_ms:.2f} | **{100 * probe_ms / step_ms:.1f} %** | "
            f"{extra_ms:.1f} ({100 * extra_ms / step_ms:.0f} %) | {step_ms:.1f} |"
        )
        print(rows[-1], flush=True)
    body = (
        f"Command: `{CMD}` (one thread).  The real loop, {STEPS} measured steps after {WARMUP} "
        "warm-up steps (the last step, which runs the final evaluation, left out); the probe's "
        "calls are timed inside it.  Tiny model, float32, no warm start, evaluation off, "
        "`ppo.recompute_logprob: false`: the metrics reuse the update's first forward (with "
        "recompute or the decoupled loss, the actor's recompute); under staleness the "
        "snapshot's learner forward is the one extra pass.  "
        "Reference: the median step time of the same run.  "
        f"1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after.\n\n"
        "| shape | mismatch measurement (ms/step) | share of the step | an extra whole-batch "
        "forward instead, ms (share) | step (ms) |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )
    record("Mismatch measurement: cost per PPO step", body)


if __name__ == "__main__":
    main()
