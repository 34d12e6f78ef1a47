"""``harness export``: one cell (or a finished study's best point) as another framework's
settings: TRL GRPOConfig code, verl Hydra overrides, AReaL YAML or prime-rl TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, Storage, user_errors


@user_errors
def export_cmd(
    file: Annotated[Path, typer.Argument(help="Experiment file.")],
    to: Annotated[
        str, typer.Option("--to", help="Target framework: trl, verl, areal or prime-rl.")
    ],
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
    """Print one cell's settings as TRL GRPOConfig code, verl Hydra overrides, AReaL YAML or
    prime-rl TOML.
    --best takes a finished study's top cell (a grid) or best trial (a search), with its
    uncertainty as a comment; a study in which no run completed is refused (exit 2).

    The experiment file is validated first, which imports python: task modules (runs their code).
    """
    from harness.cli.commands.export import print_export  # noqa: PLC0415 - a command's body loads when it runs

    print_export(
        file,
        to=to,
        cell=cell,
        best=best,
        study_name=study_name,
        storage=storage,
        results_dir=results_dir,
    )
