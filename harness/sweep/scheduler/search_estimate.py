"""The wall-time estimate `harness search --dry-run` states before launch.

A search runs ``n_trials`` points of ``seeds`` runs each, but which points TPE samples is not
known before it runs.  What a point costs depends only on the searched fields that change a
run's cost (:data:`harness.sweep.scheduler.estimate.COST_KEYS`: sizes, passes, the model...; and
the warm start's length):

* none of them searched: every point has the base's shape, and one probe run times them all;
* otherwise each such field is probed at each end of its range (each choice), the others at
  their low ends: the cheapest and the costliest probe bound what one run of a point costs
  (a point setting two such fields high at once can cost more: the estimate says so).

How many seeds a point runs is bounded by how the search stops points:

    high: every point at every seed (the racing plan's max);
    low:  racing: every point at the plan's min;  median pruner: the first 4 points at every
          seed (it prunes nothing before 4 have finished), the rest at one;  wilcoxon: every
          point at 2 (its first test);  no pruner: every point at every seed.

The runs' sum is spread over the workers as a grid's is (``estimate_wall_time``), with one setup
per pack of ``--cells-per-worker`` points and one warm start per seed, shared through the cache
unless a searched field changes it; the once-per-sweep parts are measured as for a grid.
"""

from __future__ import annotations

import math
from typing import Any

from harness.config.experiment import ExperimentSpec
from harness.config.schema import RunConfig
from harness.sweep.scheduler.estimate import (
    COST_KEYS,
    WARM_KEYS,
    RunCosts,
    SweepCosts,
    WallTimeEstimate,
    idle_wait_s,
    run_seconds,
    wall_time_text,
)
from harness.sweep.scheduler.trials import MEDIAN_STARTUP_POINTS, WILCOXON_STARTUP_SEEDS

# What a point's runs cost depends on: their shape, and their warm start's length.
PROBED_KEYS = (*COST_KEYS, "warm_start")


def _under(path: str, keys: tuple[str, ...]) -> bool:
    return any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in keys)


def _ends(p: Any) -> list[Any]:
    """The values of a search parameter that bound it: each choice, or both ends of the range."""
    if p.type == "categorical":
        return list(p.choices)
    return [p.low, p.high]


def probe_points(spec: ExperimentSpec) -> dict[str, dict[str, Any]]:
    """label -> overrides: the points whose runs bound what a point costs (module docstring).
    The first is every searched field at its low end (its first choice)."""
    assert spec.search is not None
    low = {p.path: _ends(p)[0] for p in spec.search.params}
    points = {"search low ends": low}
    probed = cost_fields(spec)
    for p in spec.search.params:
        if p.path not in probed:
            continue
        for value in _ends(p)[1:]:
            points[f"{p.path}={value}"] = {**low, p.path: value}
    return points


def cost_fields(spec: ExperimentSpec) -> list[str]:
    """The searched fields that change a run's cost."""
    assert spec.search is not None
    return [p.path for p in spec.search.params if _under(p.path, PROBED_KEYS)]


def seeds_range(spec: ExperimentSpec) -> tuple[float, int]:
    """(the mean seeds a point runs at the fewest, the most seeds a point runs)."""
    assert spec.search is not None
    n = spec.search.n_trials
    if spec.adaptive is not None:
        return float(spec.adaptive["min"]), int(spec.adaptive["max"])
    most = len(spec.seeds)
    pruner = spec.search.pruner
    if pruner == "median":
        full = min(n, MEDIAN_STARTUP_POINTS)
        return (full * most + (n - full) * min(1, most)) / n, most
    if pruner == "wilcoxon":
        return float(min(WILCOXON_STARTUP_SEEDS, most)), most
    return float(most), most


