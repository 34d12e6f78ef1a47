"""`harness search --cells-per-worker K`: a worker asks for up to K points (within n_trials) and
trains each seed of the points still live as one pack on one base model, reporting each point to
the pruner after each seed as an unpacked point is (harness/sweep/launching/packed_search.py).

* A LoRA search of 4 points x 2 seeds at K = 2, one worker: every point completes with both seeds,
  and each child run was trained in a pack (its ``harness.pack`` tag names the seed's points).
* A packed point's runs have the unpacked point's metric history (1e-5 relative, fp32, tiny).
* A sampled base field (``model_options.lora.r``) is one line, exit 2, nothing written.
* Asking up to K points never goes past ``n_trials``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.sweep.launching.packed_search import ask_search_points
from harness.sweep.scheduler.study import open_study
from harness.sweep.stores.storage import make_storage
from harness.tracking import MemoryTracker
from tests.support.experiments import search_file
from tests.support.packing import assert_same_histories, child_runs, lora_base
from tests.support.study_reads import trials

pytest.importorskip("peft")
optuna.logging.set_verbosity(optuna.logging.WARNING)

# Non-base fields only: the points of one seed can share a base.
PARAMS = {
    "optim.lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
    "ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3},
}


def _search(
    tmp_path: Path, n_trials: int = 4, params: dict[str, Any] = PARAMS, **more: Any
) -> Path:
    return search_file(
        tmp_path, "psearch", lora_base(), n_trials=n_trials, params=params, seeds=2, steps=3,
        **more,
    )  # fmt: skip


def _invoke(args: list[str], results: Path) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [*args, "--results-dir", str(results)])
    return r.exit_code, r.stderr, r.stdout


@pytest.mark.slow  # 8 LoRA runs in 4 packs: about 1 min on a loaded 2-core machine
def test_a_packed_search_completes_every_point_with_every_seed_in_packs(tmp_path):
    exp, results = _search(tmp_path), tmp_path / "results"
    code, err, out = _invoke(
        ["search", str(exp), "--workers", "1", "--cells-per-worker", "2"], results
    )
    assert code == 0, out + err
    ts = trials(results, "psearch")
    assert sorted(t.state.name for t in ts) == ["COMPLETE"] * 4
    for t in ts:
        assert t.user_attrs["outcome"] == "completed" and t.user_attrs["seeds_run"] == 2
        assert len(t.user_attrs["seed_values"][0]) == 2
        assert sorted(t.intermediate_values) == [0, 1]  # each seed reported to the pruner
        assert 1e-3 <= t.params["optim.lr"] <= 3e-2
    _, runs = child_runs(results, "psearch")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 8
    # Each run trained beside the other point asked with it: the pack tag names both trials.
    packs = {(r.data.tags["search.trial"], r.data.tags["seed"]): r.data.tags["harness.pack"]
             for r in runs}  # fmt: skip
    assert sorted(packs) == [(str(n), s) for n in range(4) for s in ("0", "1")]
    for (number, _), together in packs.items():
        mates = together.split(",")
        assert len(mates) == 2 and number in mates, packs
    assert {packs[(str(n), "0")] for n in range(4)} == {packs[(str(n), "1")] for n in range(4)}


def _worker_run(tmp_path: Path, name: str, k: int, points: list[dict[str, float]]) -> MemoryTracker:
    """A search of ``points`` (enqueued, so both runs train the same ones) run by one
    in-process worker at ``k`` points per worker; its tracker."""
    from harness.sweep.launching.worker import WorkerOptions, worker_loop

    tracker = MemoryTracker()
    results = tmp_path / name
    exp = load_experiment(_search(tmp_path, n_trials=len(points)))
    study, _ = open_study(
        exp, storage=make_storage(None, results), tracker=tracker, study_name=None,
        tracking_uri="memory", command="test",
    )  # fmt: skip
    for p in points:
        study.enqueue_trial(p)
    import harness.sweep.launching.worker as worker

    real = worker.make_tracker
    try:
        worker.make_tracker = lambda *a, **kw: tracker  # type: ignore[assignment]
        opts = WorkerOptions(study="psearch", storage=None, results_dir=results,
                             cells_per_worker=k)  # fmt: skip
        counts = worker_loop(opts)
    finally:
        worker.make_tracker = real
    assert counts["completed"] == len(points), counts
    return tracker


def _histories(tracker: MemoryTracker) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(trial number, seed) -> each metric's history of its child run, but the clock's."""
    out = {}
    for r in tracker.runs.values():
        if r.tags.get("harness.role") != "child":
            continue
        key = (r.tags["search.trial"], r.tags["seed"])
        assert key not in out, key
        out[key] = {
            m: [v for _, v in sorted(xs)]
            for m, xs in r.metrics.items()
            if not m.startswith("perf/") and m != "final/wall_time"
        }
    return out


@pytest.mark.slow  # 4 LoRA runs packed and 4 alone: about 1 min on a loaded 2-core machine
def test_a_packed_point_has_its_unpacked_seed_history(tmp_path):
    points = [{"optim.lr": 0.01, "ppo.eps_clip": 0.2}, {"optim.lr": 0.03, "ppo.eps_clip": 0.1}]
    packed = _worker_run(tmp_path, "packed", 2, points)
    alone = _worker_run(tmp_path, "alone", 1, points)
    assert any("harness.pack" in r.tags for r in packed.runs.values())
    assert not any("harness.pack" in r.tags for r in alone.runs.values())
    got, want = _histories(packed), _histories(alone)
    assert sorted(got) == sorted(want) == [(n, s) for n in ("0", "1") for s in ("0", "1")]
    assert_same_histories(got, want)
    # The two points are two runs (a mix-up of adapters would make them equal).
    entropy = [want[(n, "0")]["policy/entropy"][-1] for n in ("0", "1")]
    assert entropy[0] != pytest.approx(entropy[1], rel=1e-6)


