"""Live terminal progress of a sweep: one line per worker and an overall bar (Rich)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class SweepProgress:
    def __init__(
        self, n_workers: int, *, total: int, done: int, console: Console | None = None
    ) -> None:
        if console is None:
            console = Console(stderr=True)
            if not console.is_terminal:  # a log file: 80 columns would cut the cell names
                console = Console(stderr=True, width=200)
        self.console = console
        self.warned: set[tuple[str, str]] = set()  # (cell, message) already printed
        self.rows: dict[int, dict[str, Any]] = {i: {"state": "starting"} for i in range(n_workers)}
        self.bar = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.task = self.bar.add_task("trials", total=total, completed=done, info="")
        self.outcomes = {"completed": 0, "diverged": 0, "error": 0, "interrupted": 0}
        self.cancelled = 0  # an adaptive grid's held seeds a decision made unnecessary
        self.live = Live(
            self._render(), console=self.console, refresh_per_second=4, transient=False
        )

    def __enter__(self) -> SweepProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.update(self._render())
        self.live.__exit__(*exc)
        if not self.console.is_terminal:  # rich ends the last line only on a terminal
            self.console.line()

    def _render(self) -> Group:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("worker", "cell", "seed", "step", "reward", "state"):
            table.add_column(col)
        for wid, r in sorted(self.rows.items()):
            reward = r.get("reward", math.nan)
            table.add_row(
                str(wid),
                str(r.get("cell", "")),
                str(r.get("seed", "")),
                f"{r.get('step', 0)}/{r.get('steps', '?')}" if "cell" in r else "",
                "" if math.isnan(reward) else f"{reward:.3f}",
                r["state"],
            )
        return Group(table, self.bar)

    def _info(self) -> str:
        parts = [f"{k} {v}" for k, v in self.outcomes.items() if v]
        if self.cancelled:
            parts.append(f"cancelled {self.cancelled} (decided)")
        return ", ".join(parts)

    def handle(self, e: dict[str, Any]) -> None:
        row = self.rows.setdefault(e.get("worker", 0), {"state": ""})
        kind = e["event"]
        if kind == "start":
            packed = int(e.get("packed") or 1)  # the worker trains a pack: say how many
            row.update(
                cell=e["cell"] if packed == 1 else f"{e['cell']} (+{packed - 1} packed)",
                seed=e["seed"],
                steps=e["steps"],
                step=0,
                reward=math.nan,
                state="training",
            )
        elif kind == "step":
            row.update(step=e["step"], reward=e["reward"])
        elif kind == "done":
            row["state"] = e["outcome"]
            self.outcomes[e["outcome"]] = self.outcomes.get(e["outcome"], 0) + 1
            if e["outcome"] in ("completed", "diverged", "pruned"):
                self.bar.advance(self.task)
            if e["outcome"] == "error":  # the reason, once, above the live table
                where = f"trial {e.get('trial', '?')}"
                if e.get("cell") and e["cell"] != where:  # a grid cell (a search says its trial)
                    where += f" ({e['cell']} seed={e.get('seed')})"
                self.console.print(
                    f"{where}: error: {e.get('reason', '')}", markup=False, highlight=False
                )
            elif e["outcome"] == "pruned" and e.get("reason") and "values" not in e:
                # a search point ended without a value: raced out, or one that cannot train
                self.console.print(
                    f"trial {e.get('trial', '?')}: pruned: {e['reason']}",
                    markup=False,
                    highlight=False,
                )
            if "values" in e:  # a search point: its mean objectives and parameters
                values = ", ".join(f"{v:.4g}" for v in e["values"])
                point = " ".join(
                    f"{k.split('.')[-1]}={_fmt(v)}" for k, v in e.get("point", {}).items()
                )
                self.console.print(f"trial {e['trial']}: {e['outcome']} {values}  {point}")
            self.bar.update(self.task, info=self._info())
        elif kind == "warning":
            # a run's warning, once per cell however many seeds raise it, without the source
            # location Python's own warning line adds
            key = (str(e.get("cell", "")), str(e.get("message", "")))
            if key not in self.warned:
                self.warned.add(key)
                self.console.print(f"{key[0]}: warning: {key[1]}", markup=False, highlight=False)
        elif kind == "cancelled":
            # The total is what may still run: a cancelled seed leaves it, never counted as
            # done, so an adaptive study ends at done/done instead of done/(cells x max).
            n = int(e.get("n", 0))
            self.cancelled += n
            total = self.bar.tasks[0].total or 0
            self.bar.update(self.task, total=max(0, total - n), info=self._info())
        elif kind == "exit":
            if not str(row.get("state", "")).startswith("stopped"):
                row["state"] = "finished"
        elif kind == "crash":
            row["state"] = f"crashed: {e.get('reason', '')[:60]}"
        elif kind == "fatal":
            row["state"] = f"stopped: {e.get('reason', '')[:60]}"
        self.live.update(self._render())


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
