"""Terminal tables for `harness ablate --dry-run` and `harness status`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from harness.config.experiment import ExperimentSpec
from harness.sweep.spec import has_study_spec, load_study_spec
from harness.sweep.study import study_counts


def wide_console() -> Console:
    """The terminal's console, or a 200-column one for pipes and logs (no 80-column squeeze)."""
    c = Console()
    return c if c.is_terminal else Console(width=200)


def print_grid(spec: ExperimentSpec) -> None:
    console = wide_console()
    table = Table(
        title=f"{spec.name}: {len(spec.cells)} cells x {len(spec.seeds)} seeds = {spec.n_trials} trials"
    )
    table.add_column("#", justify="right")
    table.add_column("cell")
    table.add_column("overrides")
    table.add_column("baseline")
    for i, c in enumerate(spec.cells):
        over = ", ".join(f"{k}={v}" for k, v in c.overrides.items())
        table.add_row(str(i), c.label, over, "yes" if c.label == spec.baseline else "")
    console.print(table)
    console.print(
        f"seeds {spec.seeds}; {spec.steps} steps per run; step budget {spec.n_trials * spec.steps} "
        f"steps; ranking metric {spec.metric} ({spec.direction}); grid hash {spec.grid_hash()}"
    )


def print_status(storage: Any, study_name: str | None) -> None:
    """One row per study; below the table, each study's distinct failure reasons with counts
    (all of them for a named study, the three most frequent otherwise)."""
    import optuna

    from harness.core.failures import count_reasons, reason_lines

    console = wide_console()
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    names = [s.study_name for s in summaries]
    if study_name is not None and study_name not in names:
        from harness.core.configtools import ConfigError

        raise ConfigError(
            f"study: no study named {study_name!r} (studies: {', '.join(names) or 'none'})"
        )
    table = Table(title="studies")
    for col in ("study", "done", "pruned", "diverged", "running", "waiting", "failed", "total"):
        table.add_column(col, justify="right" if col != "study" else "left")
    failures: list[tuple[str, list[tuple[str, int]]]] = []
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
    console.print(table)
    limit = None if study_name is not None else 3
    for name, counted in failures:
        # print(), not rich: a reason is the user's text and may hold [markup]
        print(f"{name}: why trials failed")
        for line in reason_lines(counted[:limit], "trial"):
            print(f"  {line}")
        if limit is not None and len(counted) > limit:
            print(f"  ... {len(counted) - limit} more reasons: harness status {name}")
