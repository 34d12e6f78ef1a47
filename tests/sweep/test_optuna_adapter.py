"""Pins the Optuna private API that ``harness.sweep.stores.optuna_adapter`` relies on, and keeps it the
only module that touches it.  An Optuna upgrade that moves one of these fails here by name."""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import TrialState

from harness.sweep.stores import optuna_adapter as A
from harness.sweep.stores.storage import make_storage

ROOT = Path(__file__).resolve().parents[2]
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


def test_heartbeat_context_beats_while_the_block_runs(tmp_path: Path) -> None:
    storage = make_storage(None, tmp_path, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="beat", storage=storage)
    trial = study.ask()
    with A.heartbeat(study, trial):
        first = A.frozen_trial(study, trial).system_attrs[A.HEARTBEAT_ATTR]["time"]
        time.sleep(1.6)
        later = A.frozen_trial(study, trial).system_attrs[A.HEARTBEAT_ATTR]["time"]
    assert later > first


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
