"""Terminal tables for `harness ablate --dry-run` and `harness status`."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.experiment import ExperimentSpec


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
    import optuna

    console = wide_console()
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    names = [s.study_name for s in summaries]
    if study_name is not None and study_name not in names:
        from harness.configtools import ConfigError

        raise ConfigError(
            f"study: no study named {study_name!r} (studies: {', '.join(names) or 'none'})"
        )
    table = Table(title="studies")
    for col in (
        "study",
        "done",
        "diverged",
        "running",
        "waiting",
        "failed",
        "total (cells x seeds)",
    ):
        table.add_column(col, justify="right" if col != "study" else "left")
    for name in names:
        if study_name is not None and name != study_name:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        states: Counter[str] = Counter()
        latest: dict[tuple[Any, Any], Any] = {}
        for t in study.get_trials(deepcopy=False):
            key = (t.user_attrs.get("cell"), t.user_attrs.get("seed"))
            latest[key] = t
        for t in latest.values():
            s = t.state.name
            if s == "FAIL" and t.user_attrs.get("outcome") == "diverged":
                s = "DIVERGED"
            states[s] += 1
        import json

        spec = json.loads(study.user_attrs.get("harness.spec", "{}"))
        total = len(spec.get("cells", {})) * len(spec.get("seeds", [])) if spec else len(latest)
        table.add_row(
            name,
            str(states["COMPLETE"]),
            str(states["DIVERGED"]),
            str(states["RUNNING"]),
            str(states["WAITING"]),
            str(states["FAIL"]),
            str(total),
        )
    console.print(table)
