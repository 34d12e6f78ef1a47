"""Faults in a packed search (``harness search --cells-per-worker 2``): a LoRA search of 2
points x 1 seed (3 steps) run by one worker, which asks both points at once and trains them as
one pack.  The states are made, not waited out: tests/hooks/sitecustomize.py (first on the
sweep's PYTHONPATH) holds the worker once the pack's second run recorded its first step, both
trials RUNNING.

* SIGTERM to the coordinator: exit 130, each point told FAIL ``interrupted`` and its run ended
  KILLED.  An interrupted point does not count against ``n_trials``, so the rerun samples two
  new points in their place and trains them, packed again, to the end.
* kill -9 of the whole process group: the rerun finds each dead point stale by its heartbeat,
  fails it (no outcome: nobody told it) and trains the WAITING copy Optuna's retry callback
  enqueued, at the dead point's own params, exactly once; the dead point's run ends KILLED
  ``killed``.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from harness.sweep.launching.packed import PACK_TAG
from harness.sweep.scheduler.trials import DIED
from tests.hooks.kill_at import kill_worker_at_marker, term_at_marker
from tests.support.experiments import search_file
from tests.support.packing import ROOT, child_runs, hooked, lora_base, rerun
from tests.support.study_reads import trials

pytest.importorskip("peft")
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_TRIALS = 2


def _hooked(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str], Path, Path]:
    """The packed search held mid-pack (:func:`hooked`): 2 points x 1 seed of 3 steps, over
    ``ppo.eps_clip`` (not a base field: the points can share a base)."""
    exp = search_file(tmp_path, name, lora_base(), n_trials=N_TRIALS, seeds=1, steps=3)
    return hooked(tmp_path, "search", exp)


def _held(results: Path, name: str) -> list[FrozenTrial]:
    """The trials while the worker holds: both points asked and RUNNING, in one pack."""
    ts = trials(results, name)
    assert sorted((t.number, t.state.name) for t in ts) == [(0, "RUNNING"), (1, "RUNNING")]
    return ts


def _complete(results: Path, name: str) -> list[FrozenTrial]:
    """The trials after the rerun: exactly ``n_trials`` points COMPLETE (each with its one
    seed), the dead or interrupted ones FAIL, nothing left RUNNING or WAITING."""
    after = trials(results, name)
    states = [t.state for t in after]
    assert states.count(TrialState.COMPLETE) == N_TRIALS, [(t.number, t.state) for t in after]
    assert set(states) == {TrialState.COMPLETE, TrialState.FAIL}, states
    for t in after:
        if t.state == TrialState.COMPLETE:
            assert (t.user_attrs["outcome"], t.user_attrs["seeds_run"]) == ("completed", 1)
    return after


def _runs(results: Path, name: str) -> dict[int, tuple[str, str | None, str | None, str]]:
    """Trial number -> (status, run.status, run.reason, harness.pack) of its one child run."""
    _, runs = child_runs(results, name)
    out = {}
    for r in runs:
        number = int(r.data.tags["search.trial"])
        assert number not in out, f"trial {number} has two child runs"
        tags = r.data.tags
        out[number] = (r.info.status, tags.get("run.status"), tags.get("run.reason"),
                       tags.get(PACK_TAG, ""))  # fmt: skip
    return out


@pytest.mark.slow  # two searches in subprocesses: about 1-2 min on a loaded 2-core machine
def test_sigterm_interrupts_both_points_of_a_pack_and_the_rerun_samples_their_places(tmp_path):
    cmd, env, results, marker = _hooked(tmp_path, "psearch-term")
    code, out = term_at_marker(
        cmd, env, marker, "the pack's second run", cwd=ROOT,
        while_held=lambda: _held(results, "psearch-term"),
    )  # fmt: skip
    assert code == 130, out[-3000:]
    ts = trials(results, "psearch-term")
    assert sorted((t.number, t.state.name, t.user_attrs.get("outcome")) for t in ts) == [
        (0, "FAIL", "interrupted"),
        (1, "FAIL", "interrupted"),
    ]
    runs = _runs(results, "psearch-term")
    assert {n: (s, rs, pack) for n, (s, rs, _, pack) in runs.items()} == {
        0: ("KILLED", "interrupted", "0,1"),
        1: ("KILLED", "interrupted", "0,1"),
    }

    # Resumed packed, as it was started: the packed worker asks the two places the interrupted
    # points left in n_trials as one pack (an unpacked rerun asks the same way, one at a time).
    rerun(cmd)
    after = _complete(results, "psearch-term")
    assert sorted((t.number, t.state.name) for t in after) == [
        (0, "FAIL"), (1, "FAIL"), (2, "COMPLETE"), (3, "COMPLETE")
    ]  # fmt: skip
    # New points, not retries: an interrupted point is replaced by the sampler, not re-run.
    assert all("failed_trial" not in t.system_attrs for t in after)
    runs = _runs(results, "psearch-term")
    assert sorted(runs) == [0, 1, 2, 3]  # each trial one run: none trained twice
    assert {n: (s, rs, pack) for n, (s, rs, _, pack) in runs.items() if n >= 2} == {
        2: ("FINISHED", "completed", "2,3"),
        3: ("FINISHED", "completed", "2,3"),
    }
    assert [runs[n][:2] for n in (0, 1)] == [("KILLED", "interrupted")] * 2  # left as they were


@pytest.mark.slow  # two searches in subprocesses: about 1-2 min on a loaded 2-core machine
def test_a_packed_search_worker_killed_mid_pack_has_each_point_retried_once_at_its_params(
    tmp_path,
):
    cmd, env, results, marker = _hooked(tmp_path, "psearch-kill")
    kill_worker_at_marker(cmd, env, marker, "the pack's second run", ROOT)
    dead = {t.number: t.params for t in _held(results, "psearch-kill")}
    assert dead[0] != dead[1] and all(p.keys() == {"ppo.eps_clip"} for p in dead.values())

    rerun(cmd)
    after = _complete(results, "psearch-kill")
    assert len(after) == 2 * N_TRIALS, [(t.number, t.state) for t in after]  # no extra point
    for t in after:
        if t.number in dead:  # failed by its stale heartbeat: nobody told it an outcome
            assert t.state == TrialState.FAIL and "outcome" not in t.user_attrs, t
    # Each dead point has one retry, at the same params: the WAITING copy Optuna's
    # RetryHeartbeatStaleTrialCallback enqueued, which names the dead trial in its system attrs
    # (what its experimental ``retried_trial_number`` and ``retry_history`` read).
    retried = {t.system_attrs.get("failed_trial"): t for t in after if t.number not in dead}
    assert sorted(retried) == [0, 1], [t.system_attrs for t in after]
    for number, retry in retried.items():
        assert retry.system_attrs["retry_history"] == [number]  # a first retry, not a retry's
        assert retry.state == TrialState.COMPLETE and retry.params == dead[number], retry
    runs = _runs(results, "psearch-kill")
    assert sorted(runs) == [0, 1, 2, 3]  # each trial one run: no point trained twice
    for number in dead:  # the dead worker's runs, ended by the retries
        assert runs[number][:3] == ("KILLED", "killed", DIED), runs[number]
        assert runs[number][3] == "0,1"
    for retry in retried.values():  # packed or alone: how stale both were at the first ask
        assert runs[retry.number][:2] == ("FINISHED", "completed"), runs[retry.number]
