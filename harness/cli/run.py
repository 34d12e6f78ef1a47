"""``harness run`` (one PPO run) and ``harness fields`` (what ``--set`` and grid axes take)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ResultsDir, TrackingUri, user_errors


@user_errors
def run_cmd(
    config: Annotated[
        Path | None, typer.Argument(help="Run config YAML (omit for the defaults).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a config key, e.g. --set ppo.eps_clip=0.3 (repeatable)."
        ),
    ] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment name.")] = "harness-run",
    run_name: Annotated[str | None, typer.Option(help="MLflow run name.")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Train one PPO policy, log it to MLflow and print a final summary."""
    from harness.cli.commands.run import run_one  # noqa: PLC0415 - a command's body loads when it runs

    run_one(
        config,
        set_ or [],
        experiment=experiment,
        run_name=run_name,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
    )


def fields_cmd(
    prefix: Annotated[
        str, typer.Argument(help="Only fields under this dotted prefix, e.g. ppo.")
    ] = "",
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print docs/fields.md (every field, as Markdown).")
    ] = False,
) -> None:
    """List every run-config field (dotted path, default, help) — what --set and grid axes take."""
    from harness.cli.commands.fields import print_fields  # noqa: PLC0415 - a command's body loads when it runs

    print_fields(prefix, markdown=markdown)
