"""The wall-time estimate `harness ablate --dry-run` states before launch.

A sweep's wall is its runs' walls spread over the workers, plus what it spends once:

    run_s   = setup_s + steps × (step_s + log_s) + evals × eval_s + tracker_s + trial_s
    warm_s  = warm_start.steps × sft_step_s, once per seed and warm-start key (the cache shares it)
    wall    ≈ command_s + stores_s + worker_s
              + max(Σ (run_s + warm_s) / workers, the longest run with its warm start)
              + idle_s + report_s

Every term but ``idle_s`` is measured on this machine, not modelled.  A run's parts come from
one short probe run per distinct *shape* (the settings that change what a run costs: model,
rollout sizes, update passes, critic, trainer, sampler, evaluation, device), with two training
steps, up to :data:`PROBE_WARM_STEPS` supervised warm-start steps, the cell's own evaluation and
one torch thread, as a sweep's worker gives each run.  From its timeline:

* ``step_s``: the faster of the two steps (the first carries one-time costs);
* ``eval_s``: the final evaluation (the time between the second step's end and its record);
* ``sft_step_s``: the warm start's own seconds over its steps;
* ``tracker_s``, ``log_s``: the tracker's calls (the run's start, params, config, summaries,
  tags, close; each step's metrics), timed call by call;
* ``setup_s``: everything else: model build, the engine's start, the first step's one-time costs.

``trial_s`` (the study's bookkeeping of one trial: enqueue, claim, labels, heartbeat, attributes,
tell) and the once-per-sweep parts (:class:`SweepCosts`: the command's own start, opening the
study and the tracker, a worker's start and exit, the report) are measured by the dry run on the
sweep's own code paths in a scratch directory (``harness.sweep.launching.estimating``).
``idle_s`` is counted: a worker that finds no trial left while others still run sleeps one
heartbeat interval before it looks again, so the sweep ends up to that long after its last run.
Cells that differ only in a clip range or a coefficient share one probe.  An adaptive plan gives
a range: every cell stopping at its first look (``min`` seeds) up to every cell running ``max``.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from harness.config.experiment import ExperimentSpec
from harness.config.schema import RunConfig
from harness.core.configtools import to_dict
from harness.run.scaffold import RunResult
from harness.run.tracked import tracked_run
from harness.run.trainers import train
from harness.sweep.scheduler.spec import StudySpec, heartbeat_interval_from_env
from harness.tracking import Tracker

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

# Torch threads of each run a sweep's worker starts (the driver's WorkerOptions), unless the
# run's config sets its own: the probe runs with the same.
RUN_THREADS = 1

# An adaptive grid's idle worker looks again after one tick of its wait loop, not a heartbeat.
ADAPTIVE_IDLE_S = 0.5


@dataclass(frozen=True)
class RunCosts:
    """Measured seconds of one shape's run parts (see the module docstring)."""

    step_s: float
    setup_s: float = 0.0
    eval_s: float = 0.0
    sft_step_s: float = 0.0
    tracker_s: float = 0.0  # the tracker's calls of one run, besides each step's metrics
    log_s: float = 0.0  # the tracker's call that logs one step's metrics
    trial_s: float = 0.0  # the study's bookkeeping of one trial


@dataclass(frozen=True)
class SweepCosts:
    """Measured seconds a sweep spends once, or once per worker, outside its runs."""

    command_s: float = 0.0  # the command's own start: interpreter, imports, the file's checks
    stores_s: float = 0.0  # the sweep's machinery loaded, the study and its parent run opened
    worker_s: float = 0.0  # a worker's start (spawn, the training stack's import) and exit
    report_s: float = 0.0  # the ranking and the report, with the parent run closed

    @property
    def total_s(self) -> float:
        return self.command_s + self.stores_s + self.worker_s + self.report_s


