"""An adaptive study stopped between a decision and its cancellations (a hook, not timing)
resumes with no (cell, seed) run twice and none lost; two processes taking the same look at
once cancel each held seed once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.sweep.scheduler.adaptive import apply_allocation
from harness.sweep.stores.storage import make_storage
from tests.support.adaptive_study import (
    BASELINE,
    BETTER,
    EQUIVALENT,
    SLIGHT,
    drain,
    open_adaptive,
    run_one,
    terminal_keys,
    write_experiment,
)

HERE = Path(__file__).resolve().parents[2]  # tests/
CANCELLED = sorted((c, s) for c in (BETTER, EQUIVALENT) for s in range(3, 7))
RAN = {BASELINE: 7, BETTER: 3, EQUIVALENT: 3, SLIGHT: 7}


class Killed(Exception):
    """Stands for the process dying at the hook."""


def _to_first_look(study: Any, spec: Any) -> None:
    """Run the 12 first seeds (min of every cell) with the look not taken yet."""
    from harness.sweep.scheduler.study import trial_key
    from harness.sweep.stores.optuna_adapter import claim_waiting_trial
    from tests.support.adaptive_study import score

    for _ in range(12):
        t = claim_waiting_trial(study, accept=lambda f: trial_key(f)[1] < 3)  # type: ignore[index]
        assert t is not None
        cell, seed = trial_key(study._storage.get_trial(t._trial_id))  # type: ignore[misc]
        study.tell(t, score(cell, seed))


def _reopen(results: Path, name: str = "adaptive") -> Any:
    """The study as a fresh process sees it (a new storage object on the same journal)."""
    import optuna

    return optuna.load_study(study_name=name, storage=make_storage(None, results))


def _assert_exact(study: Any) -> None:
    keys = terminal_keys(study)
    assert len(keys) == 28
    dup = {k: v for k, v in keys.items() if len(v) != 1}
    assert not dup, dup  # no (cell, seed) has a second trial
    assert sorted(k for k, v in keys.items() if v == ["PRUNED"]) == CANCELLED
    done = {k for k, v in keys.items() if v == ["COMPLETE"]}
    assert done == {(c, s) for c, n in RAN.items() for s in range(n)}  # none lost


def _kill_at(hook_at: int) -> Any:
    calls = {"n": 0}

    def hook(states: Any) -> None:
        calls["n"] += 1
        if calls["n"] == hook_at:
            raise Killed

    return hook


def test_killed_between_the_decision_and_the_cancels_resumes_exactly(tmp_path: Path) -> None:
    from harness.sweep.scheduler.study import enqueue_missing

    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    _to_first_look(study, spec)
    with pytest.raises(Killed):
        apply_allocation(study, spec, before_cancel=_kill_at(1))
    # Decided at the look, nothing cancelled yet: the held seeds are still WAITING.
    assert all(v == ["WAITING"] for k, v in terminal_keys(study).items() if k[1] >= 3)
    resumed = _reopen(results)
    assert enqueue_missing(resumed, spec) == (0, 12)  # the driver's resume: nothing to add
    drain(resumed, spec)
    _assert_exact(resumed)


def test_killed_midway_through_the_cancels_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dies after some held seeds are cancelled and after one's outcome is written but not its
    state: that seed is neither run nor lost."""
    from optuna.trial import TrialState

    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    _to_first_look(study, spec)
    storage = study._storage
    real = storage.set_trial_state_values
    seen = {"pruned": 0}

    def dying(trial_id: int, state: Any, values: Any = None) -> bool:
        if state == TrialState.PRUNED:
            seen["pruned"] += 1
            if seen["pruned"] == 4:
                raise Killed
        return bool(real(trial_id, state=state, values=values))

    monkeypatch.setattr(storage, "set_trial_state_values", dying)
    with pytest.raises(Killed):
        apply_allocation(study, spec)
    monkeypatch.undo()
    keys = terminal_keys(study)
    assert sum(v == ["PRUNED"] for v in keys.values()) == 3
    resumed = _reopen(results)
    drain(resumed, spec)
    _assert_exact(resumed)


def test_two_processes_taking_the_same_look_cancel_each_seed_once(tmp_path: Path) -> None:
    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    _to_first_look(study, spec)
    other = _reopen(results)
    # A computes the look; before it cancels, B takes the same look and cancels everything.
    apply_allocation(study, spec, before_cancel=lambda s: apply_allocation(other, spec))
    assert sorted(k for k, v in terminal_keys(study).items() if v == ["PRUNED"]) == CANCELLED
    # Both go on claiming: what each takes, the other does not.
    ran: list[Any] = []
    while True:
        a, b = run_one(study, spec), run_one(other, spec)
        ran += [k for k in (a, b) if k is not None]
        if a is None and b is None:
            break
    assert len(ran) == len(set(ran)) == 20 - 12
    _assert_exact(study)


CHILD = """
import os, signal, sys
sys.path.insert(0, {here!r})
import optuna
from pathlib import Path
from harness.sweep.scheduler.adaptive import apply_allocation
from harness.sweep.scheduler.spec import load_study_spec
from harness.sweep.stores.storage import make_storage
study = optuna.load_study(study_name="adaptive", storage=make_storage(None, Path({results!r})))
spec = load_study_spec(study)
def die(states):
    assert states[{better!r}].status == "better"
    os.kill(os.getpid(), signal.SIGKILL)  # the coordinator dies right after deciding
apply_allocation(study, spec, before_cancel=die)
"""


def test_a_sigkilled_coordinator_resumes_mid_allocation(tmp_path: Path) -> None:
    results = tmp_path / "results"
    study, spec = open_adaptive(write_experiment(tmp_path), results)
    _to_first_look(study, spec)
    code = CHILD.format(here=str(HERE), results=str(results), better=BETTER)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    resumed = _reopen(results)
    drain(resumed, spec)
    _assert_exact(resumed)
