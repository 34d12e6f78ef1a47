"""``harness export``: one cell (or a finished study's best point) as another framework's
settings: TRL GRPOConfig code, verl Hydra overrides or AReaL YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, Storage, say, user_errors


@user_errors
def export_cmd(
    file: Annotated[Path, typer.Argument(help="Experiment file.")],
    to: Annotated[str, typer.Option("--to", help="Target framework: trl, verl or areal.")],
    cell: Annotated[
        str | None,
        typer.Option(help="The cell: its label, or KEY=VALUE pairs, e.g. 'eps_clip=0.2 c_clip=3'."),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="The top cell of the finished study of this file.")
    ] = False,
    study_name: Annotated[
        str | None, typer.Option(help="Study name for --best (default: the file's name).")
    ] = None,
    storage: Storage = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Print one cell's settings as TRL GRPOConfig code, verl Hydra overrides or AReaL YAML.
    --best takes a finished study's top cell (a grid) or best trial (a search), with its
    uncertainty as a comment; a study in which no run completed is refused (exit 2).

    The experiment file is validated first, which imports python: task modules (runs their code).
    """
    from harness.config.experiment import load_experiment
    from harness.core.configtools import ConfigError
    from harness.peers.export import TARGETS
    from harness.sweep.present.cell_export import export_cell
    from harness.sweep.scheduler.cell_choice import best_to_export, resolve_cell
    from harness.sweep.scheduler.spec import HASH_ATTR, StudySpec, load_study_spec

    if to not in TARGETS:
        raise ConfigError(f"--to must be one of {', '.join(TARGETS)}; got {to!r}")
    if (cell is None) == (not best):
        raise ConfigError("give exactly one of --cell or --best")
    spec = load_experiment(file)
    notes: list[str] = []
    if best:
        import optuna

        from harness.sweep.stores.opening import check_store_urls

        check_store_urls(storage, None, writable=False)
        name = study_name or spec.name
        if storage is None and not (results_dir / "optuna-journal.log").exists():
            raise ConfigError(f"--best: no study store under {results_dir} (run the sweep first)")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from harness.sweep.stores.storage import make_storage

        try:
            st = optuna.load_study(study_name=name, storage=make_storage(storage, results_dir))
        except KeyError:
            raise ConfigError(f"--best: no study named {name!r} (see `harness status`)") from None
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
