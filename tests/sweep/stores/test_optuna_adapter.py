"""Pins the Optuna private API that ``harness.sweep.stores.optuna_adapter`` relies on, and keeps it the
only module that touches it.  An Optuna upgrade that moves one of these fails here by name."""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import TrialState

from harness.sweep.stores import optuna_adapter as A
from harness.sweep.stores.storage import make_storage

ROOT = Path(__file__).resolve().parents[3]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_heartbeat_protocol_is_the_one_we_implement() -> None:
    abstract = set(getattr(BaseHeartbeat, "__abstractmethods__", set()))
    implemented = {
        "record_heartbeat",
        "_get_stale_trial_ids",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
    }
    assert abstract <= implemented, abstract - implemented
    assert not getattr(A.HeartbeatJournalStorage, "__abstractmethods__", set())
    params = list(inspect.signature(BaseHeartbeat._get_stale_trial_ids).parameters)
    assert params == ["self", "study_id"]


def test_private_study_and_trial_handles(tmp_path: Path) -> None:
    storage = make_storage(None, tmp_path, heartbeat_interval=1, grace_period=2)
    assert is_heartbeat_enabled(storage)
    study = optuna.create_study(study_name="pin", storage=storage)
    assert isinstance(A.storage_of(study), BaseStorage)
    assert isinstance(study._study_id, int)
    study.enqueue_trial({}, user_attrs={"cell": "a", "seed": 0})
    trial = A.claim_waiting_trial(study)
    assert trial is not None and A.claim_waiting_trial(study) is None
    frozen = A.frozen_trial(study, trial)
    assert A.trial_id(trial) == A.trial_id(frozen) == frozen._trial_id
    assert frozen.state == TrialState.RUNNING and frozen.user_attrs == {"cell": "a", "seed": 0}
    # The claim beat at once (a trial that never beats is never judged stale).
    beat = frozen.system_attrs[A.HEARTBEAT_ATTR]
    assert beat["trial_id"] == A.trial_id(trial) and beat["time"] > time.time() - 60
    assert len(study.get_trials()) == 1  # claiming never created a trial


def test_stale_trial_is_failed_and_retried_once(tmp_path: Path) -> None:
    storage = make_storage(None, tmp_path, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="stale", storage=storage)
    study.enqueue_trial({}, user_attrs={"cell": "a", "seed": 0})
    dead = A.claim_waiting_trial(study)
    assert dead is not None
    time.sleep(2.2)
    A.fail_stale_trials(study)
    A.fail_stale_trials(study)  # a second call finds nothing more to do
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    retry = study.get_trials()[1]
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == dead.number
    assert retry.user_attrs == {"cell": "a", "seed": 0}


def _beat_time(study: optuna.Study, trial: optuna.Trial) -> float | None:
    beat = A.frozen_trial(study, trial).system_attrs.get(A.HEARTBEAT_ATTR)
    return None if beat is None else float(beat["time"])


def _poll(value: Any, done: Any, what: str, bound: float = 120) -> Any:
    """``value()`` once ``done(value())`` holds, polled; a loaded machine may delay the beat
    thread by seconds, so the bound is a safety net, not the interval under test."""
    deadline = time.monotonic() + bound
    while not done(got := value()):
        assert time.monotonic() < deadline, f"no {what} within {bound} s"
        time.sleep(0.05)
    return got


def test_heartbeat_context_beats_while_the_block_runs(tmp_path: Path) -> None:
    storage = make_storage(None, tmp_path, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="beat", storage=storage)
    trial = study.ask()
    assert _beat_time(study, trial) is None  # ask() does not beat: every beat is the thread's
    with A.heartbeat(study, trial):
        first = _poll(lambda: _beat_time(study, trial), lambda t: t is not None, "first beat")
        later = _poll(lambda: _beat_time(study, trial), lambda t: t > first, "second beat")
        beat = A.frozen_trial(study, trial).system_attrs[A.HEARTBEAT_ATTR]
    assert later > first and beat["trial_id"] == A.trial_id(trial)
    # Leaving the block joins the thread: no beat lands after it (a sure wait, not a race).
    last = _beat_time(study, trial)
    time.sleep(1.5)
    assert _beat_time(study, trial) == last


PRIVATE = re.compile(r"\._storage\b|\._trial_id\b|\._study_id\b|optuna\.storages\._\w+")


def test_no_other_module_uses_optuna_private_api() -> None:
    hits = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sorted((ROOT / "harness").rglob("*.py"))
        if path.name != "optuna_adapter.py"
        for line in path.read_text().splitlines()
        if PRIVATE.search(line)
    ]
    assert not hits, hits
