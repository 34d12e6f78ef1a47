"""The wall-time estimate `harness ablate --dry-run` states before launch.

A sweep's wall is its runs' walls spread over the workers, plus each worker's start:

    run_s   = setup_s + steps × step_s + evals × eval_s
    warm_s  = warm_start.steps × sft_step_s, once per seed and warm-start key (the cache shares it)
    wall    ≈ start_s + max(Σ (run_s + warm_s) / workers, the longest run with its warm start)

Every term is measured on this machine, not modelled: one short probe run per distinct *shape*
(the settings that change what a run costs: model, rollout sizes, update passes, critic, trainer,
sampler, evaluation, device), in a scratch directory, with two training steps, up to
:data:`PROBE_WARM_STEPS` supervised warm-start steps and the cell's own evaluation.  From its
timeline:

* ``step_s``: the faster of the two steps (the first carries one-time costs);
* ``eval_s``: the final evaluation (the time between the second step's end and its record);
* ``sft_step_s``: the warm start's own seconds over its steps;
* ``setup_s``: everything else: model build, the engine's start, the start evaluation, the first
  step's one-time costs, the close.

``start_s`` is the import of the training stack by a fresh interpreter, as each worker does once.
Cells that differ only in a clip range or a coefficient share one probe.  An adaptive plan gives a
range: every cell stopping at its first look (``min`` seeds) up to every cell running ``max``.
What is left out, and said: the tracker's and the study store's writes, and the report.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.config.experiment import ExperimentSpec
from harness.config.schema import RunConfig
from harness.core.configtools import to_dict
from harness.run.trainers import train
from harness.sweep.scheduler.spec import StudySpec

# What a run's cost depends on (dotted prefixes of the run config).
COST_KEYS = (
    "model",
    "tiny",
    "model_options",
    "trainer",
    "device",
    "threads",
    "task",
    "task_options",
    "rollout.prompts_per_step",
    "rollout.n_samples",
    "rollout.max_new_tokens",
    "rollout.staleness",
    "rollout.sampler_dtype",
    "rollout.sampler_backend",
    "rollout.zero_variance_filter",
    "rollout.max_resample_rounds",
    "ppo.ppo_epochs",
    "ppo.ppo_n_minibatches",
    "ppo.recompute_logprob",
    "ppo.prox_logp_method",  # loglinear skips the recompute forward
    "ppo.kl_ctl",
    "critic.enabled",
    "eval.n_prompts",
    "eval.samples",
    "eval.k",
    "warm_start.batch_size",
)

# What makes two cells of one seed share a warm start (the cache key's inputs, coarsely).
WARM_KEYS = ("model", "tiny", "model_options", "task", "task_options", "warm_start")

# Supervised steps a probe takes to time one: enough to pass the first step's one-time costs.
PROBE_WARM_STEPS = 3

# The bound on timing a worker's imports: past it the estimate counts what it waited.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunCosts:
    """Measured seconds of one shape's run parts (see the module docstring)."""

    step_s: float
    setup_s: float = 0.0
    eval_s: float = 0.0
    sft_step_s: float = 0.0


@dataclass(frozen=True)
class WallTimeEstimate:
    low_s: float  # every cell at its fewest seeds (the first look of an adaptive plan)
    high_s: float  # every cell at its most seeds
    step_s: dict[str, float]  # measured seconds per training step, by cell label
    probes: int  # distinct shapes probed
    warm_start_steps: int  # the most supervised steps a seed's warm start takes
    start_s: float = 0.0  # a worker's start (the training stack's import)
    setup_s: float = 0.0  # the most any run spends outside its steps, evaluations and warm start
    eval_s: float = 0.0  # the most one evaluation takes
    warm_s: float = 0.0  # all warm starts of the most seeds, together
    steps_s: float = 0.0  # all training steps of the most seeds, together


def _picked(cfg: RunConfig, keys: tuple[str, ...]) -> str:
    data = to_dict(cfg)
    picked = {}
    for key in keys:
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        picked[key] = node
    return json.dumps(picked, sort_keys=True, default=str)


def shape_key(cfg: RunConfig) -> str:
    """The values of :data:`COST_KEYS` in ``cfg``, as one comparable string."""
    return _picked(cfg, COST_KEYS)


def evals_per_run(cfg: RunConfig) -> int:
    """Greedy evaluations a run of ``cfg`` makes: the start one, each ``every`` steps, the last."""
    every = cfg.eval.every
    due = {cfg.steps - 1} | (
        {s for s in range(cfg.steps) if (s + 1) % every == 0} if every else set()
    )
    return 1 + len(due)


