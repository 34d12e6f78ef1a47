"""`harness ablate --cells-per-worker K` (or ``cells_per_worker: K``): a worker claims up to K
grid trials whose configs share their base fields (seed included) and trains them on one base
model (harness/run/packing.py), each trial keeping its own Optuna trial, MLflow run and report
entry.

* A 2-cell x 2-seed LoRA grid packed 2 per worker: each (cell, seed) completes exactly once, with
  the unpacked sweep's metric history (1e-5 relative), and the report is written.
* SIGTERM interrupts every trial of a pack (each recorded interrupted, its run KILLED), and the
  sweep resumes unpacked; kill -9 of a packed worker has each of its trials retried exactly once
  by the rerun.  The states are made, not waited out: tests/hooks/sitecustomize.py (first on
  the sweep's PYTHONPATH) holds the worker once the pack's second run recorded its first step.
* What cannot pack: a non-LoRA grid is one line (exit 2, nothing written); cells that differ in a
  base field pack apart, and the dry run says which share a worker, the memory of a pack and the
  wall time at that K; workers x K past the bound is one line (a search's too).
* The claim: only compatible WAITING trials, and under adaptive seeds only released ones.
* In a worker in this process: a trial that raises ends alone as an error (its run FAILED) and
  is retried; a full disk met by one trial interrupts every trial of the pack.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.run.scaffold import RunResult
from harness.run.tracked import finish_tracked_run, start_tracked_run
from harness.sweep.scheduler.estimate import RunCosts, estimate_text, estimate_wall_time
from harness.sweep.scheduler.packs import PackKeys, claim_packmates, pack_memory, plan_packs
from harness.sweep.scheduler.spec import trial_key
from harness.sweep.scheduler.study import enqueue_missing, open_study
from harness.sweep.scheduler.trials import next_trial
from harness.sweep.stores.storage import make_storage
from harness.tracking import MemoryTracker
from tests.hooks.kill_at import kill_worker_at_marker, term_at_marker
from tests.support.packing import (
    CELLS,
    assert_one_pack_per_seed,
    assert_same_histories,
    child_runs,
    hooked,
    lora_base,
    lora_grid,
    rerun,
)
from tests.support.study_reads import trials

pytest.importorskip("peft")
optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[3]


def _histories(results: Path, name: str) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(cell, seed) -> every metric's history of its child run, but the clock's (perf/*, wall)."""
    client, runs = child_runs(results, name)
    out = {}
    for r in runs:
        key = (r.data.tags["ablation.cell"], r.data.tags["seed"])
        assert key not in out, f"{key} has two child runs"
        out[key] = {
            m: [x.value for x in sorted(client.get_metric_history(r.info.run_id, m),
                                        key=lambda x: x.step)]
            for m in r.data.metrics
            if not m.startswith("perf/") and m != "final/wall_time"
        }  # fmt: skip
    return out


# -- the done-when test ----------------------------------------------------------------------


@pytest.mark.slow  # two sweeps of 4 LoRA runs: about 3 min on a loaded 2-core machine
def test_a_packed_grid_gives_each_cell_seed_its_unpacked_history_exactly_once(tmp_path):
    exp = lora_grid(tmp_path, "packed", seeds=2)
    packed, alone = tmp_path / "packed", tmp_path / "alone"
    for results, extra in ((packed, ["--workers", "2", "--cells-per-worker", "2"]),
                           (alone, ["--workers", "1", "--no-report"])):  # fmt: skip
        r = CliRunner().invoke(app, ["ablate", str(exp), "--results-dir", str(results), *extra])
        assert r.exit_code == 0, r.output

    # The runs of one seed trained together, one pack per seed (the seed is a base field).
    assert_one_pack_per_seed(packed, "packed")

    got, want = _histories(packed, "packed"), _histories(alone, "packed")
    assert got.keys() == want.keys() and len(got) == 4
    assert_same_histories(got, want)
    # The two cells are two runs (a mix-up of adapters would make them equal).
    entropy = [want[(c, "0")]["policy/entropy"][-1] for c in CELLS]
    assert entropy[0] != pytest.approx(entropy[1], rel=1e-6)

    report = (packed / "packed" / "report.md").read_text()
    assert all(c in report for c in CELLS)


