"""What an experiment file may say: typed dataclasses with help and bounds per field, read by
``configtools.from_dict`` exactly like a run config (unknown keys, types, ranges, one-line
errors that name the dotted key).  ``__post_init__`` holds only what a declaration cannot say
(fields that must agree, a metric that must exist).  The checks that need the run config (is an
axis a config path, is a value valid on the base, do the cells fit) are in ``experiment.py``.

``SearchParam`` and ``SearchSpec`` are also what a search study stores and samples from
(``harness.sweep.scheduler.spec``), so a search point is described by one class from file to worker.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from difflib import get_close_matches
from typing import TYPE_CHECKING, Annotated, Any, Literal

from harness.config.loading import resolve_alias
from harness.config.schema import RunConfig
from harness.core.configtools import check_name
from harness.core.fields import bounds_of, meta, option
from harness.metrics.stability import OBJECTIVE_KEYS

if TYPE_CHECKING:
    import optuna

Direction = Literal["maximize", "minimize"]
Pruner = Literal["median", "wilcoxon", "none"]
ParamType = Literal["float", "int", "categorical"]

MAX_SEEDS = 10_000
MAX_TRIALS = 100_000
# The experiment's seeds and steps are the run config's own fields: the same declared ranges.
_RUN = {f.name: f.metadata for f in fields(RunConfig)}
_SEED_RANGE = bounds_of(_RUN["seed"])
SeedCount = Annotated[int, meta("Seeds 0..n-1.", ge=1, le=MAX_SEEDS)]
Seed = Annotated[int, meta("A seed.", **_SEED_RANGE)]


def check_metric(metric: str) -> None:
    """A ranking/search metric must be a key every run summary has (docs/stability.md), else
    every trial trains and then fails for want of its value."""
    if metric in OBJECTIVE_KEYS:
        return
    close = get_close_matches(metric, OBJECTIVE_KEYS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"metric: {metric!r} is not a run-summary key ({hint}see docs/stability.md; e.g. "
        "final/reward, best/reward, final/eval_accuracy, stability/max_drawdown)"
    )


@dataclass(frozen=True)
class SearchParam:
    """One searched run-config field: a float or int range, or a list of choices."""

    type: ParamType = option(help="float | int (a range) or categorical (choices).")
    path: str = option("", "The run-config path: the key under search.params.", from_key=True)
    low: int | float | None = option(None, "Lower end of the range.")
    high: int | float | None = option(None, "Upper end of the range.")
    log: bool = option(False, "Sample on a log scale (needs low > 0).")
    step: int | float | None = option(None, "Spacing of the sampled values (null = continuous).")
    choices: tuple[Any, ...] | None = option(None, "The values of a categorical parameter.")

    def __post_init__(self) -> None:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("choices: must be a non-empty list for type: categorical")
            return
        low, high, step = self.low, self.high, self.step
        num = (int,) if self.type == "int" else (int, float)
        kind = "an integer" if self.type == "int" else "a number"
        if not isinstance(low, num) or not isinstance(high, num) or low >= high:
            raise ValueError(f"low: must be {kind} below high; got low={low!r}, high={high!r}")
        if self.log and low <= 0:
            raise ValueError(f"log: log ranges need low > 0; got low={low!r}")
        if step is not None:
            if not isinstance(step, num) or not 0 < step <= high - low:
                raise ValueError(
                    f"step: must be {kind} in (0, high - low = {high - low:g}] or null; "
                    f"got {step!r}"
                )
            if self.log:
                raise ValueError("step: cannot be combined with log: true")

    def suggest(self, trial: optuna.Trial) -> Any:
        """Sample this field on an Optuna trial (the trial records it under ``path``)."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.path, list(self.choices or ()))
        if self.type == "int":
            return trial.suggest_int(
                self.path, int(self.low or 0), int(self.high or 0), log=self.log
            )
        return trial.suggest_float(
            self.path, float(self.low or 0.0), float(self.high or 0.0), log=self.log, step=self.step
        )


