"""Experiment files: an ablation grid (or a search space) over the run config, validated once.

    name: clip                      # study / MLflow experiment name
    description: "..."
    base: run-default.yaml          # a run config (mapping) or a path relative to this file
    grid:                           # axis -> values; axes are dotted RunConfig paths
      ppo.eps_clip: [0.1, 0.2]
      variant:                      # named variants bundle several keys
        grpo:   {ppo.reward_norm: {mean_level: group, std_level: group}}
        rloo:   {ppo.reward_norm: {mean_level: group, mean_leave1out: true, std_level: null}}
    seeds: 3                        # a count (0..n-1) or an explicit list
    steps: 60                       # overrides base.steps
    baseline: {ppo.eps_clip: 0.2, variant: grpo}   # or the cell's label
    metric: final/reward            # run-summary key used for the ranking
    direction: maximize

A search file has ``search:`` instead of ``grid:`` (see ``SearchSpec``).  Every problem is reported
as a ``ConfigError`` whose message names the file, the key and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import (
    RunConfig,
    apply_overrides,
    build_run_config,
    expand_aliases,
    load_yaml,
    resolve_alias,
    validate_task,
)
from harness.config.preflight import check_memory
from harness.core.configtools import (
    ConfigError,
    check_declared,
    check_name,
    declared_fields,
    is_config_path,
    to_dict,
)

MAX_SEEDS = 10_000
TOP_KEYS = {
    "name",
    "description",
    "base",
    "grid",
    "seeds",
    "steps",
    "baseline",
    "metric",
    "direction",
    "search",
}


@dataclass(frozen=True)
class Cell:
    label: str  # human-readable, unique: "eps_clip=0.1 c_clip=3"
    overrides: dict[str, Any]  # dotted path -> value (variants expanded)
    choice: dict[str, Any]  # axis -> chosen value (variant name for 'variant')


@dataclass
class SearchParam:
    path: str
    type: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] | None = None


@dataclass
class SearchSpec:
    n_trials: int
    params: list[SearchParam]
    objectives: list[tuple[str, str]]  # (metric, direction)
    pruner: str = "median"  # median | wilcoxon | none
    sampler_seed: int = 0


@dataclass
class ExperimentSpec:
    name: str
    description: str
    base: dict[str, Any]  # plain run-config dict (validated), before per-cell overrides
    axes: dict[str, list[Any]]
    variants: dict[str, dict[str, Any]]  # variant name -> overrides
    cells: list[Cell]
    seeds: list[int]
    steps: int
    baseline: str | None
    metric: str
    direction: str
    search: SearchSpec | None = None
    path: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def n_trials(self) -> int:
        return len(self.cells) * len(self.seeds)

    def grid_hash(self) -> str:
        """Identity of what the study computes: base config, cells, seeds and steps."""
        payload = {
            "base": self.base,
            "cells": [[c.label, c.overrides] for c in self.cells],
            "seeds": self.seeds,
            "steps": self.steps,
            "search": to_dict(self.search) if self.search else None,
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if v is None:
        return "none"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_fmt_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _short(axis: str, axes: list[str]) -> str:
    """Shortest dotted suffix of ``axis`` that is unique among the axes."""
    parts = axis.split(".")
    for k in range(1, len(parts) + 1):
        cand = ".".join(parts[-k:])
        if sum(1 for a in axes if a == cand or a.endswith("." + cand)) == 1:
            return cand
    return axis


def cell_label(choice: dict[str, Any], axes: list[str]) -> str:
    return " ".join(f"{_short(a, axes)}={_fmt_value(v)}" for a, v in choice.items())


def _err(file: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{file}: {key}: {msg}")


def _check_metric(file: str, key: str, metric: Any) -> str:
    """A ranking/search metric must be a key every run summary has (docs/stability.md), else
    every trial trains and then fails for want of its value."""
    from difflib import get_close_matches

    from harness.metrics.stability import OBJECTIVE_KEYS

    if isinstance(metric, str) and metric in OBJECTIVE_KEYS:
        return metric
    close = get_close_matches(str(metric), OBJECTIVE_KEYS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise _err(
        file,
        key,
        f"{metric!r} is not a run-summary key ({hint}see docs/stability.md; e.g. final/reward, "
        "best/reward, final/eval_accuracy, stability/max_drawdown)",
    )


def _check_overrides(
    file: str, where: str, overrides: dict[str, Any], base: dict[str, Any], *, defer: bool = False
) -> ConfigError | None:
    """Check ``overrides`` (paths, then the values together, on the base).  A bad path always
    raises; with ``defer`` a value problem is returned instead of raised: a grid value checked
    alone on the base may be valid once the other axes of its cells are applied (trainer: trl
    with the reward_norm another axis sets), so the cells decide."""
    for path in overrides:
        full = resolve_alias(path)
        if not is_config_path(RunConfig, full):
            raise _err(
                file,
                where,
                f"{path!r} is not a run-config path (e.g. ppo.eps_clip, ppo.adv_norm.mean_level, rollout.staleness)",
            )
        if full in ("seed", "steps"):  # every trial sets these from the top-level keys
            raise _err(
                file,
                where,
                f"{path!r} cannot vary per cell: it is set for every trial by the top-level "
                f"'{'seeds' if full == 'seed' else 'steps'}:' key",
            )
    # The overrides are checked together (a variant may set keys that only make sense as a
    # set, e.g. a weight mode and its cap), each time on a fresh copy of the base.
    try:
        cfg = build_run_config(apply_overrides(base, overrides))
        validate_task(cfg)
    except ConfigError as err:
        if len(overrides) == 1:
            ((path, value),) = overrides.items()
            full = resolve_alias(path)
            msg = str(err)
            msg = msg[len(full) + 2 :] if msg.startswith(full + ": ") else msg
            key = where if where.endswith("." + path) else f"{where}.{path}"
            problem = _err(file, key, f"value {value!r} rejected: {msg}")
        else:
            problem = _err(file, where, f"rejected: {err}")
        if defer:
            return problem
        raise problem from None
    return None


def load_experiment(path: str | Path) -> ExperimentSpec:
    """Parse and completely validate an experiment file (raises ConfigError)."""
    file = str(path)
    raw = load_yaml(path)
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise _err(file, unknown[0], f"unknown key (allowed: {', '.join(sorted(TOP_KEYS))})")
    name = check_name(raw.get("name"), f"{file}: name")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _err(file, "description", "must be a string")

    # base: mapping or a path relative to the experiment file
    base_raw = raw.get("base", {})
    if isinstance(base_raw, str):
        base_path = Path(file).parent / base_raw
        if not base_path.is_file():
            raise _err(
                file, "base", f"file {base_raw!r} not found (relative to {Path(file).parent})"
            )
        base_raw = load_yaml(base_path)
    if not isinstance(base_raw, dict):
        raise _err(file, "base", "must be a mapping of run-config keys or a path to a run config")
    base = expand_aliases(base_raw)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base_cfg = build_run_config(base)
            validate_task(base_cfg)
    except ConfigError as err:
        raise _err(file, "base", str(err)) from None

    steps = raw.get("steps", base_cfg.steps)
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise _err(file, "steps", f"must be an integer >= 1; got {steps!r}")
    declared = declared_fields(RunConfig)
    try:  # the same declared range as the run config's own steps / seed fields
        check_declared(steps, declared["steps"][1], f"{file}: steps")
        if isinstance(seeds_raw := raw.get("seeds", 1), list):
            for i, s in enumerate(seeds_raw):
                check_declared(s, declared["seed"][1], f"{file}: seeds[{i}]")
    except ConfigError as err:
        raise ConfigError(str(err)) from None
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        if not 1 <= seeds_raw <= MAX_SEEDS:
            raise _err(
                file,
                "seeds",
                f"must be a count in [1, {MAX_SEEDS}] or a list of seeds >= 0; got {seeds_raw}",
            )
        seeds = list(range(seeds_raw))
    elif (
        isinstance(seeds_raw, list)
        and seeds_raw
        and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw)
    ):
        if any(s < 0 for s in seeds_raw):
            raise _err(file, "seeds", f"seeds must be >= 0; got {seeds_raw}")
        if len(set(seeds_raw)) != len(seeds_raw):
            raise _err(file, "seeds", f"duplicate seeds in {seeds_raw}")
        seeds = list(seeds_raw)
    else:
        raise _err(
            file,
            "seeds",
            f"must be a count >= 1 or a non-empty list of integers; got {seeds_raw!r}",
        )

    metric = raw.get("metric", "final/reward")
    metric = _check_metric(file, "metric", metric)
    direction = raw.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise _err(file, "direction", f"must be 'maximize' or 'minimize'; got {direction!r}")

    search = None
    axes: dict[str, list[Any]] = {}
    variants: dict[str, dict[str, Any]] = {}
    cells: list[Cell] = []
    if "grid" in raw and "search" in raw:
        raise _err(file, "search", "give either grid or search, not both")
    if "search" in raw:
        search = _parse_search(file, raw["search"], base, metric, direction)
        cells = []
    else:
        grid = raw.get("grid")
        if not isinstance(grid, dict) or not grid:
            raise _err(file, "grid", "must be a non-empty mapping of axis -> list of values")
        seen: set[str] = set()
        # (axis, value index) → the value's problem when checked alone on the base
        alone: dict[tuple[str, int], ConfigError] = {}
        for axis, values in grid.items():
            if not isinstance(axis, str):
                raise _err(file, "grid", f"axis names must be strings; got {axis!r}")
            canonical = "variant" if axis == "variant" else resolve_alias(axis)
            if canonical in seen:
                raise _err(
                    file, f"grid.{axis}", "duplicate axis (the same config path appears twice)"
                )
            seen.add(canonical)
            if axis == "variant":
                if not isinstance(values, dict) or not values:
                    raise _err(
                        file,
                        "grid.variant",
                        "must be a non-empty mapping of variant name -> {config path: value}",
                    )
                for vname, vover in values.items():
                    if not isinstance(vover, dict):
                        raise _err(
                            file,
                            f"grid.variant.{vname}",
                            "must be a mapping of config path -> value",
                        )
                    problem = _check_overrides(
                        file, f"grid.variant.{vname}", vover, base, defer=True
                    )
                    if problem is not None:
                        alone[("variant", len(variants))] = problem
                    variants[str(vname)] = {resolve_alias(k): v for k, v in vover.items()}
                axes["variant"] = list(variants)
            else:
                if not isinstance(values, list) or not values:
                    raise _err(
                        file, f"grid.{axis}", f"must be a non-empty list of values; got {values!r}"
                    )
                if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
                    raise _err(file, f"grid.{axis}", f"duplicate values in {values}")
                for i, v in enumerate(values):
                    problem = _check_overrides(file, "grid", {axis: v}, base, defer=True)
                    if problem is not None:
                        alone[(canonical, i)] = problem
                axes[canonical] = values
        # variants and plain axes must not set the same key
        for vname, vover in variants.items():
            clash = set(vover) & set(axes)
            if clash:
                raise _err(
                    file,
                    f"grid.variant.{vname}",
                    f"sets {sorted(clash)[0]!r}, which is also a grid axis",
                )
        axis_names = list(axes)
        for picks in itertools.product(*(range(len(v)) for v in axes.values())):
            choice = {a: axes[a][i] for a, i in zip(axis_names, picks, strict=True)}
            overrides: dict[str, Any] = {}
            for a, v in choice.items():
                if a == "variant":
                    overrides.update(variants[v])
                else:
                    overrides[a] = v
            label = cell_label(choice, axis_names)
            keys = zip(axis_names, picks, strict=True)
            suspects = [alone[key] for key in keys if key in alone]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = build_run_config(apply_overrides(base, overrides))
                    if suspects:  # the checks the value alone failed, now on the whole cell
                        validate_task(cfg)
                # Each axis value was checked alone; together (width x depth) they may not fit.
                check_memory(cfg)
            except ConfigError as err:
                if suspects:  # the value's own message says best which axis value is wrong
                    raise suspects[0] from None
                raise _err(file, "grid", f"cell {label!r} is invalid: {err}") from None
            except ValueError as err:
                raise _err(file, "grid", f"cell {label!r}: {err}") from None
            del cfg
            cells.append(Cell(label=label, overrides=overrides, choice=choice))

    baseline = None
    if "baseline" in raw:
        if search is not None:
            raise _err(file, "baseline", "only applies to grids")
        b = raw["baseline"]
        if isinstance(b, str):
            match = [c for c in cells if c.label == b]
        elif isinstance(b, dict):
            want = {("variant" if k == "variant" else resolve_alias(k)): v for k, v in b.items()}
            unknown_axes = [k for k in want if k not in axes]
            if unknown_axes:
                raise _err(
                    file,
                    "baseline",
                    f"{unknown_axes[0]!r} is not a grid axis (axes: {', '.join(axes)})",
                )
            match = [c for c in cells if all(c.choice.get(k) == v for k, v in want.items())]
        else:
            raise _err(file, "baseline", "must be a cell label or a mapping axis -> value")
        if len(match) != 1:
            labels = "; ".join(c.label for c in cells[:6]) + ("; ..." if len(cells) > 6 else "")
            what = "matches several cells" if match else "is not a cell of the grid"
            raise _err(file, "baseline", f"{b!r} {what} (cells: {labels})")
        baseline = match[0].label

    return ExperimentSpec(
        name=name,
        description=description.strip(),
        base=base,
        axes=axes,
        variants=variants,
        cells=cells,
        seeds=seeds,
        steps=steps,
        baseline=baseline,
        metric=metric,
        direction=direction,
        search=search,
        path=file,
        raw=raw,
    )


def _parse_search(
    file: str, raw: Any, base: dict[str, Any], metric: str, direction: str
) -> SearchSpec:
    if not isinstance(raw, dict):
        raise _err(file, "search", "must be a mapping with n_trials, params, objectives, pruner")
    allowed = {"n_trials", "params", "objectives", "pruner", "sampler_seed"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise _err(
            file, f"search.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(allowed))})"
        )
    n_trials = raw.get("n_trials")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or not 1 <= n_trials <= 100_000:
        raise _err(file, "search.n_trials", f"must be an integer in [1, 100_000]; got {n_trials!r}")
    params_raw = raw.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        raise _err(file, "search.params", "must be a non-empty mapping of config path -> range")
    params = []
    for path, spec in params_raw.items():
        where = f"search.params.{path}"
        full = resolve_alias(path)
        if not is_config_path(RunConfig, full):
            raise _err(file, where, f"{path!r} is not a run-config path")
        if not isinstance(spec, dict) or spec.get("type") not in ("float", "int", "categorical"):
            raise _err(file, where, "must be {type: float|int|categorical, ...}")
        t = spec["type"]
        extra = sorted(set(spec) - {"type", "low", "high", "log", "step", "choices"})
        if extra:
            raise _err(
                file,
                f"{where}.{extra[0]}",
                "unknown key (allowed: type, low, high, log, step, choices)",
            )
        if t == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise _err(file, f"{where}.choices", "must be a non-empty list")
            for v in choices:
                _check_overrides(file, where, {full: v}, base)
            params.append(SearchParam(full, t, choices=choices))
        else:
            low, high = spec.get("low"), spec.get("high")
            num = (int,) if t == "int" else (int, float)
            if (
                not isinstance(low, num)
                or not isinstance(high, num)
                or isinstance(low, bool)
                or low >= high
            ):
                raise _err(file, where, f"needs numeric low < high; got low={low!r}, high={high!r}")
            log = spec.get("log", False)
            if not isinstance(log, bool) or (log and low <= 0):
                raise _err(file, f"{where}.log", "must be true/false, and log ranges need low > 0")
            for v in (low, high):
                _check_overrides(file, where, {full: v}, base)
            step = spec.get("step")
            if step is not None:
                step_num = (int,) if t == "int" else (int, float)
                if (
                    isinstance(step, bool)
                    or not isinstance(step, step_num)
                    or not 0 < step <= high - low
                ):
                    kind = "an integer" if t == "int" else "a number"
                    raise _err(
                        file,
                        f"{where}.step",
                        f"must be {kind} in (0, high - low = {high - low:g}] or null; got {step!r}",
                    )
                if log:
                    raise _err(file, f"{where}.step", "cannot be combined with log: true")
            params.append(SearchParam(full, t, low=low, high=high, log=log, step=step))
    objectives_raw = raw.get("objectives", [{"metric": metric, "direction": direction}])
    if not isinstance(objectives_raw, list) or not 1 <= len(objectives_raw) <= 2:
        raise _err(file, "search.objectives", "must be a list of one or two {metric, direction}")
    objectives = []
    for i, o in enumerate(objectives_raw):
        if not isinstance(o, dict) or set(o) - {"metric", "direction"}:
            raise _err(
                file,
                f"search.objectives[{i}]",
                "must be {metric: KEY, direction: maximize|minimize}",
            )
        m, d = o.get("metric"), o.get("direction", "maximize")
        m = _check_metric(file, f"search.objectives[{i}].metric", m)
        if d not in ("maximize", "minimize"):
            raise _err(
                file,
                f"search.objectives[{i}].direction",
                f"must be maximize or minimize; got {d!r}",
            )
        objectives.append((m, d))
    if len(objectives) == 2 and objectives[0][0] == objectives[1][0]:
        raise _err(file, "search.objectives", f"names {objectives[0][0]!r} twice")
    pruner = raw.get("pruner", "median")
    if pruner not in ("median", "wilcoxon", "none"):
        raise _err(file, "search.pruner", f"must be median, wilcoxon or none; got {pruner!r}")
    if len(objectives) > 1 and pruner != "none":
        pruner = "none"  # Optuna cannot prune multi-objective studies
    seed = raw.get("sampler_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:
        raise _err(
            file, "search.sampler_seed", f"must be an integer in [0, 2**32 - 1]; got {seed!r}"
        )
    return SearchSpec(
        n_trials=n_trials, params=params, objectives=objectives, pruner=pruner, sampler_seed=seed
    )