# -- faults ------------------------------------------------------------------------------------


def _hooked(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str], Path, Path]:
    """The packed sweep held mid-pack (:func:`hooked`) of a 2-cell x 1-seed grid."""
    return hooked(tmp_path, "ablate", lora_grid(tmp_path, name), "--no-report")


def _complete_once(results: Path, name: str) -> list:
    after = trials(results, name)
    complete = sorted(trial_key(t) for t in after if t.state == TrialState.COMPLETE)
    assert complete == [(c, 0) for c in CELLS], [(t.number, t.state.name) for t in after]
    assert not [t for t in after if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    return after


@pytest.mark.slow  # two sweeps in subprocesses: about 1-2 min on a loaded 2-core machine
def test_sigterm_interrupts_every_trial_of_a_pack_and_the_sweep_resumes_unpacked(tmp_path):
    cmd, env, results, marker = _hooked(tmp_path, "pack-term")

    def held() -> None:  # one pack of two
        assert sorted(t.state.name for t in trials(results, "pack-term")) == ["RUNNING"] * 2

    code, out = term_at_marker(cmd, env, marker, "the pack's second run", while_held=held, cwd=ROOT)
    assert code == 130, out[-3000:]
    ts = trials(results, "pack-term")
    assert sorted((trial_key(t), t.state.name, t.user_attrs.get("outcome")) for t in ts) == [
        ((c, 0), "FAIL", "interrupted") for c in CELLS
    ]
    _, runs = child_runs(results, "pack-term")
    assert (
        sorted((r.info.status, r.data.tags.get("run.status")) for r in runs)
        == [("KILLED", "interrupted")] * 2
    )

    cmd.remove("--cells-per-worker")
    cmd.remove("2")
    rerun(cmd)  # resumed unpacked
    after = _complete_once(results, "pack-term")
    assert len(after) == 4  # the two interrupted, then each (cell, seed) once
    _, runs = child_runs(results, "pack-term")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED", "KILLED", "KILLED"]
    assert all("harness.pack" not in r.data.tags for r in runs if r.info.status == "FINISHED")


@pytest.mark.slow  # two sweeps in subprocesses: about 1-2 min on a loaded 2-core machine
def test_a_packed_worker_killed_mid_run_has_each_trial_retried_exactly_once(tmp_path):
    cmd, env, results, marker = _hooked(tmp_path, "pack-kill")
    kill_worker_at_marker(cmd, env, marker, "the pack's second run", ROOT)
    before = trials(results, "pack-kill")
    assert sorted((trial_key(t), t.state.name) for t in before) == [
        ((c, 0), "RUNNING") for c in CELLS
    ]

    rerun(cmd)
    after = _complete_once(results, "pack-kill")
    for cell in CELLS:  # the dead attempt (failed by its stale heartbeat), then one retry
        attempts = sorted(t.state.name for t in after if trial_key(t) == (cell, 0))
        assert attempts == ["COMPLETE", "FAIL"], (cell, attempts)
    dead = {t.number for t in before}
    assert all(t.user_attrs.get("outcome") is None for t in after if t.number in dead)
    _, runs = child_runs(results, "pack-kill")
    statuses = sorted((r.info.status, r.data.tags.get("run.status")) for r in runs)
    assert statuses == [("FINISHED", "completed")] * 2 + [("KILLED", "killed")] * 2


# -- what cannot pack, and the dry run ------------------------------------------------------


def _invoke(args: list[str], results: Path):
    r = CliRunner().invoke(app, [*args, "--results-dir", str(results)])
    return r.exit_code, r.stderr, r.stdout


def test_a_non_lora_grid_is_one_line_and_nothing_is_written(tmp_path):
    smoke = ROOT / "experiments" / "smoke.yaml"
    results = tmp_path / "results"
    for extra in (["--dry-run"], []):
        code, err, out = _invoke(["ablate", str(smoke), "--cells-per-worker", "2", *extra], results)
        assert code == 2, out + err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(
            "error: --cells-per-worker 2: no cell of the grid can pack: model_options.lora: "
            "packing needs LoRA adapters (the packed runs share one frozen base model"
        ), err
        assert not results.exists()
    # The experiment file's own field: the same answer.
    doc = yaml.safe_load(smoke.read_text())
    doc["cells_per_worker"] = 2
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, err, _ = _invoke(["ablate", str(path), "--dry-run"], results)
    assert code == 2 and "model_options.lora: packing needs LoRA adapters" in err, err
    assert not results.exists()


def test_too_many_trials_at_once_is_one_line(tmp_path):
    # A search packs (tests/sweep/launching/test_packing_search.py) within the same bound.
    results = tmp_path / "results"
    search = {"n_trials": 2, "params": {"optim.lr": {"type": "float", "low": 1e-3, "high": 1e-2}}}
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump({"name": "s", "base": lora_base(), "search": search, "steps": 2, "seeds": 1})
    )
    code, err, _ = _invoke(
        ["search", str(path), "--workers", "200", "--cells-per-worker", "2"], results
    )
    assert code == 2 and "200 workers x 2 cells per worker = 400 trials at once" in err, err
    exp = lora_grid(tmp_path, "many")
    code, err, _ = _invoke(
        ["ablate", str(exp), "--workers", "200", "--cells-per-worker", "2", "--dry-run"], results
    )
    assert code == 2, err
    assert err == (
        "error: --cells-per-worker: 200 workers x 2 cells per worker = 400 trials at once; "
        "at most 256\n"
    )
    code, err, _ = _invoke(["ablate", str(exp), "--cells-per-worker", "0", "--dry-run"], results)
    assert code == 2 and "--cells-per-worker: must be an integer in [1, 64]; got 0" in err, err
    assert not results.exists()


