"""``harness run`` (one PPO run) and ``harness fields`` (what ``--set`` and grid axes take)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.options import ResultsDir, TrackingUri, fail, user_errors


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
    from harness import tracking
    from harness.config import load_run_config
    from harness.sweep.launching.launch_checks import check_devices
    from harness.sweep.stores.opening import check_store_urls

    cfg = load_run_config(config, set_ or [])
    check_devices([cfg.device], "device")
    check_store_urls(None, tracking_uri)
    tracking.probe_tracking_uri(tracking_uri)
    tracker = tracking.open_tracker(tracking_uri, results_dir)

    from harness.cli.console import run_with_progress
    from harness.run.tracked import Terminated, interrupt_reason, signals_interrupt
    from harness.tasks.base import RewardError

    try:
        # SIGTERM/SIGHUP as Ctrl-C: the run is closed KILLED with the reason, not left RUNNING.
        with signals_interrupt():
            result, rid = run_with_progress(
                cfg,
                tracker,
                experiment=experiment,
                run_name=run_name or f"{cfg.task}-seed{cfg.seed}",
                results_dir=results_dir,
            )
    except KeyboardInterrupt as err:
        # Closed KILLED with this reason (harness.run.tracked); the shell's code for the signal.
        code = 128 + (err.signum if isinstance(err, Terminated) else signal.SIGINT)
        fail(f"run KILLED: {interrupt_reason(err)}", code=code)
    except SystemExit as err:  # library code that exits mid-run: closed FAILED with the reason
        fail(f"run FAILED: SystemExit: {err.code!r} (sys.exit during the run)", code=1)
    except RewardError as err:
        # The MLflow run is already ended FAILED with this reason (harness.run.tracked): a run
        # failure, not bad input, so exit 1 with the reason and no traceback.
        fail(f"run FAILED: {err}", code=1)
    except (RuntimeError, MemoryError) as err:  # out of memory, a device or library error
        # Recorded as the MLflow run's reason too; a run failure, so exit 1, not 2.
        text = str(err).strip().splitlines()
        fail(f"run FAILED: {type(err).__name__}: {text[0] if text else ''}"[:500], code=1)
    if result.status != "completed":
        sys.exit(1)


def fields_cmd(
    prefix: Annotated[
        str, typer.Argument(help="Only fields under this dotted prefix, e.g. ppo.")
    ] = "",
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print docs/fields.md (every field, as Markdown).")
    ] = False,
) -> None:
    """List every run-config field (dotted path, default, help) — what --set and grid axes take."""
    from rich.console import Console

    if markdown:
        typer.echo(fields_markdown(), nl=False)
        return
    rows = [row for row in field_rows() if row[0].startswith(prefix)]
    if not sys.stdout.isatty():
        # Piped (`harness fields | grep lora`): one whole line per field, tab-separated, so no
        # dotted name is cut at a table column's width.
        for row in rows:
            typer.echo("\t".join(row))
        return
    Console().print(fields_table(rows))


def field_rows() -> list[tuple[str, str, str]]:
    """``(dotted path, default, help)`` for every run-config field. ``task_options`` is a free
    dict in the schema, so its row is replaced by each task source's options (the source in
    brackets), which is what the field accepts."""
    from harness.config import RunConfig
    from harness.core.configtools import field_defaults, field_help
    from harness.tasks import option_table

    defaults = field_defaults(RunConfig)
    rows = []
    for path, text in field_help(RunConfig).items():
        if path != "task_options":
            rows.append((path, repr(defaults.get(path)), text))
            continue
        for source, name, default, help_text in option_table():
            rows.append((name, default, f"[{source}] {help_text}"))
    return rows


def fields_markdown() -> str:
    """``docs/fields.md``: every run-config field and every task source's options
    (``harness fields --markdown > docs/fields.md``; a test keeps the page in step)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "# Fields",
        "",
        "Every run-config field: what `--set key=value`, a run config file and an experiment "
        "file's grid axes accept, with its default and help (generated: "
        "`harness fields --markdown > docs/fields.md`; `harness fields [PREFIX]` prints the same "
        "in a terminal). Ranges are checked before anything runs: a value outside one is one "
        "line on stderr naming the field, exit code 2.",
        "",
        "`task_options` depends on the task: each row names the task source it belongs to in "
        "brackets ([your own task](tasks.md) describes each source).",
        "",
    ]
    sections: dict[str, list[str]] = {}  # top-level fields first, then each block in order
    sections["Top level"] = []
    for path, default, text in field_rows():
        top = f"`{path.split('.')[0]}`" if "." in path else "Top level"
        sections.setdefault(top, []).append(f"| `{path}` | `{cell(default)}` | {cell(text)} |")
    for title, rows in sections.items():
        lines += [f"## {title}", "", "| field | default | help |", "|---|---|---|", *rows, ""]
    return "\n".join(lines).rstrip() + "\n"


def fields_table(rows: list[tuple[str, str, str]]) -> Any:
    """The terminal table of ``harness fields``: whole dotted names, help text taken literally."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    # A dotted name is what --set takes: never cut it; the help column wraps instead.
    table.add_column("field", no_wrap=True, min_width=max((len(r[0]) for r in rows), default=5))
    table.add_column("default")
    table.add_column("help")
    for row in rows:  # help texts hold literal brackets ([q_proj, v_proj]): not rich markup
        table.add_row(*(escape(cell) for cell in row))
    return table
