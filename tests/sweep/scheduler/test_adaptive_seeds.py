"""Seeds that decide: the `seeds: {min, max, ...}` schema, the allocation (pure), and the
allocation on a real Optuna study — held seeds released after each look, decided cells'
seeds cancelled, status lines, resume."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.report.allocation import AdaptivePlan, allocate, settled
from harness.report.sequential import SeedPlan
from tests.support.adaptive_study import (
    BASELINE,
    BETTER,
    EQUIVALENT,
    PLAN,
    REWARDS,
    SLIGHT,
    drain,
    open_adaptive,
    run_one,
    score,
    terminal_keys,
    write_experiment,
)

CELLS4 = [BASELINE, BETTER, EQUIVALENT, SLIGHT]


# -- the schema ---------------------------------------------------------------------------------


def test_the_mapping_form_loads_and_a_count_keeps_todays_study(tmp_path: Path) -> None:
    from harness.config.experiment import load_experiment

    spec = load_experiment(write_experiment(tmp_path))
    assert spec.adaptive == PLAN
    assert spec.seeds == list(range(7)) and spec.n_trials == 4 * 7
    fixed = load_experiment(ROOT_SMOKE)
    assert fixed.adaptive is None and fixed.seeds == [0, 1]
    # The plan is part of what the study computes: another plan is another study.
    other = load_experiment(write_experiment(tmp_path, name="adaptive", margin=0.1))
    assert other.grid_hash() != spec.grid_hash()


ROOT_SMOKE = Path(__file__).resolve().parents[3] / "experiments" / "smoke.yaml"


@pytest.mark.parametrize(
    "seeds, expect",
    [
        ({"min": 1}, "seeds.min: must be an integer in [2, 500]; got 1"),
        ({"min": 5, "max": 4}, "seeds.max: must be >= seeds.min (5); got 4"),
        ({"batch": 0}, "seeds.batch: must be an integer >= 1"),
        ({"confidence": 1.0}, "seeds.confidence: must be a finite number in [0.5, 1); got 1.0"),
        ({"margin": -0.1}, "seeds.margin: must be a finite number >= 0"),
        ({"decide": "best"}, "seeds.decide: must be one of 'baseline', 'ranking'"),
        ({"mx": 4}, "seeds.mx: unknown key"),
        ({"min": 2, "max": 500, "batch": 1}, "seeds.batch: 499 looks"),
    ],
)
def test_a_bad_plan_is_one_line_exit_2_nothing_written(
    tmp_path: Path, seeds: dict, expect: str
) -> None:
    path = write_experiment(tmp_path, **seeds)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(path), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in (r.stderr or r.output).strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], lines[0]
    assert not results.exists()


def test_decide_baseline_needs_a_baseline(tmp_path: Path) -> None:
    doc = yaml.safe_load(write_experiment(tmp_path).read_text())
    del doc["baseline"]
    path = tmp_path / "nobase.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["ablate", str(path), "--results-dir", str(tmp_path / "r")])
    assert r.exit_code == 2 and "seeds.decide: 'baseline' needs a baseline" in r.output


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    path = write_experiment(tmp_path)
    r = CliRunner().invoke(app, ["ablate", str(path), "--dry-run", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "4 cells x 3..7 seeds (adaptive) = 12 trials up front, at most 28" in r.output
    assert "looks at [3, 5, 7] seeds" in r.output
    assert not (tmp_path / "optuna-journal.log").exists()


def test_the_norm_finding_has_an_adaptive_variant_that_dry_runs(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    path = root / "experiments" / "findings" / "norm-adaptive.yaml"
    r = CliRunner().invoke(app, ["ablate", str(path), "--dry-run", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "5 cells x 3..24 seeds (adaptive) = 15 trials up front, at most 120" in r.output


# -- the allocation, pure -----------------------------------------------------------------------

ADAPTIVE = AdaptivePlan.from_dict(PLAN)


def _scores(n: dict[str, int]) -> dict[str, dict[int, float]]:
    return {c: {s: score(c, s) for s in range(k)} for c, k in n.items()}


def test_nothing_finished_releases_min_seeds_everywhere() -> None:
    states = allocate({}, CELLS4, ADAPTIVE, baseline=BASELINE)
    assert {c: (s.status, s.released, s.done) for c, s in states.items()} == {
        BASELINE: ("reference", 3, 0),
        BETTER: ("open", 3, 0),
        EQUIVALENT: ("open", 3, 0),
        SLIGHT: ("open", 3, 0),
    }
    assert not settled(states)


def test_a_look_is_pending_until_the_cell_and_its_reference_finished_its_seeds() -> None:
    sc = _scores({BASELINE: 2, BETTER: 3, EQUIVALENT: 3, SLIGHT: 3})
    states = allocate(sc, CELLS4, ADAPTIVE, baseline=BASELINE)
    assert all(s.status in ("open", "reference") and s.released == 3 for s in states.values())
    assert states[BETTER].decision is None  # no look without the baseline's third seed


def test_looks_decide_the_clear_cells_and_release_more_for_the_open_one() -> None:
    sc = _scores({c: 3 for c in CELLS4})
    states = allocate(sc, CELLS4, ADAPTIVE, baseline=BASELINE)
    assert states[BETTER].status == "better" and states[BETTER].released == 3
    assert states[EQUIVALENT].status == "equivalent" and states[EQUIVALENT].released == 3
    assert states[SLIGHT].status == "open" and states[SLIGHT].released == 5
    assert states[BASELINE].released == 5  # the open cell still compares with seeds 3, 4
    d = states[BETTER].decision
    assert d is not None and d.n == 3 and 0 < d.lo < d.estimate < d.hi
    assert d.estimate == pytest.approx(
        sum(score(BETTER, s) - score(BASELINE, s) for s in range(3)) / 3
    )
    assert states[BETTER].line().startswith("3/3 seeds done, decided at 3 seeds: better by +")
    full = allocate(_scores({c: 7 for c in CELLS4}), CELLS4, ADAPTIVE, baseline=BASELINE)
    assert full[SLIGHT].status == "undecided" and full[SLIGHT].released == 7
    assert "undecided at max (7 seeds)" in full[SLIGHT].line()
    # Seeds past a decision change nothing: the decision is a function of the seeds below it.
    assert full[BETTER].decision == states[BETTER].decision
    assert settled(full)


def test_a_diverged_seed_counts_as_the_worst_score_of_its_look() -> None:
    sc = _scores({c: 3 for c in CELLS4})
    sc[BETTER][1] = math.nan
    states = allocate(sc, CELLS4, ADAPTIVE, baseline=BASELINE)
    worst = min([score(BETTER, s) for s in (0, 2)] + [score(BASELINE, s) for s in range(3)])
    d = states[BETTER].decision
    assert d is not None
    expect = (score(BETTER, 0) + worst + score(BETTER, 2)) / 3 - sum(
        score(BASELINE, s) for s in range(3)
    ) / 3
    assert d.estimate == pytest.approx(expect)


def test_a_metric_to_minimise_flips_better_and_worse() -> None:
    sc = _scores({c: 3 for c in CELLS4})
    states = allocate(sc, CELLS4, ADAPTIVE, baseline=BASELINE, maximize=False)
    assert states[BETTER].status == "worse"
    # A diverged seed is then the highest score of the look: the worst when lower is better.
    sc[BASELINE][0] = math.nan
    d = allocate(sc, CELLS4, ADAPTIVE, baseline=BASELINE, maximize=False)[BETTER].decision
    highest = max([score(BETTER, s) for s in range(3)] + [score(BASELINE, s) for s in (1, 2)])
    base = (highest + score(BASELINE, 1) + score(BASELINE, 2)) / 3
    cell = sum(score(BETTER, s) for s in range(3)) / 3
    assert d is not None and d.estimate == pytest.approx(-(cell - base))  # in "better" units


def test_ranking_races_the_top_cell_against_the_runner_up() -> None:
    ranking = AdaptivePlan(SeedPlan(3, 7, 2, 0.95, 0.3), "ranking")
    three = [BASELINE, BETTER, EQUIVALENT]
    states = allocate(_scores({c: 3 for c in three}), three, ranking, baseline=BASELINE)
    assert states[BETTER].status == "better" and states[BETTER].versus in three
    assert {states[c].status for c in three if c != BETTER} == {"ranked"}
    assert all(s.released == 3 for s in states.values())
    assert "(ranking decided)" in states[EQUIVALENT].line()
    # A noisy runner-up (SLIGHT): every cell gets more seeds until the two are told apart.
    noisy = allocate(_scores({c: 3 for c in CELLS4}), CELLS4, ranking, baseline=BASELINE)
    assert {s.status for s in noisy.values()} == {"open"}
    assert {s.released for s in noisy.values()} == {5}
    assert noisy[BETTER].decision is not None and noisy[BETTER].versus == SLIGHT


# -- on a real study --------------------------------------------------------------------------


def test_a_study_runs_min_seeds_then_only_what_the_open_cell_needs(tmp_path: Path) -> None:
    from harness.sweep.scheduler.adaptive import cell_states
    from harness.sweep.scheduler.study import study_counts

    study, spec = open_adaptive(write_experiment(tmp_path), tmp_path / "results")
    assert len(study.get_trials()) == 4 * 7  # every seed enqueued once, held
    ran = drain(study, spec)
    per_cell = {c: sorted(s for cc, s in ran if cc == c) for c in CELLS4}
    assert per_cell == {
        BASELINE: list(range(7)),
        BETTER: [0, 1, 2],
        EQUIVALENT: [0, 1, 2],
        SLIGHT: list(range(7)),
    }
    keys = terminal_keys(study)
    assert len(keys) == 28 and all(len(v) == 1 for v in keys.values())  # each key once
    assert sorted(k for k, v in keys.items() if v == ["PRUNED"]) == [
        (c, s) for c in (BETTER, EQUIVALENT) for s in range(3, 7)
    ]
    states = cell_states(study.get_trials(), spec)
    assert [states[c].status for c in CELLS4] == ["reference", "better", "equivalent", "undecided"]
    counts = study_counts(study, spec)
    assert (counts.done, counts.waiting, counts.total, counts.cancelled) == (20, 0, 20, 8)
    assert dict(counts.cells)[BETTER].startswith("3/3 seeds done, decided at 3 seeds: better")


def test_resume_enqueues_nothing_a_decision_cancelled(tmp_path: Path) -> None:
    from harness.sweep.scheduler.study import enqueue_missing

    study, spec = open_adaptive(write_experiment(tmp_path), tmp_path / "results")
    drain(study, spec)
    assert enqueue_missing(study, spec) == (0, 20)
    assert len(study.get_trials()) == 28


def test_a_worker_waits_while_a_look_is_pending(tmp_path: Path) -> None:
    """A seed of the look still running: the next released seeds are not yet known, so a worker
    gets no trial but is told one is running (it waits instead of exiting)."""
    from harness.sweep.scheduler.trials import next_trial
    from harness.sweep.stores.optuna_adapter import frozen_trial

    study, spec = open_adaptive(write_experiment(tmp_path), tmp_path / "results")
    claimed = []
    while True:
        trial, running = next_trial(study, spec)
        if trial is None:
            break
        claimed.append(trial)
    assert len(claimed) == 12 and running == 12  # min seeds of every cell, all running
    for t in claimed[:-1]:
        ua = frozen_trial(study, t).user_attrs
        study.tell(t, score(str(ua["cell"]), int(ua["seed"])))
    trial, running = next_trial(study, spec)
    assert trial is None and running == 1  # the look waits on the last one
    ua = frozen_trial(study, claimed[-1]).user_attrs
    study.tell(claimed[-1], score(str(ua["cell"]), int(ua["seed"])))
    nxt = run_one(study, spec)
    assert nxt is not None and nxt[1] in (3, 4)  # the look released seeds 3 and 4


def test_status_shows_each_cells_seeds_verdict_and_interval(tmp_path: Path) -> None:
    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    drain(study, spec)
    r = CliRunner().invoke(app, ["status", "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    assert "adaptive: seeds per cell (8 held seeds cancelled by decisions)" in r.output
    assert f"{BETTER}: 3/3 seeds done, decided at 3 seeds: better by +" in r.output
    assert f"{EQUIVALENT}: 3/3 seeds done, decided at 3 seeds: equivalent" in r.output
    assert f"{SLIGHT}: 7/7 seeds done, undecided at max (7 seeds)" in r.output


def test_the_report_says_per_cell_decided_or_undecided_and_the_savings(tmp_path: Path) -> None:
    from harness.report import build_report
    from harness.report.adaptive import adaptive_lines, adaptive_states, savings
    from harness.sweep.scheduler.results import load_study_data

    study, spec = open_adaptive(write_experiment(tmp_path), tmp_path / "results")
    drain(study, spec)
    data = load_study_data(study, None)
    assert len(data.runs) == 20  # the cancelled seeds are no runs
    lines = adaptive_lines(data)
    assert lines[1].startswith(f"{BETTER}: 3/3 seeds done, decided at 3 seeds: better by +")
    assert lines[3].startswith(f"{SLIGHT}: 7/7 seeds done, undecided at max (7 seeds): ")
    s = savings(data, adaptive_states(data))
    assert (s.seeds_used, s.seeds_fixed, s.seeds_saved) == (20, 28, 8)
    assert s.wall_used == pytest.approx(20 * 2.0) and s.wall_fixed == pytest.approx(28 * 2.0)
    assert lines[-1].startswith("adaptive design: 20 seeds against 28 for the fixed design")
    assert "saved 8 seeds" in lines[-1]
    md = build_report(data, tmp_path / "report", fit=False).markdown.read_text()
    assert "## Seeds that decide" in md
    assert "decided at 3 seeds: equivalent, difference" in md
    assert "undecided at max (7 seeds)" in md
    assert "saved 8 seeds" in md


# -- end to end: `harness ablate` with a controlled metric ----------------------------------


@pytest.mark.slow
def test_harness_ablate_decides_the_clear_cells_early_and_takes_the_close_one_to_max(
    tmp_path: Path,
) -> None:
    """A fresh `harness ablate --workers 2` of a baseline, a clearly better cell, an equivalent
    one and a slightly different one (their final/reward controlled by the task's reward): the
    better and the equivalent cell stop at min seeds, the slight one runs to max, the report
    says so, and a second run of the command has nothing left to do."""
    from tests.support.adaptive_study import CELLS

    module = tmp_path / "rewards.py"
    module.write_text(REWARDS.format(cells=CELLS))
    doc = yaml.safe_load(write_experiment(tmp_path).read_text())
    names = {"baseline": BASELINE, "better": BETTER, "equivalent": EQUIVALENT, "slight": SLIGHT}
    doc["grid"] = {"task": [f"python:{module}:{n}" for n in names]}
    doc["baseline"] = {"task": f"python:{module}:baseline"}
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    cmd = ["ablate", str(path), "--workers", "2", "--results-dir", str(results)]
    r = CliRunner().invoke(app, cmd)
    assert r.exit_code == 0, r.output
    label = {n: f"task=python:{module}:{n}" for n in names}
    out = r.output
    assert "4 cells x 3..7 seeds (adaptive, decide: baseline), 0 already done, 28 enqueued" in out
    assert f"{label['better']}: 3/3 seeds done, decided at 3 seeds: better by +" in out
    assert f"{label['equivalent']}: 3/3 seeds done, decided at 3 seeds: equivalent" in out
    assert f"{label['slight']}: 7/7 seeds done, undecided at max (7 seeds)" in out
    assert "adaptive design: 20 seeds against 28 for the fixed design" in out
    md = (results / "adaptive" / "report.md").read_text()
    assert "## Seeds that decide" in md and "saved 8 seeds" in md
    assert "undecided at max (7 seeds)" in md
    again = CliRunner().invoke(app, cmd)
    assert again.exit_code == 0, again.output
    assert "0 enqueued" in again.output


# -- search racing ------------------------------------------------------------------------------


def test_race_compares_at_looks_on_the_seeds_both_ran() -> None:
    from harness.report.allocation import race

    plan = SeedPlan(3, 7, 2, 0.95, margin=0.3)
    inc = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0]
    assert race([0.0, 0.1], inc, plan) is None  # below min: no look
    worse = race([0.0, 0.1, -0.1], inc, plan)
    assert worse is not None and worse.verdict == "worse" and worse.n == 3
    assert race([0.0, 0.1, -0.1, 0.0], inc, plan) is None  # 4 is no planned look
    same = race([1.0, 1.11, 0.9], inc, plan)
    assert same is not None and same.verdict == "equivalent"
    assert race([0.0, 0.1, -0.1], inc[:2], plan) is None  # the incumbent lacks seed 2


def test_a_racing_search_stops_losing_points_at_min_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search whose metric (controlled) peaks at eps_clip 0.2: points far from it are raced
    out against the incumbent after 3 seeds, with the reason; completed points ran all 7."""
    import numpy as np

    from harness.run.scaffold import RunResult
    from harness.sweep.launching import worker
    from harness.sweep.launching.trial import ClaimedTrial
    from harness.tracking import MemoryTracker
    from tests.support.studies import open_test_study

    def train(self: Any, cfg: Any, label: str, seed: int) -> tuple[Any, str]:
        rng = np.random.default_rng([int(cfg.ppo.eps_clip * 1e6), seed])
        value = -10.0 * abs(cfg.ppo.eps_clip - 0.2) + 0.02 * rng.standard_normal()
        summary = {"final/reward": value}
        return RunResult("completed", "", cfg.steps, {}, summary, 0.0, False), "rid"

    monkeypatch.setattr(ClaimedTrial, "train", train)
    tracker = MemoryTracker()
    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    doc = yaml.safe_load(ROOT_SMOKE.read_text())
    del doc["grid"], doc["baseline"]
    doc.update(name="race", steps=2, seeds={"min": 3, "max": 7, "batch": 2, "margin": 0.01})
    doc["search"] = {
        "n_trials": 8,
        "params": {"ppo.eps_clip": {"type": "float", "low": 0.05, "high": 0.5}},
        "pruner": "none",
    }
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    study, _ = open_test_study(path, results, tracker, tracking_uri="memory", enqueue=False)
    worker.worker_loop(worker.WorkerOptions(study="race", storage=None, results_dir=results))
    trials = study.get_trials()
    assert len(trials) == 8
    raced = [t for t in trials if t.state.name == "PRUNED"]
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert raced and done
    for t in raced:
        assert t.user_attrs["seeds_run"] == 3
        assert t.user_attrs["reason"].startswith("raced out against trial ")
        assert "decided at 3 seeds: worse by -" in t.user_attrs["reason"]
    for t in done:
        assert t.user_attrs["seeds_run"] == 7
    best = max(done, key=lambda t: t.values[0])
    assert all(t.values[0] <= best.values[0] for t in done)
    assert all(
        sum(v for v in t.user_attrs["seed_values"][0][:3]) / 3 < best.values[0] for t in raced
    )


def test_a_ranking_study_advances_every_cell_until_the_top_is_decided(tmp_path: Path) -> None:
    from harness.sweep.scheduler.adaptive import cell_states

    doc = yaml.safe_load(write_experiment(tmp_path, decide="ranking").read_text())
    doc["grid"] = {"ppo.eps_clip": [0.2, 0.1, 0.3]}  # baseline, better, equivalent
    path = tmp_path / "ranking.yaml"
    path.write_text(yaml.safe_dump(doc))
    study, spec = open_adaptive(path, tmp_path / "results")
    ran = drain(study, spec)
    assert sorted(ran) == sorted((c, s) for c in (BASELINE, BETTER, EQUIVALENT) for s in range(3))
    states = cell_states(study.get_trials(), spec)
    assert states[BETTER].status == "better" and states[BETTER].versus in (BASELINE, EQUIVALENT)
    assert all(len(v) == 1 for v in terminal_keys(study).values())