MIXED = {  # 6 cells: two widths (a base field) x two learning rates, and one without LoRA
    "optim.lr": [0.01, 0.03],
    "variant": {
        "w64": {"tiny.intermediate_size": 64},
        "w96": {"tiny.intermediate_size": 96},
        "full": {"model_options.lora": None},
    },
}


def test_the_dry_run_says_which_cells_share_a_worker_and_what_it_costs(tmp_path, monkeypatch):
    import harness.sweep.launching.estimating as estimating

    def measured(spec, workers, command_s=0.0, packs=None):  # the probes' costs, made up
        return estimate_wall_time(
            spec, workers, probe=lambda cfg, label: RunCosts(step_s=0.1, setup_s=2.0), packs=packs
        )

    monkeypatch.setattr(estimating, "measured_wall_time", measured)
    exp = lora_grid(tmp_path, "mixed", grid=MIXED, baseline=None, seeds=2)
    results = tmp_path / "results"
    code, err, out = _invoke(["ablate", str(exp), "--cells-per-worker", "2", "--dry-run"], results)
    assert code == 0, out + err
    lines = out[out.index("packing: ") :].splitlines()
    assert lines[:5] == [
        "packing: up to 2 cells per worker (trials of one seed whose base fields agree): 12 "
        "trials in 8 packs or lone runs (4 per seed)",
        "  lr=0.01 variant=w64 + lr=0.03 variant=w64: share a worker",
        "  lr=0.01 variant=w96 + lr=0.03 variant=w96: share a worker",
        "  lr=0.01 variant=full: runs alone (model_options.lora: packing needs LoRA adapters "
        "(the packed runs share one frozen base model and each trains its own adapter); set "
        "model_options.lora, or run the cells unpacked)",
        "  lr=0.03 variant=full: runs alone (model_options.lora: packing needs LoRA adapters "
        "(the packed runs share one frozen base model and each trains its own adapter); set "
        "model_options.lora, or run the cells unpacked)",
    ], lines
    assert lines[5] == (
        "  lr=0.01 variant=w96, lr=0.03 variant=w96: packs apart from lr=0.01 variant=w64 "
        "(they differ in tiny.intermediate_size)"
    )
    assert lines[6].startswith("memory of a pack of 2 (lower bound: float32 weights, adapters")
    assert " kB base + 2 x " in lines[6] and "in 2 workers" in lines[6], lines[6]
    # The wall time at K = 2, a pack paying one setup: runs of 2 s setup + 3 steps x 0.1 s;
    # per seed 2 packs x (2 + 2 x 0.3) s + 2 lone runs x 2.3 s, x 2 seeds = 19.6 s.
    head = next(ln for ln in lines if ln.startswith("estimated wall time"))
    runs = lines[lines.index(head) + 1]
    assert runs.startswith("  12 runs: 20 s with 1 worker(s), up to 2 packed in each"), runs
    assert not results.exists()


