"""Exactly once under lost replies: a write whose commit lands on the database server while its
reply is lost is retried by the storage, and the retry must not act a second time.

The fault is injected deterministically: the real write runs (and commits), then the call raises
the transient error a dropped connection raises. Each write a retry could repeat is covered: a
claim (WAITING -> RUNNING), a tell, a stale trial's FAIL (whose retry copy must still be made),
creating a trial and creating a study. SQLite and PostgreSQL run the same code.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc as sa_exc
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from harness.core.db import StorageUnavailable, with_retries
from harness.sweep.stores.optuna_adapter import (
    ResilientRDBStorage,
    claim_waiting_trial,
    fail_stale_trials,
)
from harness.sweep.stores.storage import make_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["sqlite", "postgresql"])
def rdb_url(request: pytest.FixtureRequest, tmp_results: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_results / 'optuna.db'}"
    return request.getfixturevalue("pg").create_database(f"idem_{uuid.uuid4().hex[:8]}")


def _lost_reply() -> sa_exc.OperationalError:
    return sa_exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))


@pytest.fixture
def lose_reply(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any, str], list[int]]]:
    """``lose_reply(owner, name)``: the next call of ``owner.name`` commits, then raises."""

    def install(owner: Any, name: str) -> list[int]:
        real = getattr(owner, name)
        calls: list[int] = []

        def once_lost(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            result = real(*args, **kwargs)
            if len(calls) == 1:
                raise _lost_reply()
            return result

        monkeypatch.setattr(owner, name, once_lost)
        return calls

    yield install


def _study(url: str, tmp_results: Path, n: int = 3, **kwargs: Any) -> optuna.Study:
    storage = make_storage(url, tmp_results, heartbeat_interval=1, **kwargs)
    study = optuna.create_study(study_name=f"s{uuid.uuid4().hex[:6]}", storage=storage)
    for cell in range(n):
        study.enqueue_trial({"cell": cell}, user_attrs={"cell": cell})
    return study


def test_a_claim_whose_reply_was_lost_is_not_made_twice(
    rdb_url: str, tmp_results: Path, lose_reply: Any
) -> None:
    study = _study(rdb_url, tmp_results)
    calls = lose_reply(ResilientRDBStorage, "_set_state_once")
    trial = claim_waiting_trial(study)
    assert trial is not None and len(calls) == 1  # the read-back found the landed claim
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.RUNNING, TrialState.WAITING, TrialState.WAITING]
    assert trial.number == 0
    # The claim wrote its first heartbeat in the same transaction: a worker that dies now
    # leaves a trial that goes stale (RDBStorage never judges a trial that never beat).
    storage = study._storage._backend
    assert storage._get_stale_trial_ids(study._study_id) == []
    storage.grace_period = 0
    time.sleep(1.1)  # heartbeat timestamps have 1 s resolution on SQLite
    assert storage._get_stale_trial_ids(study._study_id) == [trial._trial_id]


def test_a_tell_whose_reply_was_lost_is_not_refused(
    rdb_url: str, tmp_results: Path, lose_reply: Any
) -> None:
    study = _study(rdb_url, tmp_results)
    trial = claim_waiting_trial(study)
    assert trial is not None
    lose_reply(ResilientRDBStorage, "_set_state_once")
    study.tell(trial, 4.5)  # Optuna alone: "Cannot tell a COMPLETE trial" on the retry
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert [(t.number, t.value) for t in done] == [(0, 4.5)]


def test_a_stale_fail_whose_reply_was_lost_still_gets_its_retry_copy(
    rdb_url: str, tmp_results: Path, lose_reply: Any
) -> None:
    study = _study(rdb_url, tmp_results, n=1, grace_period=1)
    trial = claim_waiting_trial(study)
    assert trial is not None
    time.sleep(2.2)  # no beat for longer than the grace period: the trial is stale
    lose_reply(ResilientRDBStorage, "_set_state_once")
    fail_stale_trials(study)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].system_attrs["failed_trial"] == trial.number
    assert trials[1].user_attrs == {"cell": 0}


def test_a_trial_created_with_a_lost_reply_exists_once(
    rdb_url: str, tmp_results: Path, lose_reply: Any
) -> None:
    study = _study(rdb_url, tmp_results, n=0)
    calls = lose_reply(RDBStorage, "_create_new_trial")
    study.enqueue_trial({"cell": 7}, user_attrs={"cell": 7})
    assert len(calls) == 1
    assert [(t.state, t.user_attrs) for t in study.get_trials()] == [
        (TrialState.WAITING, {"cell": 7})
    ]
    assert study.ask().number == 0  # takes the enqueued trial
    lose_reply(RDBStorage, "_create_new_trial")
    asked = study.ask()  # a fresh RUNNING trial, as a search worker makes
    assert asked.number == 1
    assert [(t.number, t.state) for t in study.get_trials()] == [
        (0, TrialState.RUNNING),
        (1, TrialState.RUNNING),
    ]


def test_a_study_created_with_a_lost_reply_is_created(
    rdb_url: str, tmp_results: Path, lose_reply: Any
) -> None:
    storage = make_storage(rdb_url, tmp_results, heartbeat_interval=1)
    lose_reply(RDBStorage, "create_new_study")
    study = optuna.create_study(study_name="once", storage=storage)
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["once"]
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):  # a real duplicate still is one
        optuna.create_study(study_name="once", storage=storage)
    assert study.study_name == "once"


def test_the_retry_budget_is_time_and_ends_in_storage_unavailable() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    def down() -> None:
        raise _lost_reply()

    with pytest.raises(StorageUnavailable, match="retry budget"):
        with_retries(down, attempts=3, base_delay=0.25, max_delay=5, budget_s=30, sleep=sleep,
                     clock=lambda: now[0])  # fmt: skip
    assert now[0] == pytest.approx(30.0)  # the last try is made as the budget ends
    # waits of at most 7.5 s (5 s + 50 % jitter) fill 30 s in 4 or more: more than `attempts`
    assert max(sleeps) <= 7.5 and len(sleeps) >= 4
    # An outer retry loop does not start the budget again.
    outer: list[float] = []
    with pytest.raises(StorageUnavailable):
        with_retries(
            lambda: with_retries(down, budget_s=0.01, sleep=lambda s: None),
            sleep=outer.append,
        )
    assert outer == []
