"""What a report contains, section by section, and ``build_report``, which writes it (report.md,
report.html and the plots) from a ``StudyData`` alone."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.configtools import flatten
from harness.core.fsutil import atomic_write
from harness.report.adaptive import adaptive_section, interim_reason
from harness.report.factors import cell_choices, level_key, study_effects
from harness.report.format import _code, _fmt_duration, fmt, level_str
from harness.report.plots import (
    PlotFile,
    plot_clip_fractions,
    plot_intervals,
    plot_metric_curves,
    plot_performance_profile,
    step_matrix,
)
from harness.report.prose import conclusion, warnings_for
from harness.report.render import RANKING_HEADER, _Doc, _ranking_cells
from harness.report.scores import (
    APPROX_KL,
    MIN_COLLAPSE_PEAK,
    MIN_COLLAPSE_STEPS,
    REWARD,
    CurveFitRow,
    DivergedPolicy,
    _mean_finite,
    _tasks_of,
    _worst_by_task,
    fit_curves,
    paired_ranking,
    ranking,
)
from harness.report.studydata import CellRow, RunData, StudyData


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

    for stem, key, title, ylabel, sparse in _CURVES[:2]:
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
    keep(
        plot_clip_fractions(data, plot_dir / "clip_fractions.png", cells=shown),
        "policy/clipfrac_*",
    )
    for stem, key, title, ylabel, sparse in _CURVES[2:]:
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


def _header(doc: _Doc, data: StudyData, rows: Sequence[CellRow]) -> None:
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
        [[k, ", ".join(_value_str(v) for v in vs)] for k, vs in data.axes.items()],
        code_col=0,
    )
    by_label = {r.label: r for r in rows}
    doc.table(
        ["cell", "overrides", "runs"],
        [
            [
                label,
                ", ".join(f"{k}={_value_str(v)}" for k, v in flatten(ov).items()) or "(base)",
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


def _ranking_section(
    doc: _Doc,
    data: StudyData,
    rows: Sequence[CellRow],
    n_boot: int,
    seed: int,
    diverged: DivergedPolicy,
) -> None:
    doc.heading(2, "Ranking")
    strat = len(_tasks_of(data.runs)) > 1
    worst = _worst_by_task(data)
    if diverged == "worst":
        wtxt = ", ".join(f"{fmt(v)}" + (f" on {t}" if t else "") for t, v in sorted(worst.items()))
        div_txt = (
            "Diverged runs are **scored as the worst value of the metric observed in the study** "
            f"on their task ({wtxt or '—'}), so divergence counts against a cell"
        )
    else:
        div_txt = "Diverged runs are **left out of the statistics** (and counted)"
    doc.para(
        f"Cells ranked by the IQM (25 % trimmed mean) of each run's {_code(data.metric)} "
        f"({'higher' if data.direction == 'maximize' else 'lower'} is better). Intervals are 95 % "
        f"percentile-bootstrap CIs ({n_boot} resamples, seed {seed}"
        + ("; stratified: runs resampled within each task" if strat else "")
        + f"). {div_txt}; failed and unfinished runs have no score and are left out. "
        "P(improve) is the probability that a run of the cell beats a run of the baseline "
        "(ties count half). Collapse = share of runs flagged `stability/collapsed` among runs "
        f"long enough to tell (at least {MIN_COLLAPSE_STEPS} logged rewards, smoothed peak at "
        f"least {fmt(MIN_COLLAPSE_PEAK)}; — when none is); final KL = "
        "mean over runs of the last logged `policy/approx_kl`; clip fractions = mean over runs of "
        "the last 10 % of logged steps."
    )
    header = list(RANKING_HEADER)
    cells = [_ranking_cells(i, r) for i, r in enumerate(rows, 1)]
    if paired_ranking(data):
        doc.para(
            "The cells of this adaptive study ran different numbers of seeds (a decided cell "
            "stops early), so IQMs over their own seeds are not comparable: the cells are "
            "**ranked by the mean paired difference from the baseline on the seeds both ran** "
            "(the pairs the seed rule decided on; > 0 is better), and P(improve) counts those "
            "pairs only. The IQM column stays each cell's own."
        )
        header.insert(2, "paired Δ vs baseline (seeds)")
        for row, r in zip(cells, rows, strict=True):
            row.insert(
                2,
                "0 (baseline)"
                if r.is_baseline
                else f"{r.paired_diff:+.3g} ({r.n_paired})"
                if r.n_paired
                else "—",
            )
    doc.table(header, cells, code_col=1)


SUMMARY_COLUMNS = (
    ("start/reward", "start reward"),
    ("final/reward", "final reward"),
    ("best/reward", "best reward"),
    ("final/eval_accuracy", "eval acc"),
    ("start/eval_reward", "start eval reward"),
    ("final/eval_reward", "final eval reward"),
    ("stability/entropy_ratio", "entropy end/start"),
    ("stability/mean_approx_kl", "mean KL"),
    ("stability/max_approx_kl", "max KL"),
    ("stability/kl_spikes", "KL spikes"),
    ("stability/grad_norm_spikes", "grad-norm spikes"),
    ("stability/mean_clipfrac", "clip frac (mean)"),
    ("stability/max_drawdown", "max drawdown"),
)

# Columns a study has only when its runs measured them: the training–inference mismatch
# (rollout.measure_mismatch; absent from studies recorded before it existed and from TRL runs).
OPTIONAL_SUMMARY_COLUMNS = (
    ("stability/mismatch_kl_k3_mean", "mismatch KL (mean)"),
    ("stability/mismatch_kl_k3_max", "mismatch KL (max)"),
)


def cell_config(data: StudyData, cell: str) -> dict[str, Any]:
    """A cell's flattened configuration: the base with the cell's overrides."""
    return {**flatten(data.base_config), **flatten(data.cells.get(cell, {}))}


_REDUCED = ("bfloat16", "float16", "bf16", "fp16", "half")


def mismatch_sources(config: dict[str, Any]) -> list[str]:
    """What in a (flattened) run configuration makes the sampler's log-probs differ from the
    learner's beyond float32 rounding (docs/mismatch.md): logit noise, a sampler precision
    other than the learner's, a reduced-precision learner, a lagging behaviour policy, or the
    inference engine as the sampler."""
    out = []
    noise = config.get("rollout.sampler_logit_noise") or 0.0
    if isinstance(noise, int | float) and noise > 0:
        out.append(f"rollout.sampler_logit_noise={noise:g}")
    learner = str(config.get("model_options.dtype") or "float32")
    if config.get("bf16") is True:
        learner = "bfloat16"
    sampler = config.get("rollout.sampler_dtype")
    if sampler is not None and str(sampler) != learner:
        out.append(f"rollout.sampler_dtype={sampler} (learner {learner})")
    elif learner in _REDUCED:
        out.append(f"{learner} learner and sampler")
    staleness = config.get("rollout.staleness") or 0
    if isinstance(staleness, int | float) and staleness > 0:
        out.append(f"rollout.staleness={staleness:g}")
    if config.get("rollout.sampler_backend") == "vllm":
        # Another program's kernels (fused attention, its own sampler) at any precision: the
        # mismatch the engine exists to measure.
        out.append("rollout.sampler_backend=vllm (the inference engine's kernels)")
    return out


def study_has_mismatch(data: StudyData) -> bool:
    """Some cell has a mismatch source: only then are the mismatch columns worth a reader's
    attention (with none, they hold float32 rounding, ~1e-13)."""
    return any(mismatch_sources(cell_config(data, c)) for c in data.cells)


def _columns(data: StudyData) -> list[tuple[str, str]]:
    logged = [
        (key, label)
        for key, label in OPTIONAL_SUMMARY_COLUMNS
        if any(math.isfinite(r.summary.get(key, math.nan)) for r in data.runs)
    ]
    present = logged if study_has_mismatch(data) else []
    return [*SUMMARY_COLUMNS, *present]


def summary_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """Per cell: the mean over its completed and diverged runs of each run-level summary (the
    optional columns only where some run of the study has the summary)."""
    columns = _columns(data)
    header = ["cell", "runs"] + [label for _, label in columns]
    rows = []
    for cell in data.cells:
        runs = [r for r in data.runs_of(cell) if r.status in ("completed", "diverged")]
        values = [
            fmt(_mean_finite(r.summary.get(key, math.nan) for r in runs)) for key, _ in columns
        ]
        rows.append([cell, str(len(runs)), *values])
    return header, rows


# Sampled evaluation (eval.samples > 0): pass@k before training is the start of the final's.
EVAL_SAMPLED_COLUMNS = (
    ("start/eval_pass_at_1", "pass@1 start"),
    ("final/eval_pass_at_1", "pass@1 final"),
    ("start/eval_pass_at_k", "pass@k start"),
    ("final/eval_pass_at_k", "pass@k final"),
)

# Per-step statistics of the correction and of the mismatch's parts, averaged over a run's
# logged steps: (history key, column label, when it means something).
CORRECTION_COLUMNS = (
    ("policy/correction_masked_frac", "masked frac"),
    ("policy/correction_truncated_frac", "truncated frac"),
    ("policy/behave_weight_min", "weight min"),
    ("policy/behave_weight_max", "weight max"),
    ("policy/behave_ess", "weight ESS"),
)
MISMATCH_SPLIT_COLUMNS = (
    ("mismatch/numerics_kl_k3", "numerics KL (k3)"),
    ("mismatch/lag_kl_k3", "policy-lag KL (k3)"),
)


def _run_mean(run: Any, key: str) -> float:
    """Mean of a run's finite logged values of ``key`` (NaN when it logged none)."""
    a = step_matrix([run], key)[0]
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def measured_table(
    data: StudyData, columns: Sequence[tuple[str, str]], *, history: bool
) -> tuple[list[str], list[list[str]]] | None:
    """Per cell, the mean over its completed and diverged runs of each column some run of the
    study measured (a run summary, or the run's mean over steps of a logged metric with
    ``history``); None when no run measured any of them."""

    def value(run: Any, key: str) -> float:
        return _run_mean(run, key) if history else run.summary.get(key, math.nan)

    ran = [r for r in data.runs if r.status in ("completed", "diverged")]
    present = [(k, lab) for k, lab in columns if any(math.isfinite(value(r, k)) for r in ran)]
    if not present:
        return None
    rows = []
    for cell in data.cells:
        runs = [r for r in data.runs_of(cell) if r.status in ("completed", "diverged")]
        rows.append(
            [cell, str(len(runs))]
            + [fmt(_mean_finite(value(r, k) for r in runs)) for k, _ in present]
        )
    return ["cell", "runs"] + [lab for _, lab in present], rows


