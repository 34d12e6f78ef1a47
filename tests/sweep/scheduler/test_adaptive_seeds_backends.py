"""Seeds that decide on the other backends: a PostgreSQL storage with several local workers, and
the Ray launcher (each slow, a real `harness ablate`), and the sweep's progress total, which
shrinks as a decision cancels held seeds (fast)."""

from __future__ import annotations

import io
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from harness.cli import app
from harness.sweep.stores.storage import make_storage
from tests.support.adaptive_study import BASELINE, BETTER, EQUIVALENT, SLIGHT, write_experiment

NAMES = {"baseline": BASELINE, "better": BETTER, "equivalent": EQUIVALENT, "slight": SLIGHT}
# What the controlled scores decide (tests/sweep/scheduler/test_adaptive_seeds.py, the same
# numbers): the better and the equivalent cell at the first look (3 seeds), the slight one
# undecided at max (7).
RUNS = {"baseline": 7, "better": 3, "equivalent": 3, "slight": 7}
MAX = 7


def _experiment(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The four-cell adaptive experiment whose final/reward the task's reward controls (the
    reward module of tests/support/adaptive_study.py); returns it and the cell labels."""
    from tests.support.adaptive_study import CELLS, REWARDS

    module = tmp_path / "rewards.py"
    module.write_text(REWARDS.format(cells=CELLS))
    doc = yaml.safe_load(write_experiment(tmp_path).read_text())
    doc["grid"] = {"task": [f"python:{module}:{n}" for n in NAMES]}
    doc["baseline"] = {"task": f"python:{module}:baseline"}
    path = tmp_path / "adaptive.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, {n: f"task=python:{module}:{n}" for n in NAMES}


def _check_study(storage: str, tracking: str, results: Path, label: dict[str, str]) -> None:
    """Every (cell, seed) has exactly one trial; the ones the decisions needed completed, the
    rest were cancelled before anything ran them (no start time, no MLflow run)."""
    from mlflow.tracking import MlflowClient

    study = optuna.load_study(study_name="adaptive", storage=make_storage(storage, results))
    trials = study.get_trials()
    per_key = Counter((str(t.user_attrs["cell"]), int(t.user_attrs["seed"])) for t in trials)
    assert len(per_key) == 4 * MAX and set(per_key.values()) == {1}, per_key
    want_run = {(label[n], s) for n, k in RUNS.items() for s in range(k)}
    ran = {
        (t.user_attrs["cell"], t.user_attrs["seed"]) for t in trials if t.state.name == "COMPLETE"
    }
    assert ran == want_run
    cancelled = [t for t in trials if t.state.name == "PRUNED"]
    assert {(t.user_attrs["cell"], t.user_attrs["seed"]) for t in cancelled} == {
        (label[n], s) for n in ("better", "equivalent") for s in range(3, MAX)
    }
    for t in cancelled:
        assert t.user_attrs["outcome"] == "decided" and t.datetime_start is None
        assert t.user_attrs["reason"].startswith(f"not needed: {t.user_attrs['cell']} ")
    assert len(trials) == len(ran) + len(cancelled) == 28  # nothing else (no retry, no stray)
    from harness.core.db import sqlalchemy_url

    client = MlflowClient(sqlalchemy_url(tracking))  # postgresql+psycopg2://
    exp = client.get_experiment_by_name("adaptive")
    children = [
        r
        for r in client.search_runs([exp.experiment_id], max_results=1000)
        if r.data.tags.get("harness.role") == "child"
    ]
    keys = Counter((r.data.tags["ablation.cell"], int(r.data.tags["seed"])) for r in children)
    assert set(keys) == want_run and set(keys.values()) == {1}, keys  # each run once, no other
    assert {r.info.status for r in children} == {"FINISHED"}


def _check_output(out: str, label: dict[str, str], results: Path) -> None:
    assert "4 cells x 3..7 seeds (adaptive, decide: baseline), 0 already done, 28 enqueued" in out
    assert f"{label['better']}: 3/3 seeds done, decided at 3 seeds: better by +" in out
    assert f"{label['equivalent']}: 3/3 seeds done, decided at 3 seeds: equivalent" in out
    assert f"{label['slight']}: 7/7 seeds done, undecided at max (7 seeds)" in out
    assert "adaptive design: 20 seeds against 28 for the fixed design" in out
    # The live bar's last line: the cancelled seeds left its total, nothing is left over.
    assert re.search(r"20/20\s+completed 20, cancelled 8 \(decided\)", out), out
    md = (results / "adaptive" / "report.md").read_text()
    assert "## Seeds that decide" in md and "saved 8 seeds" in md


@pytest.fixture
def long_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker dies here: a long heartbeat grace (4 x 30 s), so that a beat made late by a
    loaded machine never has a live trial judged stale and retried (a second trial per key)."""
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "30")


