"""Terminal tables for `harness ablate --dry-run` and `harness status`."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage
from rich.console import Console
from rich.table import Table

from harness.config import apply_overrides, build_run_config
from harness.config.experiment import ExperimentSpec
from harness.config.schema import INERT_CLIP_FIX, INERT_CLIP_WHY, clip_is_inert
from harness.core.configtools import ConfigError, flatten, to_dict
from harness.core.failures import count_reasons, reason_lines
from harness.sweep.scheduler.spec import has_study_spec, load_study_spec
from harness.sweep.scheduler.study import study_counts
from harness.sweep.scheduler.trials import MEDIAN_STARTUP_POINTS, WILCOXON_P


def wide_console() -> Console:
    """The terminal's console, or a 200-column one for pipes and logs (no 80-column squeeze)."""
    c = Console()
    return c if c.is_terminal else Console(width=200)


def print_grid(spec: ExperimentSpec) -> None:
    console = wide_console()
    title = (
        f"{spec.name}: {len(spec.cells)} cells x {len(spec.seeds)} seeds = {spec.n_trials} trials"
    )
    if spec.adaptive is not None and spec.search is None:
        a = spec.adaptive
        title = f"{spec.name}: {len(spec.cells)} cells x {a['min']}..{a['max']} seeds (adaptive)"
    table = Table(title=title)
    table.add_column("#", justify="right")
    table.add_column("cell")
    table.add_column("overrides")
    table.add_column("baseline")
    for i, c in enumerate(spec.cells):
        over = ", ".join(f"{k}={v}" for k, v in c.overrides.items())
        table.add_row(str(i), c.label, over, "yes" if c.label == spec.baseline else "")
    console.print(table)
    if spec.adaptive is not None and spec.search is not None:
        print(_racing_line(spec.adaptive))
    elif spec.adaptive is not None:
        a = spec.adaptive
        looks = [*range(a["min"], a["max"], a["batch"]), a["max"]]
        versus = "the baseline" if a["decide"] == "baseline" else "the runner-up (ranking)"
        print(
            f"{len(spec.cells)} cells x {a['min']}..{a['max']} seeds (adaptive) = "
            f"{len(spec.cells) * a['min']} trials up front, at most {spec.n_trials}"
        )
        print(
            f"adaptive seeds: each cell starts with {a['min']} seeds and gets {a['batch']} more "
            f"after each look while its comparison with {versus} is open; looks at "
            f"{looks} seeds; confidence {a['confidence']:g} over all looks; equivalence margin "
            f"±{a['margin']:g} ({spec.metric}); at most {spec.n_trials * spec.steps} steps"
        )
    console.print(
        f"seeds {_seeds_text(spec.seeds)}; {spec.steps} steps per run; step budget {spec.n_trials * spec.steps} "
        f"steps; ranking metric {spec.metric} ({spec.direction}); grid hash {spec.grid_hash()}"
    )
    for line in inert_clip_lines(spec):
        print(line)


def print_search(spec: ExperimentSpec) -> None:
    """`harness search --dry-run`: the space TPE samples (one row per field), the budget in
    points, runs and steps, the objectives and how trials stop early."""
    search = spec.search
    assert search is not None
    console = wide_console()
    if spec.adaptive is not None:
        a = spec.adaptive
        seeds, most = f"{a['min']}..{a['max']} seeds (racing)", a["max"]
    else:
        seeds, most = f"{len(spec.seeds)} seeds", len(spec.seeds)
    runs = search.n_trials * most
    table = Table(
        title=f"{spec.name}: {search.n_trials} points x {seeds} = at most {runs} runs",
    )
    for column in ("field", "type", "values", "scale"):
        table.add_column(column)
    for p in search.params:
        table.add_row(p.path, p.type, *_param_values(p))
    console.print(table)
    goals = ", ".join(f"{m} ({d})" for m, d in search.objectives)
    print(
        f"TPE sampler (multivariate), seed {search.sampler_seed} (worker k: seed + k); "
        f"{'objective' if len(search.objectives) == 1 else 'objectives'} {goals}; "
        f"pruner {_pruner_text(search.pruner)}"
    )
    if spec.adaptive is not None:
        print(_racing_line(spec.adaptive))
    console.print(
        f"seeds {_seeds_text(spec.seeds)}; {spec.steps} steps per run; step budget at most "
        f"{runs * spec.steps} steps; spec hash {spec.grid_hash()}"
    )


def _racing_line(a: dict[str, Any]) -> str:
    return (
        f"racing: each trial runs {a['min']}..{a['max']} seeds; after {a['min']} and every "
        f"{a['batch']} more it is compared with the incumbent (paired by seed, confidence "
        f"{a['confidence']:g} over all looks, margin ±{a['margin']:g}) and stops when "
        "decided worse or equivalent"
    )