@dataclass(frozen=True)
class SearchSpec:
    """What a search study samples and optimizes (resolved from the file's ``search:``)."""

    n_trials: int
    params: tuple[SearchParam, ...]
    objectives: tuple[tuple[str, str], ...]  # (metric, maximize|minimize)
    pruner: str = "median"  # median | wilcoxon | none
    sampler_seed: int = 0

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        return {p.path: p.suggest(trial) for p in self.params}


@dataclass
class Objective:
    metric: str = option(help="Run-summary key to optimize (docs/stability.md).")
    direction: Direction = option("maximize", "maximize | minimize.")

    def __post_init__(self) -> None:
        check_metric(self.metric)


@dataclass
class SearchFile:
    """The ``search:`` block of an experiment file."""

    n_trials: int = option(help="Trials to run.", ge=1, le=MAX_TRIALS)
    params: dict[str, SearchParam] = option(
        help="Run-config path -> {type, low, high, log, step} or {type, choices}."
    )
    objectives: list[Objective] | None = option(
        None, "One or two {metric, direction} (null = the file's metric and direction)."
    )
    pruner: Pruner = option("median", "Stop unpromising trials between seeds (one objective).")
    sampler_seed: int = option(0, "Seed of the TPE sampler (worker k: seed + k).", **_SEED_RANGE)

    def __post_init__(self) -> None:
        if not self.params:
            raise ValueError("params: must be a non-empty mapping of config path -> range")
        if self.objectives is not None and not 1 <= len(self.objectives) <= 2:
            raise ValueError("objectives: must be a list of one or two {metric, direction}")
        if self.objectives and len({o.metric for o in self.objectives}) < len(self.objectives):
            raise ValueError(f"objectives: names {self.objectives[0].metric!r} twice")

    def resolve(self, metric: str, direction: str) -> SearchSpec:
        objectives = self.objectives or [Objective(metric, direction)]  # type: ignore[arg-type]
        return SearchSpec(
            n_trials=self.n_trials,
            params=tuple(replace(p, path=resolve_alias(k)) for k, p in self.params.items()),
            objectives=tuple((o.metric, o.direction) for o in objectives),
            # Optuna cannot prune multi-objective studies
            pruner=self.pruner if len(objectives) == 1 else "none",
            sampler_seed=self.sampler_seed,
        )


MAX_ADAPTIVE_SEEDS = 500
MAX_LOOKS = 64


@dataclass
class AdaptiveSeedsFile:
    """``seeds:`` as a mapping: seeds in batches, each cell until its comparison is decided
    (docs/seeds.md).  Seeds are 0..max-1; every cell starts with ``min``."""

    min: int = option(3, "Seeds every cell runs first.", ge=2, le=500)
    max: int = option(24, "Most seeds a cell may get.", ge=2, le=MAX_ADAPTIVE_SEEDS)
    batch: int = option(2, "Seeds added to an open cell per look.", ge=1)
    decide: Literal["baseline", "ranking"] = option(
        "baseline", "baseline: each cell vs the baseline; ranking: the top cell vs the next."
    )
    confidence: float = option(
        0.95, "Chance that no look's interval misses (all looks together).", ge=0.5, lt=1
    )
    margin: float = option(
        0.0, "Differences within ±margin (metric units) count as equivalent (0 = never).", ge=0
    )

    def __post_init__(self) -> None:
        # The bounds are declared above; here what fields must agree on (the same rules as
        # harness.report.sequential.SeedPlan, which the config layer may not import).
        if self.max < self.min:
            raise ValueError(f"seeds.max: must be >= seeds.min ({self.min}); got {self.max}")
        looks = len(self.looks())
        if looks > MAX_LOOKS:
            raise ValueError(
                f"seeds.batch: {looks} looks from min {self.min} to max {self.max}; at most "
                f"{MAX_LOOKS} (raise batch)"
            )

    def looks(self) -> list[int]:
        """Seed counts at which the comparisons are looked at: min, min + batch, ..., max."""
        return [*range(self.min, self.max, self.batch), self.max]


