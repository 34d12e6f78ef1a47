"""Rich terminal output for single runs: a progress bar with live numbers and a final summary."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from harness.config import RunConfig
from harness.run.scaffold import RunResult
from harness.run.tracked import tracked_run
from harness.tracking import Tracker

console = Console(stderr=True)


def _fmt(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


# What the progress line shows, in order, as (metric key, label). A key the trainer did not log
# this step is left out (TRL logs no policy/approx_kl, for instance): the line shows what was
# measured, never a placeholder for what a trainer cannot produce.
PROGRESS_KEYS: tuple[tuple[str, str], ...] = (
    ("objective/reward", "reward"),
    ("policy/clipfrac", "clipfrac"),
    ("policy/approx_kl", "kl"),
    ("policy/entropy", "entropy"),
)


def progress_info(metrics: dict[str, float], last_eval_accuracy: float) -> str:
    """The live numbers of one step: the logged ones of ``PROGRESS_KEYS`` plus the latest greedy
    eval accuracy (evaluation runs every ``eval.every`` steps, so it is carried between them)."""
    parts = [f"{label} {_fmt(metrics[key])}" for key, label in PROGRESS_KEYS if key in metrics]
    parts.insert(1 if parts else 0, f"eval acc {_fmt(last_eval_accuracy)}")
    return "  ".join(parts)


def run_with_progress(
    cfg: RunConfig,
    tracker: Tracker,
    *,
    experiment: str,
    run_name: str,
    results_dir: Path,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[RunResult, str]:
    last_eval = {"acc": math.nan}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(run_name, total=cfg.steps, info="")

        def on_step(step: int, m: dict[str, float]) -> None:
            if not math.isnan(m.get("eval/accuracy", math.nan)):
                last_eval["acc"] = m["eval/accuracy"]
            info = progress_info(m, last_eval["acc"])
            progress.update(bar, completed=step + 1, info=escape(info))

        result, rid = tracked_run(
            cfg,
            tracker,
            experiment=experiment,
            run_name=run_name,
            on_step=on_step,
            should_stop=should_stop,
            results_dir=results_dir,
        )
    print_summary(result, rid)
    return result, rid


def print_summary(result: RunResult, run_id: str) -> None:
    table = Table(title=f"run {run_id} — {result.status}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "start/reward",
        "final/reward",
        "best/reward",
        "final/reward_auc",
        "final/eval_accuracy",
        "start/eval_reward",
        "final/eval_reward",
        "stability/max_drawdown",
        "stability/collapsed",
        "stability/max_approx_kl",
        "stability/mean_clipfrac",
        "stability/kl_spikes",
        "stability/entropy_ratio",
        "stability/grad_norm_spikes",
        "stability/skipped_steps",
    ):
        table.add_row(key, _fmt(result.summary.get(key, math.nan)))
    for key in (
        "final/eval_pass_at_1",  # these three only with eval.samples > 0
        "final/eval_pass_at_k",
        "final/eval_mean_at_n",
        "stability/mismatch_kl_k3_mean",  # these two only with rollout.measure_mismatch
        "stability/mismatch_kl_k3_max",
    ):
        if math.isfinite(result.summary.get(key, math.nan)):
            table.add_row(key, _fmt(result.summary[key]))
    if result.tags.get("sampler"):
        table.add_row("sampler", escape(result.tags["sampler"]))
    table.add_row("steps", str(result.steps_done))
    table.add_row("wall time (s)", f"{result.wall_time:.1f}")
    if result.inert_clip:
        table.add_row("[yellow]warning", "[yellow]clipping is inert (ratio ≡ 1)")
    if result.reason:
        table.add_row("[red]reason", f"[red]{result.reason}")
    Console().print(table)