@dataclass(frozen=True)
class WallTimeEstimate:
    low_s: float  # every cell at its fewest seeds (the first look of an adaptive plan)
    high_s: float  # every cell at its most seeds
    step_s: dict[str, float]  # measured seconds per training step, by cell label
    probes: int  # distinct shapes probed
    warm_start_steps: int  # the most supervised steps a seed's warm start takes
    setup_s: float = 0.0  # the most any run spends outside its steps, evaluations and warm start
    eval_s: float = 0.0  # the most one evaluation takes
    warm_s: float = 0.0  # all warm starts of the most seeds, together
    steps_s: float = 0.0  # all training steps of the most seeds, together
    tracker_s: float = 0.0  # the most a run spends in the tracker, its steps' metrics included
    trial_s: float = 0.0  # the most one trial's bookkeeping takes
    runs: int = 0  # runs at the most seeds
    runs_s: float = 0.0  # the runs' part of high_s: their sum over the workers, or the longest
    idle_s: float = 0.0  # the wait for the last run after a worker found nothing left
    sweep: SweepCosts = SweepCosts()
    packed: int = 1  # the most runs a worker trains at once (--cells-per-worker)


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


def probe_config(cfg: RunConfig) -> RunConfig:
    """The short run that times ``cfg``: two steps, up to :data:`PROBE_WARM_STEPS` warm-start
    steps, the start and the final evaluation."""
    return replace(
        cfg,
        steps=2,
        warm_start=replace(cfg.warm_start, steps=min(cfg.warm_start.steps, PROBE_WARM_STEPS)),
        eval=replace(cfg.eval, every=0),
    )


class _TimedTracker:
    """A tracker whose every call is timed: (method, seconds) in ``calls``, in call order."""

    def __init__(self, inner: Tracker) -> None:
        self.inner = inner
        self.calls: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls.append((name, time.perf_counter() - t0))

        return timed


@dataclass(frozen=True)
class Probe:
    """A probe run: its costs, and, when a tracker recorded it, its result and run id."""

    costs: RunCosts
    result: RunResult
    run_id: str | None = None


def probe_run(cfg: RunConfig) -> RunCosts:
    """:class:`RunCosts` of ``cfg`` on this machine, from one short real run of it in a scratch
    directory, recorded nowhere."""
    return timed_probe(cfg).costs


def timed_probe(cfg: RunConfig, tracker: Tracker | None = None, **identity: Any) -> Probe:
    """:func:`probe_run`, recorded in ``tracker`` when given (``identity``: the run's
    ``tracked_run`` identity), its calls timed into ``tracker_s`` and ``log_s``."""
    probe = probe_config(cfg)
    marks: list[tuple[float, float]] = []  # (time of the record, the step's own seconds)

    def on_metrics(_step: int, m: dict[str, float]) -> None:
        marks.append((time.perf_counter(), float(m.get("perf/step_time", math.nan))))

    timed = _TimedTracker(tracker) if tracker is not None else None
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="harness-probe-") as tmp, warnings.catch_warnings():
        # The dry run states inert clipping itself, per cell (present.display.inert_clip_lines);
        # the probe's copy of the run's warning would be a raw Python warning line.
        warnings.filterwarnings("ignore", message="clipping is inert", category=UserWarning)
        t0 = time.perf_counter()
        try:
            if timed is None:
                result, rid = train(probe, on_metrics=on_metrics, results_dir=tmp), None
            else:
                result, rid = tracked_run(
                    probe, cast(Tracker, timed), on_step=on_metrics, results_dir=tmp, **identity
                )
        finally:
            torch.set_num_threads(threads)  # the probe's thread count is the run's, not ours
        t_end = time.perf_counter()
        warm_steps = probe.warm_start.steps
        warm_s = _warm_start_seconds(Path(tmp) / "warmstart") if warm_steps else 0.0
    steps = [s for _, s in marks if s == s]
    if len(marks) < 2 or not steps:
        raise RuntimeError("the probe run logged no perf/step_time")
    calls = timed.calls if timed is not None else []
    # The first call per record logs that step's metrics (tracked_run logs before it reports).
    logs = [s for name, s in calls if name == "log_metrics"][: len(marks)]
    log_s = sum(logs) / len(logs) if logs else 0.0
    tracker_s = sum(s for _, s in calls) - sum(logs)
    (t1, _), (t2, s1) = marks[0], marks[1]
    step_s = min(steps)
    # The final evaluation runs between step 1's end and its record (the record's log aside).
    eval_s = max(0.0, t2 - t1 - s1 - log_s)
    # The rest of the wall: build, engine start, the first step's one-time costs, the close.
    evals = evals_per_run(probe)
    setup_s = max(
        0.0,
        (t_end - t0) - warm_s - probe.steps * (step_s + log_s) - evals * eval_s - tracker_s,
    )
    costs = RunCosts(
        step_s=step_s,
        setup_s=setup_s,
        eval_s=eval_s,
        sft_step_s=warm_s / warm_steps if warm_steps else 0.0,
        tracker_s=tracker_s,
        log_s=log_s,
    )
    return Probe(costs=costs, result=result, run_id=rid)