def test_a_sampled_base_field_is_one_line_and_nothing_is_written(tmp_path):
    results = tmp_path / "results"
    params = {**PARAMS, "model_options.lora.r": {"type": "int", "low": 2, "high": 8}}
    exp = _search(tmp_path, params=params)
    code, err, out = _invoke(["search", str(exp), "--cells-per-worker", "2"], results)
    assert code == 2, out + err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        "error: --cells-per-worker 2: search.params.model_options.lora.r is a base field "
        "(model_options)"
    ), err
    assert not results.exists()
    # The file's own cells_per_worker: the same answer.
    exp = _search(tmp_path, params=params, cells_per_worker=2)
    code, err, _ = _invoke(["search", str(exp)], results)
    assert code == 2 and "search.params.model_options.lora.r is a base field" in err, err
    assert not results.exists()


def test_asking_up_to_k_points_stays_within_n_trials(tmp_path):
    exp = load_experiment(_search(tmp_path, n_trials=5))
    study, spec = open_study(
        exp, storage=make_storage(None, tmp_path / "results"), tracker=MemoryTracker(),
        study_name=None, tracking_uri="memory", command="test",
    )  # fmt: skip
    first = ask_search_points(study, spec, 3)
    assert [t.number for t in first] == [0, 1, 2]
    study.tell(first[0], 1.0)  # a finished point still counts against the budget
    study.tell(first[1], state=optuna.trial.TrialState.PRUNED)
    assert [t.number for t in ask_search_points(study, spec, 3)] == [3, 4]
    assert ask_search_points(study, spec, 3) == []
    # A dead worker's point waiting to be retried is taken even at the budget.
    study.tell(first[2], state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial(first[2].params)
    assert [t.number for t in ask_search_points(study, spec, 3)] == [5]
    states = [t.state.name for t in study.get_trials()]
    assert states.count("RUNNING") == 3 and len(states) == 6


def test_a_packed_racing_search_drops_raced_out_points_and_trains_the_rest(tmp_path, monkeypatch):
    """Racing (adaptive seeds) in packs, training faked: the metric peaks at eps_clip 0.2, so
    points far from it are raced out after 3 seeds and end alone, while their packmates go on to
    all 7 seeds; every pack holds runs of one seed index, never more points than are live."""
    import numpy as np

    import harness.run.packing as packing
    from harness.run.scaffold import RunResult
    from harness.sweep.launching import worker
    from harness.sweep.launching.trial import ClaimedTrial
    from tests.support.studies import open_test_study

    def result(cfg: Any) -> RunResult:
        rng = np.random.default_rng([int(cfg.ppo.eps_clip * 1e6), cfg.seed])
        value = -10.0 * abs(cfg.ppo.eps_clip - 0.2) + 0.02 * rng.standard_normal()
        return RunResult("completed", "", cfg.steps, {}, {"final/reward": value}, 1.0, False)

    packs: list[list[int]] = []  # the seeds of each pack's runs

    def run_packed(cfgs: list[Any], hooks: list[Any]) -> list[RunResult]:
        packs.append([c.seed for c in cfgs])
        return [result(c) for c in cfgs]

    def train(self: Any, cfg: Any, label: str, seed: int) -> tuple[Any, str]:
        packs.append([seed])
        return result(cfg), "rid"

    monkeypatch.setattr(packing, "run_packed", run_packed)
    monkeypatch.setattr(ClaimedTrial, "train", train)
    tracker = MemoryTracker()
    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    path = search_file(
        tmp_path, "race", lora_base(), n_trials=8, pruner="none", steps=2,
        params={"ppo.eps_clip": {"type": "float", "low": 0.05, "high": 0.5}},
        seeds={"min": 3, "max": 7, "batch": 2, "margin": 0.01},
    )  # fmt: skip
    results = tmp_path / "results"
    study, _ = open_test_study(path, results, tracker, tracking_uri="memory", enqueue=False)
    events: list[dict] = []
    opts = worker.WorkerOptions(study="race", storage=None, results_dir=results, cells_per_worker=2)
    worker.worker_loop(opts, emit=events.append)
    trials_ = study.get_trials()
    assert len(trials_) == 8
    raced = [t for t in trials_ if t.state.name == "PRUNED"]
    done = [t for t in trials_ if t.state.name == "COMPLETE"]
    assert raced and done and len(raced) + len(done) == 8
    for t in raced:
        assert t.user_attrs["seeds_run"] == 3
        assert t.user_attrs["reason"].startswith("raced out against trial ")
    for t in done:
        assert t.user_attrs["seeds_run"] == 7 and len(t.user_attrs["seed_values"][0]) == 7
    # Each pack is one seed's runs; a raced-out point left its packmate to go on alone.
    assert all(len(set(p)) == 1 and len(p) <= 2 for p in packs), packs
    assert any(len(p) == 2 for p in packs) and any(len(p) == 1 for p in packs), packs
    assert sum(len(p) for p in packs) == 3 * len(raced) + 7 * len(done)
    ends = [e for e in events if e["event"] == "done"]
    assert sorted(e["trial"] for e in ends) == list(range(8))  # each point ends once