def _with_k(
    data: StudyData, header: list[str], rows: list[list[str]]
) -> tuple[list[str], list[list[str]], str]:
    """The pass@k table with its k said: in the column names when every cell has the same
    ``eval.k``, in a column of its own when they differ; and how the paragraph names k."""
    ks = {c: cell_config(data, c).get("eval.k") for c in data.cells}
    distinct = set(ks.values())
    if distinct == {None}:
        return header, rows, "k = `eval.k`, not recorded in this study"
    if len(distinct) == 1:
        (k,) = distinct
        return [h.replace("pass@k", f"pass@{k}") for h in header], rows, f"k = `eval.k` = {k}"
    by_label = dict(zip(data.cells, rows, strict=True))
    return (
        [*header[:2], "k", *header[2:]],
        [
            [*row[:2], _value_str(ks[c]) if ks[c] is not None else "—", *row[2:]]
            for c, row in by_label.items()
        ],
        "k = `eval.k`, per cell in the column k",
    )


def _measured_sections(doc: _Doc, data: StudyData) -> None:
    """pass@k, the correction's own statistics and the mismatch's numerics/lag parts, each
    where the study measured them."""
    sampled = measured_table(data, EVAL_SAMPLED_COLUMNS, history=False)
    if sampled:
        header, table, k_said = _with_k(data, *sampled)
        doc.heading(2, "Sampled evaluation: pass@1 and pass@k")
        doc.para(
            "With `eval.samples` > 0 every eval also samples completions of each held-out prompt "
            f"at the rollout temperature: pass@1 and pass@k ({k_said}) are the unbiased "
            "estimates 1 − C(n−c, k)/C(n, k) averaged over prompts (c of n samples pass "
            "`eval.threshold`). *start* is before the first update, *final* the last eval; "
            "means over each cell's runs."
        )
        doc.table(header, table, code_col=0)
    corr = measured_table(data, CORRECTION_COLUMNS, history=True)
    if corr:
        doc.heading(2, "The correction's own statistics")
        doc.para(
            "Means over each run's logged steps, then over the cell's runs: the fraction of "
            "valid tokens the correction took out of the loss (masked) or whose weight it "
            "clipped (truncated), and the spread of the behaviour weights it applied (smallest, "
            "largest, effective sample size as a fraction of tokens); docs/corrections.md."
        )
        doc.table(*corr, code_col=0)
    split = (
        measured_table(data, MISMATCH_SPLIT_COLUMNS, history=True)
        if study_has_mismatch(data)
        else None
    )
    if split:
        doc.heading(2, "Mismatch: numerics and policy lag")
        doc.para(
            "The sampler-vs-learner KL split into its numerics part (the sampler against the "
            "learner's forward of the same weights) and its policy-lag part (those weights "
            "against the current ones, 0 without `rollout.staleness`); means over logged steps "
            "and runs (docs/mismatch.md)."
        )
        doc.table(*split, code_col=0)


