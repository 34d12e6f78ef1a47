"""The body of ``harness fields``: every run-config field (dotted path, default, help), which is
what ``--set`` and grid axes take, as a table, tab-separated lines or ``docs/fields.md``."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.config import RunConfig
from harness.core.configtools import field_defaults, field_help
from harness.tasks import option_table


def print_fields(prefix: str, *, markdown: bool) -> None:
    """Every run-config field under ``prefix``: a table in a terminal, tab-separated lines in a
    pipe, or ``docs/fields.md`` with ``markdown``."""
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


def fields_table(rows: list[tuple[str, str, str]]) -> Table:
    """The terminal table of ``harness fields``: whole dotted names, help text taken literally."""
    table = Table(show_header=True, header_style="bold")
    # A dotted name is what --set takes: never cut it; the help column wraps instead.
    table.add_column("field", no_wrap=True, min_width=max((len(r[0]) for r in rows), default=5))
    table.add_column("default")
    table.add_column("help")
    for row in rows:  # help texts hold literal brackets ([q_proj, v_proj]): not rich markup
        table.add_row(*(escape(cell) for cell in row))
    return table
