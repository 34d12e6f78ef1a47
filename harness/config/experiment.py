"""Experiment files: an ablation grid (or a search space) over the run config, validated once.

    name: clip                      # study / MLflow experiment name
    description: "..."
    base: run-default.yaml          # a run config (mapping) or a path relative to this file
    grid:                           # axis -> values; axes are dotted RunConfig paths
      ppo.eps_clip: [0.1, 0.2]
      variant:                      # named variants bundle several keys
        grpo:   {ppo.reward_norm: {mean_level: group, std_level: group}}
        rloo:   {ppo.reward_norm: {mean_level: group, mean_leave1out: true, std_level: null}}
    seeds: 3                        # a count (0..n-1), an explicit list, or a plan:
    # seeds: {min: 3, max: 24, batch: 2, decide: baseline, confidence: 0.95, margin: 0.02}
    steps: 60                       # overrides base.steps
    baseline: {ppo.eps_clip: 0.2, variant: grpo}   # or the cell's label
    metric: final/reward            # run-summary key used for the ranking
    direction: maximize

A search file has ``search:`` instead of ``grid:``.  What each key may hold is declared in
``experiment_schema`` (and checked by ``configtools.from_dict``); this module checks what needs
the run config: axes are config paths, every value is valid on the base, every cell fits.  Every
problem is reported as a ``ConfigError`` whose message names the file, the key and what is
allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import (
    RunConfig,
    apply_overrides,
    build_run_config,
    expand_aliases,
    is_sampler_path,
    load_yaml,
    resolve_alias,
    validate_task,
)
from harness.config.experiment_schema import (
    AdaptiveSeedsFile,
    ExperimentFile,
    LimitsFile,
    SearchParam,
    SearchSpec,
)
from harness.config.probe_scope import shared_probes
from harness.core.configtools import ConfigError, from_dict, is_config_path, level_str, to_dict

__all__ = ["Cell", "ExperimentSpec", "SearchParam", "SearchSpec", "cell_label", "load_experiment"]


@dataclass(frozen=True)
class Cell:
    label: str  # human-readable, unique: "eps_clip=0.1 c_clip=3"
    overrides: dict[str, Any]  # dotted path -> value (variants expanded)
    choice: dict[str, Any]  # axis -> chosen value (variant name for 'variant')


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
    # seeds: {min, max, ...}: the plan as a plain mapping (seeds is then 0..max-1)
    adaptive: dict[str, Any] | None = None
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
        if self.adaptive is not None:  # only then: the hash of a fixed-seed study is unchanged
            payload["adaptive"] = self.adaptive
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _short(axis: str, axes: list[str]) -> str:
    """Shortest dotted suffix of ``axis`` that is unique among the axes."""
    parts = axis.split(".")
    for k in range(1, len(parts) + 1):
        cand = ".".join(parts[-k:])
        if sum(1 for a in axes if a == cand or a.endswith("." + cand)) == 1:
            return cand
    return axis


def cell_label(choice: dict[str, Any], axes: list[str]) -> str:
    return " ".join(f"{_short(a, axes)}={level_str(v)}" for a, v in choice.items())


def _err(file: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{file}: {key}: {msg}")


def _check_overrides(
    file: str, where: str, overrides: dict[str, Any], base: dict[str, Any], *, defer: bool = False
) -> ConfigError | None:
    """Check ``overrides`` (paths, then the values together, on the base).  A bad path always
    raises; with ``defer`` a value problem is returned instead of raised: a grid value checked
    alone on the base may be valid once the other axes of its cells are applied (trainer: trl
    with the reward_norm another axis sets), so the cells decide."""
    for path in overrides:
        full = resolve_alias(path)
        if not (is_config_path(RunConfig, full) or is_sampler_path(full)):
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


_SAMPLED_EVAL = ("final/eval_pass_at_1", "final/eval_pass_at_k", "final/eval_mean_at_n")
_MISMATCH = ("stability/mismatch_kl_k3_mean", "stability/mismatch_kl_k3_max")


def unlogged_metric(metric: str, cfg: RunConfig) -> str | None:
    """Why a run under ``cfg`` can never log ``metric`` (its summary would hold NaN and every
    trial fail), or None.  Each key that depends on a setting is listed here."""
    if metric in _SAMPLED_EVAL and cfg.eval.samples == 0:
        return "needs eval.samples > 0 (sampled evaluation); it is 0"
    if metric in _MISMATCH:
        if not cfg.rollout.measure_mismatch:
            return "needs rollout.measure_mismatch: true; it is false"
        if cfg.trainer == "trl":
            return "is not logged with trainer: trl (the harness loop measures the mismatch)"
    if metric == "final/steps_to_threshold":
        return "is not logged by the training loops (no reward threshold is configured)"
    return None


def _check_metrics_logged(
    file: str, metrics: list[tuple[str, str]], cfgs: list[tuple[str, RunConfig]]
) -> None:
    """Each ranked/optimized metric must be loggable in every cell, checked before any run."""
    for key, metric in metrics:
        for label, cfg in cfgs:
            why = unlogged_metric(metric, cfg)
            if why is not None:
                where = f" in cell {label!r}" if label else ""
                raise _err(file, key, f"{metric!r} {why}{where}")


def load_experiment(path: str | Path) -> ExperimentSpec:
    """Parse and completely validate an experiment file (raises ConfigError)."""
    with shared_probes():  # the cells' prompt probes, computed once per distinct setting
        return _load_experiment(path)


def _load_experiment(path: str | Path) -> ExperimentSpec:
    file = str(path)
    raw = load_yaml(path)
    try:  # keys, types and ranges, from the declarations in experiment_schema
        doc = from_dict(ExperimentFile, raw)
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None
    base, base_cfg = _load_base(file, doc.base)
    search = None
    axes: dict[str, list[Any]] = {}
    variants: dict[str, dict[str, Any]] = {}
    cells: list[Cell] = []
    if doc.search is not None:
        search = doc.search.resolve(doc.metric, doc.direction)
        pruner = (raw.get("search") or {}).get("pruner")
        if len(search.objectives) > 1 and pruner not in (None, "none"):  # it could not act
            raise ConfigError(
                f"{file}: search.pruner: {pruner!r} cannot act on a two-objective search "
                "(Optuna prunes single-objective studies only); remove it or set none"
            )
        checked: list[tuple[str, RunConfig]] = [("", base_cfg)]
        for key, param in doc.search.params.items():  # every end of a range is a valid value
            values = param.choices if param.type == "categorical" else (param.low, param.high)
            for v in values or ():
                _check_overrides(file, f"search.params.{key}", {key: v}, base)
                over = apply_overrides(base, {key: v})
                checked.append((f"{key}={v!r}", build_run_config(over)))
        metrics = [
            (f"search.objectives[{i}].metric" if doc.search.objectives else "metric", m)
            for i, (m, _) in enumerate(search.objectives)
        ]
        _check_metrics_logged(file, metrics, checked)
    else:
        assert doc.grid is not None  # ExperimentFile refuses a file with neither
        check_grid_size(file, doc.grid, len(doc.seed_list), doc.limits)
        axes, variants, cells = _expand_grid(file, doc.grid, base)
        _check_metrics_logged(
            file,
            [("metric", doc.metric)],
            [(c.label, build_run_config(apply_overrides(base, c.overrides))) for c in cells],
        )
    return ExperimentSpec(
        name=doc.name,
        description=doc.description.strip(),
        base=base,
        axes=axes,
        variants=variants,
        cells=cells,
        seeds=doc.seed_list,
        steps=doc.steps if doc.steps is not None else base_cfg.steps,
        baseline=None if doc.baseline is None else _baseline(file, doc.baseline, cells, axes),
        metric=doc.metric,
        direction=doc.direction,
        search=search,
        adaptive=to_dict(doc.seeds) if isinstance(doc.seeds, AdaptiveSeedsFile) else None,
        path=file,
        raw=raw,
    )


def check_grid_size(file: str, grid: dict[str, Any], n_seeds: int, limits: LimitsFile) -> None:
    """Refuse a grid larger than ``limits`` from the axis sizes alone, before one cell is built:
    enumerating and validating 10^5 cells takes minutes, and every (cell, seed) becomes a trial
    enqueued at start."""
    sizes = [len(v) if isinstance(v, (list, dict)) else 1 for v in grid.values()]
    n_cells = math.prod(sizes)
    shape = " x ".join(str(n) for n in sizes)
    if n_cells > limits.cells:
        raise _err(
            file,
            "grid",
            f"{n_cells} cells ({shape}) exceed the limit of {limits.cells}; shrink the grid or "
            f"raise it with limits: {{cells: {n_cells}}} in the file",
        )
    if n_cells * n_seeds > limits.trials:
        raise _err(
            file,
            "grid",
            f"{n_cells} cells x {n_seeds} seeds = {n_cells * n_seeds} trials exceed the limit "
            f"of {limits.trials}; fewer cells or seeds, or raise it with "
            f"limits: {{trials: {n_cells * n_seeds}}} in the file",
        )


def _load_base(file: str, base_raw: dict[str, Any] | str) -> tuple[dict[str, Any], RunConfig]:
    """The base run config: a mapping, or a path relative to the experiment file; validated."""
    if isinstance(base_raw, str):
        base_path = Path(file).parent / base_raw
        if not base_path.is_file():
            raise _err(
                file, "base", f"file {base_raw!r} not found (relative to {Path(file).parent})"
            )
        base_raw = load_yaml(base_path)
    base = expand_aliases(base_raw)
    try:
        base_cfg = build_run_config(base)
        validate_task(base_cfg)
    except ConfigError as err:
        raise _err(file, "base", str(err)) from None
    return base, base_cfg


def _expand_grid(
    file: str, grid: dict[str, Any], base: dict[str, Any]
) -> tuple[dict[str, list[Any]], dict[str, dict[str, Any]], list[Cell]]:
    """Axes, variants and the cells of their product, each value and each cell checked."""
    from harness.config.preflight import check_memory  # noqa: PLC0415 - loads transformers: only when a grid's cells are checked

    axes: dict[str, list[Any]] = {}
    variants: dict[str, dict[str, Any]] = {}
    # (axis, value index) → the value's problem when checked alone on the base
    alone: dict[tuple[str, int], ConfigError] = {}
    for axis, values in grid.items():
        canonical = "variant" if axis == "variant" else resolve_alias(axis)
        if canonical in axes:
            raise _err(file, f"grid.{axis}", "duplicate axis (the same config path appears twice)")
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
                        file, f"grid.variant.{vname}", "must be a mapping of config path -> value"
                    )
                problem = _check_overrides(file, f"grid.variant.{vname}", vover, base, defer=True)
                if problem is not None:
                    alone[("variant", len(variants))] = problem
                variants[str(vname)] = {resolve_alias(k): v for k, v in vover.items()}
            axes["variant"] = list(variants)
            continue
        if not isinstance(values, list) or not values:
            raise _err(file, f"grid.{axis}", f"must be a non-empty list of values; got {values!r}")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
            raise _err(file, f"grid.{axis}", f"duplicate values in {values}")
        for i, v in enumerate(values):
            problem = _check_overrides(file, "grid", {axis: v}, base, defer=True)
            if problem is not None:
                alone[(canonical, i)] = problem
        axes[canonical] = values
    for vname, vover in variants.items():  # variants and plain axes must not set the same key
        clash = set(vover) & set(axes)
        if clash:
            raise _err(
                file,
                f"grid.variant.{vname}",
                f"sets {sorted(clash)[0]!r}, which is also a grid axis",
            )
    axis_names = list(axes)
    cells: list[Cell] = []
    for picks in itertools.product(*(range(len(v)) for v in axes.values())):
        choice = {a: axes[a][i] for a, i in zip(axis_names, picks, strict=True)}
        overrides: dict[str, Any] = {}
        for a, v in choice.items():
            overrides.update(variants[v] if a == "variant" else {a: v})
        label = cell_label(choice, axis_names)
        suspects = [alone[key] for key in zip(axis_names, picks, strict=True) if key in alone]
        try:
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
    return axes, variants, cells


def _baseline(file: str, b: str | dict[str, Any], cells: list[Cell], axes: dict[str, Any]) -> str:
    """The label of the one cell that ``baseline:`` (a label or {axis: value}) names."""
    if isinstance(b, str):
        match = [c for c in cells if c.label == b]
    else:
        want = {resolve_alias(k): v for k, v in b.items()}  # "variant" is no alias
        unknown_axes = [k for k in want if k not in axes]
        if unknown_axes:
            raise _err(
                file,
                "baseline",
                f"{unknown_axes[0]!r} is not a grid axis (axes: {', '.join(axes)})",
            )
        match = [c for c in cells if all(c.choice.get(k) == v for k, v in want.items())]
    if len(match) != 1:
        # Several matches: name those (the user narrows among them); none: name the grid's.
        shown = match or cells
        labels = "; ".join(c.label for c in shown[:6]) + ("; ..." if len(shown) > 6 else "")
        what = "matches several cells" if match else "is not a cell of the grid"
        which = "matching cells" if match else "cells"
        raise _err(file, "baseline", f"{b!r} {what} ({which}: {labels})")
    return match[0].label
