"""The ``harness`` command line.  Thin: every command imports its heavy modules lazily so that
``harness --help`` answers at once, and turns bad input into one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

app = typer.Typer(
    help="Ablation harness for PPO fine-tuning of language models: which clipping and "
    "normalization settings keep a PPO run stable?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


@app.callback()
def _root() -> None:
    """Ablation harness for PPO fine-tuning of language models."""

ResultsDir = Annotated[
    Path, typer.Option("--results-dir", help="Where embedded stores, caches and reports go.")
]
TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI (default sqlite:///RESULTS/mlflow.db; http(s)://host:port for a server).",
    ),
]


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """Bad input → ``error: <one line>`` on stderr, exit code 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from harness.configtools import ConfigError

        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            fail(str(err).splitlines()[0])

    return wrapper  # type: ignore[return-value]


@app.command("run")
@user_errors
def run_cmd(
    config: Annotated[Path | None, typer.Argument(help="Run config YAML (omit for the defaults).")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a config key, e.g. --set ppo.eps_clip=0.3 (repeatable)."),
    ] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment name.")] = "harness-run",
    run_name: Annotated[str | None, typer.Option(help="MLflow run name.")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Train one PPO policy, log it to MLflow and print a final summary."""
    from harness.config import load_run_config
    from harness.configtools import ConfigError
    from harness.fsutil import ensure_results_dir

    cfg = load_run_config(config, set_ or [])
    try:
        ensure_results_dir(results_dir)
        from harness.tracking import make_tracker

        tracker = make_tracker(tracking_uri, results_dir)
    except ValueError as err:
        raise ConfigError(str(err)) from None

    from harness.console import run_with_progress

    result, rid = run_with_progress(
        cfg, tracker, experiment=experiment, run_name=run_name or f"{cfg.task}-seed{cfg.seed}", results_dir=results_dir
    )
    if result.status != "completed":
        sys.exit(1)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
