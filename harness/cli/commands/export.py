"""The body of ``harness export``: one cell (or a finished study's best point) as another
framework's settings."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.options import say
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError
from harness.peers.export import TARGETS
from harness.sweep.present.cell_export import export_cell
from harness.sweep.scheduler.cell_choice import best_to_export, resolve_cell
from harness.sweep.scheduler.spec import HASH_ATTR, StudySpec, load_study_spec
from harness.sweep.stores.opening import check_store_urls, load_existing_study
from harness.sweep.stores.storage import make_storage


def print_export(
    file: Path,
    *,
    to: str,
    cell: str | None,
    best: bool,
    study_name: str | None,
    storage: str | None,
    results_dir: Path,
) -> None:
    """Print one cell's settings (``cell``), or the top of the finished study of ``file``
    (``best``), as ``to``'s settings: TRL GRPOConfig code, verl Hydra overrides or AReaL YAML."""
    if to not in TARGETS:
        raise ConfigError(f"--to must be one of {', '.join(TARGETS)}; got {to!r}")
    if (cell is None) == (not best):
        raise ConfigError("give exactly one of --cell or --best")
    spec = load_experiment(file)
    notes: list[str] = []
    if best:
        check_store_urls(storage, None, writable=False)
        name = study_name or spec.name
        if storage is None and not (results_dir / "optuna-journal.log").exists():
            raise ConfigError(f"--best: no study store under {results_dir} (run the sweep first)")
        st = load_existing_study(
            name,
            make_storage(storage, results_dir),
            f"--best: no study named {name!r} (see `harness status`)",
        )
        study_spec = load_study_spec(st)
        label, overrides, notes = best_to_export(study_spec, st)
        now = StudySpec.from_experiment(spec).grid_hash
        if st.user_attrs.get(HASH_ATTR) not in (None, now):
            # As `ablate` refuses a changed grid: say it; export what the study ran.
            changed = (
                f"{file} changed since study {name!r} ran (hash {st.user_attrs[HASH_ATTR]} != "
                f"{now}): these are the settings the study ran, not the file's"
            )
            say(f"warning: {changed}")
            notes.append(changed)
    else:
        if spec.search is not None:
            raise ConfigError(
                f"{file}: --cell needs a grid experiment (this one is a search; use --best)"
            )
        assert cell is not None
        label, overrides = resolve_cell(spec, cell)
        study_spec = StudySpec.from_experiment(spec)
    cfg = study_spec.run_config(overrides, seed=None)
    what = "point" if study_spec.kind == "search" else "cell"
    header = [f"harness {what} {label!r} of {file} for {to}", *notes]
    typer.echo(export_cell(cfg, to, header), nl=False)