def test_the_wall_time_of_packs_pays_one_setup_per_pack(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "4")
    spec = load_experiment(lora_grid(tmp_path, "wall", seeds=3))

    def probe(cfg, label):
        return RunCosts(step_s=0.5, setup_s=4.0, eval_s=1.0)

    alone = estimate_wall_time(spec, workers=1, probe=probe)
    packed = estimate_wall_time(spec, workers=1, probe=probe, packs=[CELLS])
    # A run: 4 s setup + 3 steps x 0.5 s + 2 evaluations (start, last) x 1 s = 7.5 s.
    assert math.isclose(alone.runs_s, 2 * 7.5 * 3)
    assert math.isclose(packed.runs_s, (4.0 + 2 * 3.5) * 3)  # one setup per pack
    assert alone.runs == packed.runs == 6 and packed.packed == 2
    assert ", up to 2 packed in each (per run:" in estimate_text(packed, 1)


def test_the_memory_of_a_pack_counts_one_base_and_each_trials_adapters(tmp_path):
    spec = load_experiment(lora_grid(tmp_path, "mem"))
    from harness.sweep.scheduler.spec import StudySpec

    cfg = StudySpec.from_experiment(spec).cell_config(CELLS[0], 0)
    base, trial = pack_memory(cfg)
    from harness.model.lora import model_modules

    modules = model_modules("tiny", tiny=cfg.tiny)
    params = sum(p.numel() for p in modules[""].parameters())
    # q_proj and v_proj of the one layer: rank 4 x (in + out) each, x 4 float32 copies
    # (weights, gradients, AdamW's two moments).
    q, v = modules["model.layers.0.self_attn.q_proj"], modules["model.layers.0.self_attn.v_proj"]
    adapter = 4 * (q.in_features + q.out_features) + 4 * (v.in_features + v.out_features)
    assert (base, trial) == (params * 4, adapter * 4 * 4)


# -- the claim -------------------------------------------------------------------------------


def _study(tmp_path: Path, exp_path: Path):
    exp = load_experiment(exp_path)
    storage = make_storage(None, tmp_path / "results")
    study, spec = open_study(
        exp, storage=storage, tracker=MemoryTracker(), study_name=None, tracking_uri=None,
        command="test",
    )  # fmt: skip
    enqueue_missing(study, spec)
    return exp, study, spec