def _summary_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "Stability summaries per cell")
    mismatch = (
        "; mismatch KL = the k3 estimate of KL(π_sampler ‖ π_learner) per step, "
        "docs/mismatch.md, shown because a cell has a mismatch source"
        if study_has_mismatch(data)
        else ""
    )
    doc.para(
        "Mean over each cell's completed and diverged runs of the run-level summaries defined in "
        "docs/stability.md (start reward = mean of the first 10 steps' batch reward; **eval "
        "acc** = fraction of the held-out prompts whose greedy completion scores at least "
        "`eval.threshold` (exact answers on the built-in tasks), at the last eval; **eval "
        "reward** = the mean reward of those same greedy completions, before the first update "
        "(start) and at the last eval (final); entropy end/start < 1 "
        "means the policy sharpened; spikes are steps per run above 5× the run's own running "
        "median, so a KL that is high throughout is not a spike; clip frac = mean "
        f"policy/clipfrac{mismatch})."
    )
    header, rows = summary_table(data)
    doc.table(header, rows, code_col=0)


def _factor_section(doc: _Doc, data: StudyData, rows: Sequence[CellRow]) -> None:
    """Main effects and two-way interactions of a factorial grid (nothing for one axis)."""
    effects, why = study_effects(data, rows)
    if not effects and len(data.axes) < 2:
        return
    doc.heading(2, "Factor effects")
    if not effects:
        doc.para(f"No factor effects: {why}.")
        return
    n = effects[0].n_seeds
    doc.para(
        f"Which setting matters, in units of {_code(data.metric)} "
        f"({'higher' if data.direction == 'maximize' else 'lower'} is better). The *main effect* "
        "of a level is the mean over every setting of the other axes of (cell at that level − "
        "cell at the reference level), the reference being the baseline's level; a *two-way "
        "interaction* a × b is how much more level a moves the metric when the other axis is at "
        "b instead of its reference (averaged over the remaining axes). Each is computed per "
        f"seed on the {n} seeds every cell scored and shown with a 95 % paired-t interval "
        "across those seeds (docs/report.md)."
    )
    # The effects hold each level as its JSON key; show it as the cell labels spell it.
    spelled = {(a, level_key(v)): level_str(v) for a, vs in data.axes.items() for v in vs}

    def name(axes: Sequence[str], levels: Sequence[Any]) -> str:
        return " × ".join(
            f"{a}={spelled.get((a, v), v)}" for a, v in zip(axes, levels, strict=True)
        )

    table = []
    for e in effects:
        what, ref = name(e.axes, e.levels), name(e.axes, e.reference)
        table.append(
            [
                what,
                e.kind,
                ref,
                f"{e.estimate:+.3g} [{e.low:+.3g}, {e.high:+.3g}]",
                "interval excludes 0" if e.separated else "",
            ]
        )
    doc.table(["effect", "kind", "against", "estimate [95 % CI]", "note"], table, code_col=0)


