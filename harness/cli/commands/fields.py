"""The body of ``harness fields``: every run-config field (dotted path, default, help), which is
what ``--set`` and grid axes take, as a table, tab-separated lines or ``docs/fields.md``."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.config import RunConfig
from harness.config.loading import SAMPLER_BLOCK, SAMPLER_KEYS
from harness.core.fields import field_defaults, field_help
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
        if path == "rollout.sampler_dtype":  # the block form of the sampler's fields first
            rows.extend(sampler_block_rows())
        if path != "task_options":
            rows.append((path, repr(defaults.get(path)), text))
            continue
        for source, name, default, help_text in option_table():
            rows.append((name, default, f"[{source}] {help_text}"))
    return rows


# What each key of the ``rollout.sampler`` block is (harness.config.loading.SAMPLER_KEYS).
_SAMPLER_HELP = {
    "backend": (
        "'local'",
        "The rollout sampler's backend (harness/sampling/): local = the "
        "policy module sampled in the run's process, vllm = the vLLM inference engine.",
    ),
    "decoder": ("'auto'", "backend local: its decoder, auto, fast or hf."),
    "dtype": ("None", "Precision of the sampler's forward."),
    "logit_noise": ("0.0", "backend local: σ of seeded Gaussian noise on its logits."),
    "kv_cache_gib": ("1", "backend vllm on CPU: GiB of KV cache."),
    "gpu_memory_utilization": ("0.3", "backend vllm on CUDA: the share of GPU memory it may take."),
}


def sampler_block_rows() -> list[tuple[str, str, str]]:
    """The ``rollout.sampler`` block's keys, each the other spelling of a flat ``rollout`` field
    (both are accepted in files, ``--set`` and grid axes; the block's value wins)."""
    same = {k: f"Same as {path}." for k, path in SAMPLER_KEYS.items()}
    same["backend"] = "vllm is rollout.sampler_backend: vllm; local, any of its decoders."
    return [
        (f"{SAMPLER_BLOCK}.{key}", default, f"{text} {same[key]}")
        for key, (default, text) in _SAMPLER_HELP.items()
    ]


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