def _warm_start_seconds(cache: Path) -> float:
    """The seconds the warm start's cache record says it trained for (0 if none)."""
    total = 0.0
    for meta in cache.glob("*.json"):
        try:
            total += float(json.loads(meta.read_text()).get("result", {}).get("seconds", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return total


def idle_wait_s(spec: ExperimentSpec, workers: int, run_s: float) -> float:
    """How long, on average, a sweep runs on after its last run ended: a worker that found no
    trial left while another still ran sleeps one heartbeat interval ``h`` (one tick of an
    adaptive grid's loop) before it looks again and exits.  Runs shorter than ``2h`` (mean
    ``run_s``) end inside the first sleep: ``h - run_s / 2`` on average; longer ones at a
    uniform point of a sleep: ``h / 2``.  One worker never waits."""
    if workers <= 1:
        return 0.0
    h = ADAPTIVE_IDLE_S if spec.adaptive is not None else float(heartbeat_interval_from_env())
    return max(h / 2, h - run_s / 2)


def run_seconds(cfg: RunConfig, c: RunCosts) -> float:
    """One run of ``cfg`` (its steps and evaluations) from its shape's measured costs ``c``:
    the module docstring's ``run_s``."""
    return (
        c.setup_s
        + cfg.steps * (c.step_s + c.log_s)
        + evals_per_run(cfg) * c.eval_s
        + c.tracker_s
        + c.trial_s
    )


def estimate_wall_time(
    spec: ExperimentSpec,
    workers: int,
    probe: Callable[[RunConfig, str], RunCosts | float] | None = None,
    sweep: Callable[[], SweepCosts] | SweepCosts = SweepCosts(),
    packs: list[list[str]] | None = None,
) -> WallTimeEstimate:
    """:class:`WallTimeEstimate` of the grid ``spec`` run by ``workers`` workers; ``probe`` maps
    a cell's RunConfig and label to its :class:`RunCosts` (or bare seconds per step), once per
    distinct shape (default: :func:`probe_run`, recorded nowhere); ``sweep`` gives the
    once-per-sweep costs, called after the probes (the report is timed over their runs).
    ``packs``: the cells a worker trains together, per seed (``--cells-per-worker``,
    ``harness.sweep.scheduler.packs.plan_packs``); a pack pays one setup (the base model's build
    and the process's one-time costs) and its trials' other parts in turn, on the same cores."""
    study = StudySpec.from_experiment(spec)
    seed = spec.seeds[0]
    measured: dict[str, RunCosts] = {}
    costs: dict[str, RunCosts] = {}
    run_s: dict[str, float] = {}
    warm_keys: dict[str, float] = {}  # a seed's distinct warm starts -> their seconds
    for cell in spec.cells:
        cfg = study.cell_config(cell.label, seed, threads=RUN_THREADS)
        key = shape_key(cfg)
        if key not in measured:
            got = probe(cfg, cell.label) if probe is not None else probe_run(cfg)
            measured[key] = got if isinstance(got, RunCosts) else RunCosts(step_s=float(got))
        c = costs[cell.label] = measured[key]
        run_s[cell.label] = run_seconds(cfg, c)
        warm_keys[_picked(cfg, WARM_KEYS)] = cfg.warm_start.steps * c.sft_step_s
    if spec.adaptive is not None:
        low_seeds, high_seeds = spec.adaptive["min"], spec.adaptive["max"]
    else:
        low_seeds = high_seeds = len(spec.seeds)
    workers = max(1, workers)
    groups = packs or [[c.label] for c in spec.cells]
    pack_s = [
        sum(run_s[c] - costs[c].setup_s for c in g) + max(costs[c].setup_s for c in g)
        for g in groups
    ]
    per_seed = sum(pack_s) + sum(warm_keys.values())
    longest = max(pack_s, default=0.0) + max(warm_keys.values(), default=0.0)
    once = sweep() if callable(sweep) else sweep
    mean_run = sum(pack_s) / len(pack_s) if pack_s else 0.0
    idle_s = idle_wait_s(spec, workers, mean_run)
    fixed = once.total_s + idle_s

    def runs(seeds: int) -> float:
        return max(per_seed * seeds / workers, longest)

    return WallTimeEstimate(
        low_s=fixed + runs(low_seeds),
        high_s=fixed + runs(high_seeds),
        step_s={label: c.step_s for label, c in costs.items()},
        probes=len(measured),
        warm_start_steps=max(
            (study.cell_config(c.label, seed).warm_start.steps for c in spec.cells), default=0
        ),
        setup_s=max((c.setup_s for c in costs.values()), default=0.0),
        eval_s=max((c.eval_s for c in costs.values()), default=0.0),
        warm_s=sum(warm_keys.values()) * high_seeds,
        steps_s=sum(spec.steps * c.step_s for c in costs.values()) * high_seeds,
        tracker_s=max((c.tracker_s + spec.steps * c.log_s for c in costs.values()), default=0.0),
        trial_s=max((c.trial_s for c in costs.values()), default=0.0),
        runs=len(spec.cells) * high_seeds,
        runs_s=runs(high_seeds),
        idle_s=idle_s,
        sweep=once,
        packed=max((len(g) for g in groups), default=1),
    )


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``2 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s < 1 else f"{s:.1f} s"


def estimate_text(est: WallTimeEstimate, workers: int) -> str:
    """The grid dry run's estimate (:func:`wall_time_text`)."""
    return wall_time_text(
        est,
        workers,
        low="every cell decided at its first look",
        high="every cell at max seeds",
        runs=str(est.runs),
        measured=f"measured on this machine by {est.probes} probe run(s)",
    )


def wall_time_text(
    est: WallTimeEstimate, workers: int, *, low: str, high: str, runs: str, measured: str
) -> str:
    """A dry run's estimate: a headline line (the range, with what makes its ``low`` and its
    ``high`` end), then what it adds up (the ``runs``' parts, what the sweep spends once) and
    how it was ``measured``."""
    span = (
        duration_text(est.high_s)
        if est.low_s == est.high_s
        else f"{duration_text(est.low_s)} ({low}) to {duration_text(est.high_s)} ({high})"
    )
    steps = sorted(set(est.step_s.values()))
    per_step = (
        f"{steps[0]:.2f} s per step"
        if len(steps) == 1
        else f"{steps[0]:.2f}-{steps[-1]:.2f} s per step"
    )
    parts = [per_step]
    if est.setup_s:
        parts.append(f"{_secs(est.setup_s)} setup")
    if est.eval_s:
        parts.append(f"{_secs(est.eval_s)} per evaluation")
    if est.tracker_s:
        parts.append(f"{_secs(est.tracker_s)} tracker")
    if est.trial_s:
        parts.append(f"{_secs(est.trial_s)} study bookkeeping")
    if est.warm_start_steps:
        parts.append(f"warm start {est.warm_start_steps} steps per seed")
    s = est.sweep
    once = [
        (s.command_s, "command start"),
        (s.stores_s, "study and tracker opened"),
        (s.worker_s, "worker start and exit"),
        (est.idle_s, "idle wait for the last run"),
        (s.report_s, "report"),
    ]
    lines = [
        f"estimated wall time with {workers} worker(s): {span}",
        f"  {runs} runs: {duration_text(est.runs_s)} with {workers} worker(s)"
        + (f", up to {est.packed} packed in each" if est.packed > 1 else "")
        + f" (per run: {', '.join(parts)})",
    ]
    if any(v for v, _ in once):
        lines.append("  once: " + ", ".join(f"{_secs(v)} {what}" for v, what in once if v))
    lines.append(f"  {measured}")
    return "\n".join(lines)