RUNS_CSV = "runs.csv"


def runs_csv(data: StudyData, rows: Sequence[CellRow]) -> str:
    """Every run of the study, one row each, for notebooks: its cell, the axis levels, seed,
    task, status, the score the ranking used, the reason of a failed or diverged run, wall time,
    and every run-level summary any run logged (empty where a run has none)."""
    choices = cell_choices(data) or {}
    axes = list(data.axes) if choices else []
    keys = sorted({k for r in data.runs for k in r.summary})
    score_of: dict[tuple[str, str, int], float] = {}
    for row in rows:
        for run, v in zip(data.runs_of(row.label), row.scores, strict=True):
            score_of[(run.cell, run.task, run.seed)] = v
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cell", *axes, "seed", "task", "status", "score", "reason", "wall_time", *keys])

    def num(x: float) -> str:
        return repr(float(x)) if math.isfinite(x) else ""

    for r in data.runs:
        w.writerow(
            [
                r.cell,
                *(choices.get(r.cell, {}).get(a, "") for a in axes),
                r.seed,
                r.task,
                r.status,
                num(score_of.get((r.cell, r.task, r.seed), math.nan)),
                r.reason,
                num(r.wall_time),
                *(num(r.summary.get(k, math.nan)) for k in keys),
            ]
        )
    return buf.getvalue()


