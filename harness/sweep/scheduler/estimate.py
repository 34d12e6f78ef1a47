"""The wall-time estimate `harness ablate --dry-run` states before launch.

    wall ≈ Σ_cells seeds × steps × t_step(shape of the cell) / workers

``t_step`` is measured on this machine: one short probe run (two training steps, no warm start,
no evaluation, in a scratch directory) per distinct *shape*, the settings that change what a
step costs (model, rollout sizes, update passes, critic, trainer, device); cells that differ only
in a clip range or a coefficient share one probe. The faster of the two steps is taken, so the
first step's one-time costs do not count. An adaptive plan gives a range: every cell stopping
at its first look (``min`` seeds) up to every cell running ``max``. Each run's setup, warm start
and evaluations come on top and are not in the estimate (the dry run says so).
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass, replace
from typing import Any

from harness.config.experiment import ExperimentSpec
from harness.config.schema import RunConfig
from harness.core.configtools import to_dict
from harness.run.trainers import train
from harness.sweep.scheduler.spec import StudySpec

# What a training step's cost depends on (dotted prefixes of the run config).
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
)


@dataclass(frozen=True)
class WallTimeEstimate:
    low_s: float  # every cell at its fewest seeds (the first look of an adaptive plan)
    high_s: float  # every cell at its most seeds
    step_s: dict[str, float]  # measured seconds per step, by cell label
    probes: int  # distinct shapes probed
    warm_start_steps: int  # supervised steps per seed, not in the estimate


def shape_key(cfg: RunConfig) -> str:
    """The values of :data:`COST_KEYS` in ``cfg``, as one comparable string."""
    data = to_dict(cfg)
    picked = {}
    for key in COST_KEYS:
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        picked[key] = node
    return json.dumps(picked, sort_keys=True, default=str)


def probe_step_seconds(cfg: RunConfig) -> float:
    """Seconds per training step of ``cfg`` on this machine: the faster of two steps of a run
    without warm start or evaluation, in a scratch directory (nothing is written elsewhere)."""
    probe = replace(
        cfg,
        steps=2,
        warm_start=replace(cfg.warm_start, steps=0),
        # the final evaluation runs whatever `every` says: one prompt keeps it out of the way
        eval=replace(cfg.eval, every=0, n_prompts=1, samples=0, k=1),
    )
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="harness-probe-") as tmp, warnings.catch_warnings():
        # The dry run states inert clipping itself, per cell (present.display.inert_clip_lines);
        # the probe's copy of the run's warning would be a raw Python warning line.
        warnings.filterwarnings("ignore", message="clipping is inert", category=UserWarning)
        train(
            probe,
            on_metrics=lambda _s, m: times.append(float(m.get("perf/step_time", float("nan")))),
            results_dir=tmp,
        )
    finite = [t for t in times if t == t]
    if not finite:
        raise RuntimeError("the probe run logged no perf/step_time")
    return min(finite)


def estimate_wall_time(
    spec: ExperimentSpec, workers: int, probe: Any = probe_step_seconds
) -> WallTimeEstimate:
    """:class:`WallTimeEstimate` of the grid ``spec`` run by ``workers`` workers; ``probe`` maps
    a RunConfig to seconds per step (measured once per distinct shape)."""
    study = StudySpec.from_experiment(spec)
    seed = spec.seeds[0]
    measured: dict[str, float] = {}
    step_s: dict[str, float] = {}
    warm = 0
    for cell in spec.cells:
        cfg = study.cell_config(cell.label, seed)
        warm = max(warm, cfg.warm_start.steps)
        key = shape_key(cfg)
        if key not in measured:
            measured[key] = float(probe(cfg))
        step_s[cell.label] = measured[key]
    if spec.adaptive is not None:
        low_seeds, high_seeds = spec.adaptive["min"], spec.adaptive["max"]
    else:
        low_seeds = high_seeds = len(spec.seeds)
    per_seed = sum(step_s.values()) * spec.steps
    workers = max(1, workers)
    return WallTimeEstimate(
        low_s=per_seed * low_seeds / workers,
        high_s=per_seed * high_seeds / workers,
        step_s=step_s,
        probes=len(measured),
        warm_start_steps=warm,
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
    measured = (
        f"{steps[0]:.2f} s per step"
        if len(steps) == 1
        else f"{steps[0]:.2f}-{steps[-1]:.2f} s per step"
    )
    return (
        f"estimated wall time with {workers} worker(s): {span} of training steps "
        f"({measured}, measured on this machine by {est.probes} probe run(s) of 2 steps); "
        f"each run's setup, warm start ({est.warm_start_steps} steps) and evaluations come on top"
    )