def _ablate(path: Path, results: Path, *extra: str) -> Any:
    cmd = ["ablate", str(path), "--results-dir", str(results), *extra]
    return CliRunner().invoke(app, cmd)


@pytest.mark.slow
@pytest.mark.usefixtures("long_grace")
def test_adaptive_study_on_postgresql_with_three_workers(tmp_path: Path, pg: Any) -> None:
    """`harness ablate --workers 3 --storage postgresql://...`: three worker processes claim,
    release and cancel on one PostgreSQL study; the result is the journal's, exactly once."""
    path, label = _experiment(tmp_path)
    tag = uuid.uuid4().hex[:8]
    storage = pg.create_database(f"adopt_{tag}")
    tracking = pg.create_database(f"admlf_{tag}")
    results = tmp_path / "results"
    extra = ("--workers", "3", "--storage", storage, "--tracking-uri", tracking)
    r = _ablate(path, results, *extra)
    assert r.exit_code == 0, r.output
    _check_output(r.output, label, results)
    _check_study(storage, tracking, results, label)
    status = CliRunner().invoke(app, ["status", "--storage", storage])
    assert status.exit_code == 0, status.output
    row = next(ln for ln in status.output.splitlines() if ln.startswith("│ adaptive "))
    # done, pruned, diverged, running, waiting, failed, total: the cancelled seeds are no runs
    assert row.replace("│", " ").split()[1:] == ["20", "0", "0", "0", "0", "0", "20"], row
    assert "adaptive: seeds per cell (8 held seeds cancelled by decisions)\n" in status.output
    assert f"{label['slight']}: 7/7 seeds done, undecided at max (7 seeds)" in status.output
    again = _ablate(path, results, *extra)
    assert again.exit_code == 0, again.output
    assert "20 already done, 0 enqueued" in again.output
    _check_study(storage, tracking, results, label)  # the second run ran and cancelled nothing


@pytest.mark.slow
@pytest.mark.usefixtures("long_grace")
def test_adaptive_study_on_the_ray_launcher(tmp_path: Path, pg: Any, ray_head: str) -> None:
    """`harness ablate --launcher ray --workers 2` on a private Ray head, stores on PostgreSQL
    (what Ray's nodes can share): the same decisions, each seed run at most once."""
    path, label = _experiment(tmp_path)
    tag = uuid.uuid4().hex[:8]
    storage = pg.create_database(f"adray_{tag}")
    tracking = pg.create_database(f"adraymlf_{tag}")
    results = tmp_path / "results"
    extra = ("--launcher", "ray", "--ray-address", ray_head, "--workers", "2")
    r = _ablate(path, results, *extra, "--storage", storage, "--tracking-uri", tracking)
    assert r.exit_code == 0, r.output
    _check_output(r.output, label, results)
    _check_study(storage, tracking, results, label)


# -- the progress total (fast) ------------------------------------------------------------------


def _bar(total: int, done: int) -> Any:
    from harness.sweep.present.progress import SweepProgress

    return SweepProgress(
        2, total=total, done=done, console=Console(file=io.StringIO(), force_terminal=False)
    )


def _task(p: Any) -> tuple[float, float | None]:
    t = p.bar.tasks[0]
    return t.completed, t.total


def test_the_bar_takes_cancelled_seeds_off_its_total_and_ends_at_done_over_done() -> None:
    p = _bar(28, 0)
    for seed in range(12):
        p.handle({"event": "done", "worker": seed % 2, "outcome": "completed", "seed": seed})
    assert _task(p) == (12, 28)
    p.handle({"event": "cancelled", "worker": 0, "n": 5})
    p.handle({"event": "cancelled", "worker": 1, "n": 3})
    assert _task(p) == (12, 20)
    for seed in range(8):
        p.handle({"event": "done", "worker": 0, "outcome": "completed", "seed": seed})
    assert _task(p) == (20, 20)
    assert p.bar.tasks[0].fields["info"] == "completed 20, cancelled 8 (decided)"