def _fit_section(doc: _Doc, fits: Sequence[CurveFitRow]) -> None:
    doc.heading(2, "Saturating curve fits")
    doc.para(
        "A sigmoid r(t) = r0 + (A − r0) / (1 + (t_half / t)^B) fitted to each cell's mean reward "
        "curve over its completed runs (ScaleRL, arXiv 2510.13786, with steps for compute). "
        "A is the fitted ceiling; the half-step is where half of the gain A − r0 is reached "
        "(efficiency). The fit is bounded: A and r0 within the range of rewards the study "
        "logged, the half-step within the run's steps; a curve still rising at the end has no "
        "identified ceiling and shows none."
    )
    rows = []
    for f in fits:
        c = f.fit
        note = c.reason if not c.ok else ("extrapolated" if c.extrapolated else "")
        if c.ok and c.at_bound:
            note = "ceiling held at the edge of the rewards logged: the curve may go further"
        rows.append(
            [
                f.label,
                fmt(c.asymptote),
                fmt(c.half_step),
                fmt(c.r0),
                fmt(c.rmse),
                str(f.n_runs),
                note,
            ]
        )
    doc.table(["cell", "asymptote A", "half-step", "r0", "rmse", "runs", "note"], rows, code_col=0)


# Options that cannot act in a configuration, as (key or key prefix, kept key, why, test): the
# held-fixed table leaves a key out when it is inactive in every cell, so the reader sees what
# shaped the runs and not the defaults of machinery that was off.
_INACTIVE: tuple[tuple[str, str, str, Callable[[dict[str, Any]], bool]], ...] = (
    ("tiny.", "", "the tiny model is not used", lambda c: c.get("model") != "tiny"),
    ("critic.", "critic.enabled", "the critic is off", lambda c: not c.get("critic.enabled")),
    (
        "warm_start.",
        "warm_start.steps",
        "no warm start",
        lambda c: not c.get("warm_start.steps"),
    ),
    ("eval.k", "", "no sampled eval (eval.samples 0)", lambda c: not c.get("eval.samples")),
    (
        "ppo.behave_imp_weight_cap",
        "",
        "behaviour weights disabled",
        lambda c: c.get("ppo.behave_imp_weight_mode") in (None, "disabled"),
    ),
    (
        "ppo.overlong_",
        "ppo.overlong_reward_penalty",
        "no overlong penalty",
        lambda c: not c.get("ppo.overlong_reward_penalty"),
    ),
    (
        "ppo.kl_estimator",
        "",
        "no KL penalty (ppo.kl_ctl 0)",
        lambda c: not c.get("ppo.kl_ctl"),
    ),
    (
        "rollout.max_resample_rounds",
        "",
        "no zero-variance filter",
        lambda c: not c.get("rollout.zero_variance_filter"),
    ),
)


