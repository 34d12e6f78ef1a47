"""``build_report``, which writes a report (report.md, report.html, runs.csv and the plots) from
a ``StudyData`` alone, in the order of its sections: :mod:`~harness.report.header`, the
conclusion and warnings (:mod:`~harness.report.prose`), :mod:`~harness.report.sections` with
the tables of :mod:`~harness.report.tables`, and the figures of :mod:`~harness.report.plots`."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.fsutil import atomic_write
from harness.report.adaptive import adaptive_section
from harness.report.format import _code
from harness.report.header import header_section
from harness.report.plots import (
    PlotFile,
    plot_clip_fractions,
    plot_intervals,
    plot_metric_curves,
    plot_performance_profile,
)
from harness.report.prose import conclusion, warnings_for
from harness.report.render import _Doc
from harness.report.scores import APPROX_KL, REWARD, DivergedPolicy, fit_curves, ranking
from harness.report.sections import (
    factor_section,
    fit_section,
    fixed_section,
    measured_sections,
    ranking_section,
    summary_section,
)
from harness.report.studydata import CellRow, StudyData
from harness.report.tables import RUNS_CSV, runs_csv


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`build_report` wrote (the CLI logs these as MLflow artifacts)."""

    markdown: Path
    html: Path
    pngs: list[Path]
    runs_csv: Path | None = None  # every run, one row each (for notebooks)


PLOT_DIR = "plots"
_CURVES = (
    # (file stem, history key, title, y label, sparse)
    ("reward", REWARD, "Reward per step", "mean reward of the batch", False),
    ("eval_accuracy", "eval/accuracy", "Eval accuracy", "greedy exact-match accuracy", True),
    ("approx_kl", APPROX_KL, "Approximate KL per update", "approx KL (k3)", False),
    ("grad_norm", "stability/grad_norm", "Gradient norm (before clipping)", "grad norm", False),
    ("entropy", "policy/entropy", "Policy entropy", "entropy (nats/token)", False),
    ("behave_ess", "policy/behave_ess", "Behaviour-weight ESS", "ESS / tokens", False),
)
#: The clip-fraction panels come after this many of the curves (reward and eval accuracy).
_CLIP_FRACTIONS_AT = 2


#: Line plots draw at most this many cells: past ~8 lines (and their legend) a figure is
#: mostly legend, and the ranking table already lists every cell.
MAX_PLOTTED_CELLS = 8


def plotted_cells(data: StudyData, rows: Sequence[CellRow]) -> list[str]:
    """The cells the line plots draw: all of them up to :data:`MAX_PLOTTED_CELLS`, else the top
    of the ranking and the baseline, in grid order (so each keeps its colour order)."""
    if len(data.cells) <= MAX_PLOTTED_CELLS:
        return list(data.cells)
    keep = {data.baseline} if data.baseline in data.cells else set()
    for r in rows:
        if len(keep) >= MAX_PLOTTED_CELLS:
            break
        keep.add(r.label)
    return [c for c in data.cells if c in keep]


def _plots(
    data: StudyData, rows: Sequence[CellRow], plot_dir: Path, n_boot: int, seed: int
) -> tuple[list[PlotFile], list[str]]:
    """Draw every figure; returns the written ones and the metrics that nobody logged."""
    written: list[PlotFile] = []
    absent: list[str] = []
    shown = plotted_cells(data, rows)

    def keep(p: PlotFile | None, what: str) -> None:
        if p is None:
            absent.append(what)
        else:
            written.append(p)

    for i, (stem, key, title, ylabel, sparse) in enumerate(_CURVES):
        if i == _CLIP_FRACTIONS_AT:
            keep(
                plot_clip_fractions(data, plot_dir / "clip_fractions.png", cells=shown),
                "policy/clipfrac_*",
            )
        keep(
            plot_metric_curves(
                data,
                key,
                plot_dir / f"{stem}.png",
                title=title,
                ylabel=ylabel,
                markers=sparse,
                cells=shown,
            ),
            key,
        )
    scored = [
        plot_intervals(rows, data, plot_dir / "intervals.png"),
        plot_performance_profile(
            rows,
            data,
            plot_dir / "performance_profile.png",
            n_boot=n_boot,
            seed=seed,
            cells=shown,
        ),
    ]
    written += [p for p in scored if p is not None]
    return written, absent