def test_a_worker_claims_only_waiting_trials_that_share_the_base(tmp_path):
    exp, study, spec = _study(
        tmp_path, lora_grid(tmp_path, "claim", grid=MIXED, baseline=None, seeds=2)
    )
    keys = PackKeys(spec, device=None, threads=1)
    plan = plan_packs(exp, 4)
    assert plan.packs == [
        ["lr=0.01 variant=w64", "lr=0.03 variant=w64"],
        ["lr=0.01 variant=w96", "lr=0.03 variant=w96"],
    ]
    claimed = []
    while (first := next_trial(study, spec)[0]) is not None:
        key = trial_key(study._storage.get_trial(first._trial_id))
        mates = claim_packmates(study, spec, key, 4, keys)
        claimed.append([key, *(trial_key(study._storage.get_trial(m._trial_id)) for m in mates)])
    # Enqueue order is cell by cell (the file's variants sorted: full, w64, w96): each pack is
    # its first trial's seed's compatible cells (K = 4 is a maximum); a cell without LoRA runs
    # alone.
    assert claimed == [
        [("lr=0.01 variant=full", 0)],
        [("lr=0.01 variant=full", 1)],
        [("lr=0.01 variant=w64", 0), ("lr=0.03 variant=w64", 0)],
        [("lr=0.01 variant=w64", 1), ("lr=0.03 variant=w64", 1)],
        [("lr=0.01 variant=w96", 0), ("lr=0.03 variant=w96", 0)],
        [("lr=0.01 variant=w96", 1), ("lr=0.03 variant=w96", 1)],
        [("lr=0.03 variant=full", 0)],
        [("lr=0.03 variant=full", 1)],
    ]


def test_adaptive_seeds_pack_released_seeds_only(tmp_path):
    seeds = {"min": 2, "max": 4, "batch": 2, "decide": "ranking"}
    exp, study, spec = _study(tmp_path, lora_grid(tmp_path, "adaptive", seeds=seeds, baseline=None))
    keys = PackKeys(spec, device=None, threads=1)
    claimed = []
    while (first := next_trial(study, spec)[0]) is not None:
        key = trial_key(study._storage.get_trial(first._trial_id))
        mates = claim_packmates(study, spec, key, 3, keys)
        claimed.append([key, *(trial_key(study._storage.get_trial(m._trial_id)) for m in mates)])
    # Seeds 0 and 1 are released (min 2); seeds 2 and 3 stay held until a look: never claimed.
    assert sorted(claimed) == [[(CELLS[0], s), (CELLS[1], s)] for s in (0, 1)]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(trial_key(t) for t in waiting) == [(c, s) for c in CELLS for s in (2, 3)]


def test_a_packed_run_that_failed_alone_ends_failed_in_the_tracker():
    from harness.config import build_run_config

    tracker = MemoryTracker()
    rid = start_tracked_run(build_run_config({}), tracker, experiment="e", run_name="r")
    failed = RunResult(
        status="failed", reason="RuntimeError: boom", steps_done=1, history={}, summary={},
        wall_time=1.0, inert_clip=False,
    )  # fmt: skip
    finish_tracked_run(tracker, rid, failed)
    run = tracker.runs[rid]
    assert run.status == "FAILED"
    assert (run.tags["run.status"], run.tags["run.reason"]) == ("failed", "RuntimeError: boom")


# -- a trial of a pack that fails, in a worker in this process --------------------------------


def _worker_study(tmp_path: Path, monkeypatch, tracker: MemoryTracker, max_retries: int = 0):
    """A 2-cell x 1-seed LoRA study whose in-process worker records in ``tracker``."""
    from harness.sweep.launching.worker import WorkerOptions

    monkeypatch.setattr("harness.sweep.launching.worker.make_tracker", lambda *a, **k: tracker)
    exp = load_experiment(lora_grid(tmp_path, "inproc"))
    results = tmp_path / "results"
    study, spec = open_study(
        exp, storage=make_storage(None, results), tracker=tracker, study_name=None,
        tracking_uri="memory", command="test", max_retries=max_retries,
    )  # fmt: skip
    assert enqueue_missing(study, spec) == (2, 0)
    return study, WorkerOptions(study="inproc", storage=None, results_dir=results,
                                cells_per_worker=2)  # fmt: skip


def _runs(tracker: MemoryTracker) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in tracker.runs.values():
        if r.tags.get("harness.role") == "child":
            out.setdefault(r.tags["ablation.cell"], []).append(r)
    return out