# What one grid may enumerate and enqueue up front unless its file raises the limits: every cell
# is validated (a config build and a memory check each) before anything runs, and every
# (cell, seed) is an Optuna trial written to the study at start.
DEFAULT_MAX_CELLS = 10_000
DEFAULT_MAX_GRID_TRIALS = 20_000
# Trials one worker trains at once on one base model (LoRA packing): each is a run held in the
# worker's memory, and a pack steps its trials in turn, so more is a typo, not a plan.
MAX_CELLS_PER_WORKER = 64


@dataclass(frozen=True)
class LimitsFile:
    """``limits:`` of an experiment file: how big a grid may be (raise them knowingly)."""

    cells: int = option(
        DEFAULT_MAX_CELLS, "Most cells a grid may have (the product of its axes).", ge=1, le=10**7
    )
    trials: int = option(
        DEFAULT_MAX_GRID_TRIALS,
        "Most trials a grid may enqueue: cells x seeds (adaptive seeds: x max).",
        ge=1,
        le=10**8,
    )


@dataclass
class ExperimentFile:
    """An experiment file: a grid (or a search) over a base run config."""

    name: str = option("", "Study and MLflow experiment name.")
    description: str = option("", "Shown in the report.")
    base: dict[str, Any] | str = option(
        help="A run config (mapping) or the path of one, relative to this file.", factory=dict
    )
    grid: dict[str, Any] | None = option(
        None, "Axis (dotted run-config path) -> list of values; variant -> name -> {path: value}."
    )
    search: SearchFile | None = option(None, "A search space (not a grid).")
    seeds: SeedCount | list[Seed] | AdaptiveSeedsFile = option(
        1,
        "A count n (seeds 0..n-1), a list of seeds, or {min, max, batch, decide, "
        "confidence, margin}: seeds until each comparison is decided.",
    )
    steps: int | None = option(
        None, "Steps of every trial (null = the base's steps).", **bounds_of(_RUN["steps"])
    )
    baseline: str | dict[str, Any] | None = option(
        None, "The reference cell: its label or {axis: value}."
    )
    metric: str = option("final/reward", "Run-summary key for the ranking.")
    direction: Direction = option("maximize", "maximize | minimize.")
    limits: LimitsFile = option(
        help="{cells, trials}: the most a grid may enumerate (default 10000, 20000).",
        factory=LimitsFile,
    )
    cells_per_worker: int = option(
        1,
        "Most LoRA trials a worker trains at once on one base model (a grid's trials that "
        "share the base fields, seed included; a search's sampled points, seed by seed; "
        "docs/scaling.md).",
        ge=1,
        le=MAX_CELLS_PER_WORKER,
    )

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_metric(self.metric)
        if self.grid is not None and self.search is not None:
            raise ValueError("search: give either grid or search, not both")
        if self.search is None and not self.grid:
            raise ValueError("grid: must be a non-empty mapping of axis -> list of values")
        if self.baseline is not None and self.search is not None:
            raise ValueError("baseline: only applies to grids")
        if isinstance(self.seeds, AdaptiveSeedsFile):
            # Racing compares one objective's values, seed by seed: it cannot act on two.
            if self.search is not None and len(self.search.objectives or ()) > 1:
                raise ValueError(
                    "seeds: a racing plan {min, max, ...} compares one objective; a "
                    "two-objective search runs every point at every seed (give seeds a count "
                    "or a list)"
                )
            # A search races each point against the incumbent: decide does not apply there.
            if self.search is None and self.seeds.decide == "baseline" and self.baseline is None:
                raise ValueError(
                    "seeds.decide: 'baseline' needs a baseline: cell (or use decide: ranking)"
                )
        if isinstance(self.seeds, list) and not self.seeds:
            raise ValueError("seeds: must be a count >= 1 or a non-empty list of integers")
        if isinstance(self.seeds, list) and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: duplicate seeds in {self.seeds}")

    @property
    def seed_list(self) -> list[int]:
        """Every seed a cell may run (an adaptive plan: 0..max-1)."""
        if isinstance(self.seeds, AdaptiveSeedsFile):
            return list(range(self.seeds.max))
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)