def _objective_block(key: str) -> str | None:
    """``cispo`` for ``ppo.cispo.ratio_max``: the options block of one policy loss."""
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "ppo" and parts[1] != "correction":
        return parts[1]
    return None


def held_fixed(data: StudyData) -> tuple[list[tuple[str, str]], list[str]]:
    """The base configuration's keys no cell varies that can act in some cell, and (why) the
    groups of keys left out because they are inactive in every cell: other objectives' option
    blocks, a model that is not used, machinery that is off."""
    varied = _varied_keys(data)
    base = flatten(data.base_config)
    if "steps" in base:  # every run used the study's steps, not the base config's
        base["steps"] = data.steps
    configs = [cell_config(data, c) for c in data.cells] or [base]
    losses = {str(c.get("ppo.policy_loss", "ppo")) for c in configs}
    kept: list[tuple[str, str]] = []
    left_out: dict[str, list[str]] = {}
    for k, v in base.items():
        if k in varied:
            continue
        block = _objective_block(k)
        if block is not None and block not in losses:
            left_out.setdefault(f"options of unused policy losses ({block}", []).append(k)
            continue
        why = next(
            (
                reason
                for prefix, keep, reason, off in _INACTIVE
                if k.startswith(prefix) and k != keep and all(off(c) for c in configs)
            ),
            None,
        )
        if why is not None:
            left_out.setdefault(why, []).append(k)
            continue
        kept.append((k, _value_str(v)))
    blocks = sorted(
        {g.split("(")[1] for g in left_out if g.startswith("options of unused policy losses")}
    )
    notes = [
        f"{len(ks)} key{'s' if len(ks) != 1 else ''}: {why}"
        for why, ks in left_out.items()
        if not why.startswith("options of unused policy losses")
    ]
    if blocks:
        n = sum(len(ks) for g, ks in left_out.items() if g.startswith("options of unused"))
        notes.insert(0, f"{n} keys: options of the policy losses not used ({', '.join(blocks)})")
    return kept, notes


def _fixed_section(doc: _Doc, data: StudyData) -> None:
    doc.heading(2, "What was held fixed")
    varied = _varied_keys(data)
    flat, notes = held_fixed(data)
    doc.para(
        "The base configuration every cell starts from, flattened; keys a cell overrides "
        f"({', '.join(_code(k) for k in sorted(varied)) or 'none'}) are listed under "
        "*What was varied* instead; `seed` is each run's seed (see *seeds* above)."
        + (" Left out as inactive in every cell: " + "; ".join(notes) + "." if notes else "")
    )
    half = (len(flat) + 1) // 2
    left, right = flat[:half], flat[half:]
    table_rows = []
    for i in range(half):
        rk, rv = right[i] if i < len(right) else ("", "")
        table_rows.append([f"`{left[i][0]}`", left[i][1], f"`{rk}`" if rk else "", rv])
    doc.table(["key", "value", "key", "value"], table_rows)


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
    _header(doc, data, rows)
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
    _ranking_section(doc, data, rows, n_boot, seed, diverged)
    doc.para(
        f"Every run (cell, axis levels, seed, status, score, reason, summaries) is in "
        f"[{RUNS_CSV}]({RUNS_CSV}) beside this report."
    )
    _factor_section(doc, data, rows)
    _summary_section(doc, data)
    _measured_sections(doc, data)
    doc.heading(2, "Plots")
    if absent:
        doc.para("Not logged by any run (no plot): " + ", ".join(_code(a) for a in absent) + ".")
    if not any(math.isfinite(r.iqm.point) for r in rows):
        doc.para("No run has a score yet, so there is no interval plot or performance profile.")
    for p in plots:
        doc.figure(p, f"{PLOT_DIR}/{p.path.name}")
    if fit:
        _fit_section(doc, fit_curves(data))
    _fixed_section(doc, data)
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


def _value_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, default=str)
    except (TypeError, ValueError):
        return str(v)


def _varied_keys(data: StudyData) -> set[str]:
    """Config keys that differ between runs: the grid's overrides and the run seed."""
    keys = {k for k in data.axes if k != "variant"} | {"seed"}
    for ov in data.cells.values():
        keys |= set(flatten(ov))
    return keys