def test_a_fixed_grid_keeps_its_total() -> None:
    p = _bar(8, 2)
    for seed in range(6):
        p.handle({"event": "done", "worker": 0, "outcome": "completed", "seed": seed})
    assert _task(p) == (8, 8) and p.bar.tasks[0].fields["info"] == "completed 6"


def test_workers_report_each_cancelled_seed_once_and_a_resume_starts_below_cells_x_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two in-process workers on one journal study (train replaced by the controlled score):
    their ``cancelled`` events add up to the 8 seeds the decisions cancelled, the bar fed their
    events ends at 20/20, and a resumed study's total starts at 20 (28 less those 8)."""
    import threading

    from harness.run.scaffold import RunResult
    from harness.sweep.launching import worker
    from harness.sweep.launching.driver import progress_total
    from harness.sweep.launching.trial import ClaimedTrial
    from harness.tracking import MemoryTracker
    from tests.support.adaptive_study import open_adaptive, score

    def train(self: Any, cfg: Any, label: str, seed: int) -> tuple[Any, str]:
        summary = {"final/reward": score(label, seed)}
        return RunResult("completed", "", cfg.steps, {}, summary, 0.0, False), "rid"

    monkeypatch.setattr(ClaimedTrial, "train", train)
    tracker = MemoryTracker()
    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    total = progress_total(study, spec)
    assert total == 28
    p = _bar(total, 0)
    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    def emit(e: dict[str, Any]) -> None:
        with lock:
            events.append(e)
            p.handle(e)

    def work(i: int) -> None:
        opts = worker.WorkerOptions(
            study="adaptive", storage=None, results_dir=results, worker_id=i
        )
        worker.worker_loop(opts, emit=emit)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 20 and {e["outcome"] for e in done} == {"completed"}
    assert sum(e["n"] for e in events if e["event"] == "cancelled") == 8
    assert _task(p) == (20, 20)
    assert progress_total(study, spec) == 20  # what a resume's bar starts at, 20 done


def test_status_total_is_what_may_still_run_and_shrinks_as_decisions_cancel(
    tmp_path: Path,
) -> None:
    """`harness status` of an adaptive study: the total is cells x max less the cancelled seeds
    (the bar's total), and the seeds no look released yet are counted as held, not waiting."""
    from harness.sweep.scheduler.study import study_counts
    from tests.support.adaptive_study import open_adaptive, run_one

    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)

    def counts() -> tuple[int, ...]:
        c = study_counts(study, spec)
        return c.done, c.waiting, c.held, c.total, c.cancelled

    assert counts() == (0, 12, 16, 28, 0)  # min seeds released, the rest held
    for _ in range(12):
        assert run_one(study, spec) is not None
    # The first look: two cells decided (8 seeds cancelled), the open one and its reference get
    # seeds 3 and 4; seeds 5 and 6 of both stay held.
    assert counts() == (12, 4, 4, 20, 8)
    r = CliRunner().invoke(app, ["status", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    assert (
        "adaptive: seeds per cell (8 held seeds cancelled by decisions); 4 more held until a "
        "look releases them" in r.output
    )
    while run_one(study, spec) is not None:
        pass
    assert counts() == (20, 0, 0, 20, 8)
    r = CliRunner().invoke(app, ["status", "--results-dir", str(results)])
    assert "(8 held seeds cancelled by decisions)\n" in r.output


def test_a_fixed_grid_study_counts_as_before(tmp_path: Path) -> None:
    from harness.sweep.scheduler.study import study_counts
    from harness.sweep.scheduler.trials import next_trial
    from tests.support.adaptive_study import SMOKE, open_adaptive

    study, spec = open_adaptive(SMOKE, tmp_path / "results")
    c = study_counts(study, spec)
    assert (c.done, c.waiting, c.held, c.total, c.cancelled) == (0, 4, 0, 4, 0)
    trial, _ = next_trial(study, spec)
    study.tell(trial, 1.0)
    c = study_counts(study, spec)
    assert (c.done, c.waiting, c.total) == (1, 3, 4)
