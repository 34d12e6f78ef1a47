"""The report's header: the study's facts (the runs, the seeds, the machines), what was varied
and the command that produced it."""

from __future__ import annotations

from collections.abc import Sequence

from harness.core.configtools import flatten
from harness.report.adaptive import interim_reason
from harness.report.format import _fmt_duration, value_str
from harness.report.render import _Doc
from harness.report.scores import _tasks_of
from harness.report.studydata import CellRow, RunData, StudyData


def header_section(doc: _Doc, data: StudyData, rows: Sequence[CellRow]) -> None:
    runs = data.runs
    count = {s: sum(r.status == s for r in runs) for s in ("completed", "diverged", "failed")}
    unfinished = sum(r.status in ("running", "waiting") for r in runs)
    tasks = _tasks_of(runs)
    doc.heading(1, f"Ablation report: {data.study}")
    interim = interim_reason(data)
    if interim:
        doc.para(
            f"**Interim report**: the study has not finished ({interim}). Rankings and "
            "intervals are provisional, and no verdict is given that the study's rule has not "
            "taken yet. Run `harness report` again when it ends."
        )
    if data.description:
        doc.para(data.description.strip())
    facts = [
        ("study", data.study),
        ("experiment", data.experiment),
        ("metric", f"{data.metric} ({data.direction})"),
        ("baseline", data.baseline or "none"),
        ("cells", str(len(data.cells))),
        ("seeds", _seeds_fact(data)),
        ("steps per run", str(data.steps)),
        (
            "runs",
            f"{len(runs)}: {count['completed']} completed, {count['diverged']} diverged, "
            f"{count['failed']} failed, {unfinished} unfinished",
        ),
        ("wall time (sum over runs)", _fmt_duration(data.wall_time)),
    ]
    if tasks != [""]:
        facts.insert(-1, ("tasks", ", ".join(t or "(unnamed)" for t in tasks)))
    machines = _machines_of(runs)
    if machines:
        facts.append(("machine" if len(machines) == 1 else "machines", "; ".join(machines)))
    doc.table(["", "value"], [list(f) for f in facts])
    if machines:
        doc.para(
            "The scores are this machine's: a PPO run amplifies the last bits of the CPU's "
            "kernels, which differ by processor and instruction set, so the same seeds give "
            "other values elsewhere. What carries across machines is the direction of a "
            "difference and whether it is decided, not its digits."
        )
    doc.heading(2, "What was varied")
    doc.table(
        ["axis", "values"],
        [[k, ", ".join(value_str(v) for v in vs)] for k, vs in data.axes.items()],
        code_col=0,
    )
    by_label = {r.label: r for r in rows}
    doc.table(
        ["cell", "overrides", "runs"],
        [
            [
                label,
                ", ".join(f"{k}={value_str(v)}" for k, v in flatten(ov).items()) or "(base)",
                f"{by_label[label].n_seeds}" if label in by_label else "0",
            ]
            for label, ov in data.cells.items()
        ],
        code_col=0,
    )
    if data.command:
        doc.para("Produced by:")
        doc.code(data.command)


def _machines_of(runs: list[RunData]) -> list[str]:
    """The distinct machines the runs recorded, in first-seen order (none for older studies)."""
    seen: list[str] = []
    for r in runs:
        if r.machine and r.machine not in seen:
            seen.append(r.machine)
    return seen


def _seeds_fact(data: StudyData) -> str:
    """How many seeds and which: "1 (seed 0)", "2 (seeds 0, 1)", "10 (seeds 0–9)"."""
    if data.adaptive is None:
        return seeds_text(data.seeds)
    a = data.adaptive
    return (
        f"adaptive: {a['min']} to {a['max']} per cell, {a['batch']} per look, decide "
        f"{a['decide']} (see Seeds that decide)"
    )


def seeds_text(seeds: Sequence[int]) -> str:
    """The count, then the seeds, runs of consecutive seeds as ranges: a bare "0" read as a
    count of zero seeds."""
    if not seeds:
        return "0"
    values = sorted(set(seeds))
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    parts = [f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(str(v) for v in r) for r in runs]
    word = "seed" if len(values) == 1 else "seeds"
    return f"{len(values)} ({word} {', '.join(parts)})"
