"""The search dry run's measurement: the probe runs of
:func:`harness.sweep.scheduler.search_estimate.probe_points`, each recorded as a worker records a
trial, and the sweep's once-per-sweep parts, on the grid's scratch sweep
(:class:`harness.sweep.launching.estimating.ScratchSweep`): the probe points stand in as the
cells of a one-seed grid, so the study, the tracker, the workers' start and the report are the
sweep's own code paths.  The scratch directory is removed afterwards (the dry run writes
nothing)."""

from __future__ import annotations

from dataclasses import replace

from harness.config.experiment import Cell, ExperimentSpec
from harness.config.schema import RunConfig
from harness.sweep.launching.estimating import ScratchSweep
from harness.sweep.scheduler.estimate import RUN_THREADS, RunCosts, WallTimeEstimate, shape_key
from harness.sweep.scheduler.search_estimate import estimate_search_wall_time, probe_points
from harness.sweep.scheduler.spec import StudySpec


def probe_grid(spec: ExperimentSpec) -> ExperimentSpec:
    """The one-seed grid whose cells are the search's probe points, one per run shape."""
    study = StudySpec.from_experiment(spec)
    shapes: dict[str, Cell] = {}
    for label, overrides in probe_points(spec).items():
        cfg = study.run_config(overrides, spec.seeds[0])
        key = shape_key(cfg) + repr(cfg.warm_start)
        shapes.setdefault(key, Cell(label, overrides, {}))
    cells = list(shapes.values())
    return replace(
        spec,
        axes={},
        variants={},
        cells=cells,
        seeds=spec.seeds[:1],
        baseline=cells[0].label,
        search=None,
        adaptive=None,
    )


def measured_search_wall_time(
    spec: ExperimentSpec, workers: int, command_s: float = 0.0, k: int = 1
) -> WallTimeEstimate:
    """The estimate of the search ``spec`` run by ``workers`` local workers at ``k`` points per
    worker, every part measured here; ``command_s``: the command's own start."""
    grid = probe_grid(spec)
    study = StudySpec.from_experiment(grid)
    probed: dict[str, tuple[RunConfig, RunCosts]] = {}
    with ScratchSweep(grid) as scratch:
        scratch.open_and_start(workers)
        for cell in grid.cells:
            cfg = study.cell_config(cell.label, grid.seeds[0], threads=RUN_THREADS)
            probed[cell.label] = (cfg, scratch.probe(cfg, cell.label))
        once = scratch.finish(command_s)
    return estimate_search_wall_time(spec, workers, probed, once, k)