def _param_values(p: Any) -> tuple[str, str]:
    """(the values, the scale) of a search parameter, as the file states them."""
    if p.type == "categorical":
        return ", ".join("null" if c is None else str(c) for c in p.choices), "choices"
    values = f"[{p.low:g}, {p.high:g}]" + (f" step {p.step:g}" if p.step is not None else "")
    return values, "log" if p.log else "linear"


def _pruner_text(name: str) -> str:
    if name == "median":
        return (
            f"median (once {MEDIAN_STARTUP_POINTS} points have finished, a point worse than "
            "their median after a seed stops there)"
        )
    if name == "wilcoxon":
        return (
            "wilcoxon (a point a paired test over seeds finds worse than the best, "
            f"p < {WILCOXON_P:g}, stops)"
        )
    return "none (every point runs every seed)"


# The settings a configuration with an identically-1 ratio ignores.
CLIP_SETTINGS = frozenset({"ppo.eps_clip", "ppo.eps_clip_higher", "ppo.c_clip"})


def inert_clip_lines(spec: ExperimentSpec) -> list[str]:
    """What the grid's clipping cannot do, said by the dry run before any run: the cells whose policy ratio is identically 1
    (:func:`harness.config.schema.clip_is_inert`), and each such cell that differs from an
    equally inert baseline only in clip settings, whose runs therefore repeat the baseline's
    seed for seed. Without this line such a cell reads as a measured "no effect of eps_clip"."""
    if spec.search is not None:
        return []
    cfgs = {c.label: build_run_config(apply_overrides(spec.base, c.overrides)) for c in spec.cells}
    inert = [label for label, cfg in cfgs.items() if clip_is_inert(cfg)]
    if not inert:
        return []
    where = (
        "every cell"
        if len(inert) == len(cfgs)
        else f"{len(inert)} of {len(cfgs)} cells ({', '.join(inert)})"
    )
    lines = [
        f"note: clipping is inert in {where} ({INERT_CLIP_WHY}), so eps_clip, eps_clip_higher "
        f"and c_clip cannot change those runs; {INERT_CLIP_FIX}"
    ]
    if spec.baseline not in inert:
        return lines
    base = flatten(to_dict(cfgs[spec.baseline]))
    for label in inert:
        cell = flatten(to_dict(cfgs[label]))
        differ = sorted(k for k in base.keys() | cell.keys() if base.get(k) != cell.get(k))
        if label != spec.baseline and differ and set(differ) <= CLIP_SETTINGS:
            lines.append(
                f"note: cell {label!r} differs from the baseline only in {', '.join(differ)}, "
                "which cannot act here: its runs repeat the baseline's"
            )
    return lines


def _seeds_text(seeds: list[int]) -> str:
    if len(seeds) > 8 and seeds == list(range(len(seeds))):
        return f"0..{len(seeds) - 1}"
    return str(seeds)


def print_status(storage: BaseStorage, study_name: str | None) -> None:
    """One row per study; below the table, each study's distinct failure reasons with counts
    (all of them for a named study, the three most frequent otherwise)."""
    console = wide_console()
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    names = [s.study_name for s in summaries]
    if study_name is not None and study_name not in names:
        raise ConfigError(
            f"study: no study named {study_name!r} (studies: {', '.join(names) or 'none'})"
        )
    table = Table(title="studies")
    for col in ("study", "done", "pruned", "diverged", "running", "waiting", "failed", "total"):
        table.add_column(col, justify="right" if col != "study" else "left")
    failures: list[tuple[str, list[tuple[str, int]]]] = []
    adaptive: list[tuple[str, Any]] = []
    for name in names:
        if study_name is not None and name != study_name:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        spec = load_study_spec(study) if has_study_spec(study) else None
        c = study_counts(study, spec)
        table.add_row(
            name,
            str(c.done),
            str(c.pruned),
            str(c.diverged),
            str(c.running),
            str(c.waiting),
            str(c.failed),
            str(c.total),
        )
        if c.reasons:
            failures.append((name, count_reasons(c.reasons)))
        if c.cells:
            adaptive.append((name, c))
    console.print(table)
    for name, c in adaptive:
        # print(): a cell label is the user's text and may hold [markup]
        held = f"; {c.held} more held until a look releases them" if c.held else ""
        print(f"{name}: seeds per cell ({c.cancelled} held seeds cancelled by decisions){held}")
        for label, line in c.cells:
            print(f"  {label}: {line}")
    limit = None if study_name is not None else 3
    for name, counted in failures:
        # print(), not rich: a reason is the user's text and may hold [markup]
        print(f"{name}: why trials failed")
        for line in reason_lines(counted[:limit], "trial"):
            print(f"  {line}")
        if limit is not None and len(counted) > limit:
            print(f"  ... {len(counted) - limit} more reasons: harness status {name}")