def estimate_search_wall_time(
    spec: ExperimentSpec,
    workers: int,
    probed: dict[str, tuple[RunConfig, RunCosts]],
    sweep: SweepCosts,
    k: int = 1,
) -> WallTimeEstimate:
    """The search ``spec`` run by ``workers`` workers at ``k`` points per worker, from its
    :func:`probe_points`' configs and measured costs ``probed`` (label -> (cfg, costs)).
    ``runs``: the runs at the most seeds."""
    assert spec.search is not None and probed
    n = spec.search.n_trials
    run = {label: run_seconds(cfg, c) for label, (cfg, c) in probed.items()}
    warm = {label: cfg.warm_start.steps * c.sft_step_s for label, (cfg, c) in probed.items()}
    cheap = min(probed, key=lambda label: run[label] + warm[label])
    dear = max(probed, key=lambda label: run[label] + warm[label])
    searched_warm = any(_under(p.path, WARM_KEYS) for p in spec.search.params)
    low_seeds, high_seeds = seeds_range(spec)
    workers = max(1, workers)

    def runs_s(label: str, seeds: float) -> float:
        setup = probed[label][1].setup_s
        # A pack of k points pays one setup per seed.
        total = n * seeds * (run[label] - setup) + math.ceil(n / k) * seeds * setup
        # The warm start: once per seed (the cache shares it) unless a searched field changes it.
        total += (n if searched_warm else 1) * math.ceil(seeds) * warm[label]
        return max(total / workers, run[label] + warm[label])

    idle_s = idle_wait_s(spec, workers, run[dear])
    fixed = sweep.total_s + idle_s
    costs = {label: c for label, (_, c) in probed.items()}
    cfgs = [cfg for cfg, _ in probed.values()]
    return WallTimeEstimate(
        low_s=fixed + runs_s(cheap, low_seeds),
        high_s=fixed + runs_s(dear, high_seeds),
        step_s={label: c.step_s for label, c in costs.items()},
        probes=len(probed),
        warm_start_steps=max(cfg.warm_start.steps for cfg in cfgs),
        setup_s=max(c.setup_s for c in costs.values()),
        eval_s=max(c.eval_s for c in costs.values()),
        tracker_s=max(c.tracker_s + spec.steps * c.log_s for c in costs.values()),
        trial_s=max(c.trial_s for c in costs.values()),
        runs=n * high_seeds,
        runs_s=runs_s(dear, high_seeds),
        idle_s=idle_s,
        sweep=sweep,
        packed=k,
    )


def search_estimate_text(spec: ExperimentSpec, est: WallTimeEstimate, workers: int) -> str:
    """The search dry run's estimate: the range and what bounds each end, the runs' parts, what
    the sweep spends once, and how it was measured (:func:`wall_time_text`)."""
    assert spec.search is not None
    low_seeds, _ = seeds_range(spec)
    fewest = spec.search.n_trials * low_seeds
    fields = cost_fields(spec)
    if fields:
        measured = (
            f"measured on this machine by {est.probes} probe run(s): {', '.join(fields)} at "
            "each end, the other fields at their low ends; a point setting several of them "
            "high at once may cost more"
        )
    else:
        measured = (
            "measured on this machine by 1 probe run: no searched field changes what a run costs"
        )
    return wall_time_text(
        est,
        workers,
        low=_low_why(spec)
        + ("" if len(est.step_s) == 1 else ", each as cheap as the cheapest probe"),
        high="every point at every seed"
        + ("" if len(est.step_s) == 1 else ", each as costly as the costliest probe"),
        runs=f"{round(fewest)}-{est.runs}" if fewest < est.runs else str(est.runs),
        measured=measured,
    )


def _low_why(spec: ExperimentSpec) -> str:
    assert spec.search is not None
    if spec.adaptive is not None:
        return f"every point raced out at {spec.adaptive['min']} seeds"
    if spec.search.pruner == "median":
        return f"every point after the first {MEDIAN_STARTUP_POINTS} pruned at its first seed"
    if spec.search.pruner == "wilcoxon":
        return f"every point pruned at its first test, after {WILCOXON_STARTUP_SEEDS} seeds"
    return "every point at every seed"