def test_a_trial_that_raises_ends_alone_as_an_error_and_is_retried(tmp_path, monkeypatch):
    import harness.sweep.launching.packed as packed
    from harness.sweep.launching.worker import worker_loop

    real = packed._hooks

    def hooks(m, pack):  # the second cell's tracker call raises after its step 1 is logged
        h = real(m, pack)
        if m.cell == CELLS[1] and "harness.pack" in tracker.runs[m.rid].tags:
            log = h["on_metrics"]

            def on_metrics(step, metrics):
                log(step, metrics)
                if step == 1:
                    raise RuntimeError("reward server gone")

            h["on_metrics"] = on_metrics
        return h

    monkeypatch.setattr(packed, "_hooks", hooks)
    tracker = MemoryTracker()
    study, opts = _worker_study(tmp_path, monkeypatch, tracker, max_retries=1)
    events: list[dict] = []
    counts = worker_loop(opts, emit=events.append)
    assert (counts["completed"], counts["error"]) == (2, 1), counts
    ts = study.get_trials()
    got = sorted((trial_key(t), t.user_attrs["attempt"], t.state.name, t.user_attrs["outcome"],
                  t.user_attrs.get("reason")) for t in ts)  # fmt: skip
    assert got == [
        ((CELLS[0], 0), 0, "COMPLETE", "completed", ""),
        ((CELLS[1], 0), 0, "FAIL", "error", "RuntimeError: reward server gone"),
        ((CELLS[1], 0), 1, "COMPLETE", "completed", ""),  # the retry, trained alone
    ]
    runs = _runs(tracker)
    (alone,) = runs[CELLS[0]]
    failed, retried = runs[CELLS[1]]
    assert (alone.status, alone.tags["harness.pack"]) == ("FINISHED", "0,1")
    assert (failed.status, failed.tags["run.status"]) == ("FAILED", "failed")
    assert failed.tags["run.reason"] == "RuntimeError: reward server gone"
    assert [s for s, _ in failed.metrics["objective/reward"]] == [0, 1]
    assert retried.status == "FINISHED" and "harness.pack" not in retried.tags
    assert [s for s, _ in alone.metrics["objective/reward"]] == [0, 1, 2]
    packed_starts = [e for e in events if e["event"] == "start" and e.get("packed") == 2]
    assert sorted(e["cell"] for e in packed_starts) == CELLS


def test_a_full_disk_met_by_one_trial_interrupts_the_whole_pack(tmp_path, monkeypatch):
    import errno

    from harness.sweep.launching.worker import worker_loop

    class FullAtStep1(MemoryTracker):  # the second cell's step 1 meets a full disk
        def log_metrics(self, run_id, metrics, step):
            if step == 1 and self.runs[run_id].tags.get("ablation.cell") == CELLS[1]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "mlflow.db")
            super().log_metrics(run_id, metrics, step)

    tracker = FullAtStep1()
    study, opts = _worker_study(tmp_path, monkeypatch, tracker)
    events: list[dict] = []
    counts = worker_loop(opts, emit=events.append)
    assert counts["disk_full"] == 1 and counts["completed"] == 0, counts
    ts = study.get_trials()
    assert sorted((trial_key(t), t.state.name, t.user_attrs["outcome"]) for t in ts) == [
        ((c, 0), "FAIL", "interrupted") for c in CELLS
    ]
    reasons = {t.user_attrs["reason"] for t in ts}
    assert len(reasons) == 1 and next(iter(reasons)).startswith("disk full"), reasons
    runs = _runs(tracker)
    assert (
        sorted((r[0].status, r[0].tags["run.status"]) for r in runs.values())
        == [("KILLED", "interrupted")] * 2
    )
    done = [e for e in events if e["event"] == "done"]
    assert sorted((e["cell"], e["outcome"]) for e in done) == [(c, "interrupted") for c in CELLS]