def build_report(
    data: StudyData,
    out_dir: Path,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    diverged: DivergedPolicy = "worst",
    fit: bool = True,
) -> ReportFiles:
    """Write ``out_dir/report.md``, ``out_dir/report.html``, ``out_dir/runs.csv`` (every run,
    one row each) and ``out_dir/plots/*.png``.

    The HTML is self-contained (inline CSS, PNGs as base64 data URIs, no scripts, no external
    resources) so it can be mailed or attached to an MLflow run and still open.  The markdown
    links the PNGs relatively.  Sections: header (an interim banner while the study runs; study,
    varied axes and cells, command), conclusion, seeds that decide (adaptive), warnings,
    ranking, factor effects (factorial grids), stability summaries, pass@k / correction /
    mismatch split (where measured), plots, saturating fits (``fit=True``), held-fixed config.
    """
    out_dir = Path(out_dir)
    plot_dir = out_dir / PLOT_DIR
    plot_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = ranking(data, n_boot=n_boot, seed=seed, diverged=diverged)
    plots, absent = _plots(data, rows, plot_dir, n_boot, seed)
    doc = _Doc()
    header_section(doc, data, rows)
    doc.heading(2, "Conclusion")
    doc.bullets(conclusion(rows, data), css="conclusion")
    adaptive_section(doc, data)
    doc.heading(2, "Warnings")
    warns = warnings_for(rows, data)
    if warns:
        doc.bullets(warns, css="warnings")
    else:
        # What an empty list vouches for: an adaptive study lets its decided cells out of the
        # "too few seeds" warning, so there the seed rule, not CI separation, is the claim.
        settled = (
            "every cell is decided by the seed rule or separates from the baseline"
            if data.adaptive
            else "every cell's CI separates from the baseline's"
        )
        doc.para(
            f"None: no inert clipping, no diverged or failed runs, no collapses, and {settled}."
        )
    ranking_section(doc, data, rows, n_boot, seed, diverged)
    doc.para(
        f"Every run (cell, axis levels, seed, status, score, reason, summaries) is in "
        f"[{RUNS_CSV}]({RUNS_CSV}) beside this report."
    )
    factor_section(doc, data, rows)
    summary_section(doc, data)
    measured_sections(doc, data)
    doc.heading(2, "Plots")
    if absent:
        doc.para("Not logged by any run (no plot): " + ", ".join(_code(a) for a in absent) + ".")
    if not any(math.isfinite(r.iqm.point) for r in rows):
        doc.para("No run has a score yet, so there is no interval plot or performance profile.")
    for p in plots:
        doc.figure(p, f"{PLOT_DIR}/{p.path.name}")
    if fit:
        fit_section(doc, fit_curves(data))
    fixed_section(doc, data)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    # Each file is replaced whole, so two coordinators reporting on one study at once (or a
    # full disk) leave a complete report, never a missing or half-written file.
    atomic_write(md_path, "\n".join(doc.md).rstrip() + "\n")
    atomic_write(html_path, doc.render_html(f"Ablation report: {data.study}"))
    csv_path = out_dir / RUNS_CSV
    atomic_write(csv_path, runs_csv(data, rows))
    _remove_stale_plots(plot_dir, {p.path.name for p in plots}, started)
    return ReportFiles(
        markdown=md_path, html=html_path, pngs=[p.path for p in plots], runs_csv=csv_path
    )


def _remove_stale_plots(plot_dir: Path, keep: set[str], started: float) -> None:
    """Remove plots of an earlier report that this one no longer draws (a metric no longer
    logged).  Plots written since this report started belong to a concurrent writer: kept."""
    for png in plot_dir.glob("*.png"):
        if png.name in keep:
            continue
        try:
            if png.stat().st_mtime < started:
                png.unlink()
        except FileNotFoundError:
            pass  # another writer removed it first