def probe_run(cfg: RunConfig) -> RunCosts:
    """:class:`RunCosts` of ``cfg`` on this machine, from one short real run of it in a scratch
    directory (nothing is written elsewhere)."""
    warm_steps = min(cfg.warm_start.steps, PROBE_WARM_STEPS)
    probe = replace(
        cfg,
        steps=2,
        warm_start=replace(cfg.warm_start, steps=warm_steps),
        eval=replace(cfg.eval, every=0),  # the start evaluation and the final one
    )
    marks: list[tuple[float, float]] = []  # (time of the record, the step's own seconds)

    def on_metrics(_step: int, m: dict[str, float]) -> None:
        marks.append((time.perf_counter(), float(m.get("perf/step_time", math.nan))))

    with tempfile.TemporaryDirectory(prefix="harness-probe-") as tmp, warnings.catch_warnings():
        # The dry run states inert clipping itself, per cell (present.display.inert_clip_lines);
        # the probe's copy of the run's warning would be a raw Python warning line.
        warnings.filterwarnings("ignore", message="clipping is inert", category=UserWarning)
        t0 = time.perf_counter()
        train(probe, on_metrics=on_metrics, results_dir=tmp)
        t_end = time.perf_counter()
        warm_s = _warm_start_seconds(Path(tmp) / "warmstart") if warm_steps else 0.0
    steps = [s for _, s in marks if s == s]
    if len(marks) < 2 or not steps:
        raise RuntimeError("the probe run logged no perf/step_time")
    (t1, _), (t2, s1) = marks[0], marks[1]
    step_s = min(steps)
    eval_s = max(0.0, t2 - t1 - s1)  # the final evaluation runs between step 1 and its record
    # The rest of the first record's wall: build, engine start, start evaluation (as long as the
    # final one), the first step's one-time costs; then the close after the last record.
    setup_s = max(0.0, (t1 - t0) - warm_s - step_s - eval_s) + max(0.0, t_end - t2)
    return RunCosts(
        step_s=step_s,
        setup_s=setup_s,
        eval_s=eval_s,
        sft_step_s=warm_s / warm_steps if warm_steps else 0.0,
    )


def _warm_start_seconds(cache: Path) -> float:
    """The seconds the warm start's cache record says it trained for (0 if none)."""
    total = 0.0
    for meta in cache.glob("*.json"):
        try:
            total += float(json.loads(meta.read_text()).get("result", {}).get("seconds", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return total


class WorkerStart:
    """Times a fresh interpreter importing the training stack, as each worker does once; started
    before the probes so that it overlaps them, read after."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import harness.run.loop, harness.sweep.launching.worker"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def __call__(self) -> float:
        try:
            self.proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.perf_counter() - self.t0


def estimate_wall_time(
    spec: ExperimentSpec,
    workers: int,
    probe: Callable[[RunConfig], RunCosts | float] = probe_run,
    start: Callable[[], float] | None = None,
) -> WallTimeEstimate:
    """:class:`WallTimeEstimate` of the grid ``spec`` run by ``workers`` workers; ``probe`` maps
    a RunConfig to its :class:`RunCosts` (or bare seconds per step), once per distinct shape;
    ``start`` times a worker's start (default: :class:`WorkerStart`, beside the probes)."""
    if start is None:
        start = WorkerStart()
    study = StudySpec.from_experiment(spec)
    seed = spec.seeds[0]
    measured: dict[str, RunCosts] = {}
    costs: dict[str, RunCosts] = {}
    run_s: dict[str, float] = {}
    warm_keys: dict[str, float] = {}  # a seed's distinct warm starts -> their seconds
    for cell in spec.cells:
        cfg = study.cell_config(cell.label, seed)
        key = shape_key(cfg)
        if key not in measured:
            got = probe(cfg)
            measured[key] = got if isinstance(got, RunCosts) else RunCosts(step_s=float(got))
        c = costs[cell.label] = measured[key]
        run_s[cell.label] = c.setup_s + spec.steps * c.step_s + evals_per_run(cfg) * c.eval_s
        warm_keys[_picked(cfg, WARM_KEYS)] = cfg.warm_start.steps * c.sft_step_s
    if spec.adaptive is not None:
        low_seeds, high_seeds = spec.adaptive["min"], spec.adaptive["max"]
    else:
        low_seeds = high_seeds = len(spec.seeds)
    workers = max(1, workers)
    per_seed = sum(run_s.values()) + sum(warm_keys.values())
    longest = max(run_s.values(), default=0.0) + max(warm_keys.values(), default=0.0)
    start_s = float(start()) if measured else 0.0

    def wall(seeds: int) -> float:
        return start_s + max(per_seed * seeds / workers, longest)

    return WallTimeEstimate(
        low_s=wall(low_seeds),
        high_s=wall(high_seeds),
        step_s={label: c.step_s for label, c in costs.items()},
        probes=len(measured),
        warm_start_steps=max(
            (study.cell_config(c.label, seed).warm_start.steps for c in spec.cells), default=0
        ),
        start_s=start_s,
        setup_s=max((c.setup_s for c in costs.values()), default=0.0),
        eval_s=max((c.eval_s for c in costs.values()), default=0.0),
        warm_s=sum(warm_keys.values()) * high_seeds,
        steps_s=sum(spec.steps * c.step_s for c in costs.values()) * high_seeds,
    )


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``2 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def estimate_text(est: WallTimeEstimate, workers: int) -> str:
    """The dry run's line: the estimate, how it was measured and what it leaves out."""
    span = (
        duration_text(est.high_s)
        if est.low_s == est.high_s
        else f"{duration_text(est.low_s)} (every cell decided at its first look) to "
        f"{duration_text(est.high_s)} (every cell at max seeds)"
    )
    steps = sorted(set(est.step_s.values()))
    per_step = (
        f"{steps[0]:.2f} s per step"
        if len(steps) == 1
        else f"{steps[0]:.2f}-{steps[-1]:.2f} s per step"
    )
    parts = [per_step]
    if est.setup_s:
        parts.append(f"{est.setup_s:.1f} s setup per run")
    if est.eval_s:
        parts.append(f"{est.eval_s:.1f} s per evaluation")
    if est.warm_start_steps:
        parts.append(f"warm start {est.warm_start_steps} steps per seed")
    if est.start_s:
        parts.append(f"{est.start_s:.0f} s worker start")
    return (
        f"estimated wall time with {workers} worker(s): {span} "
        f"({', '.join(parts)}; measured on this machine by {est.probes} probe run(s)); "
        "the tracker's writes and the report come on top"
    )
