"""Storage contract: one suite over the journal file, SQLite and PostgreSQL storages.

Every test builds its storage through ``make_storage`` exactly as a worker would, and the
multi-process tests run real worker processes (spawned, so nothing is shared by ``fork``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc as sa_exc
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

from harness.core.db import (
    StorageUnavailable,
    is_transient_db_error,
    sqlalchemy_url,
    with_retries,
)
from harness.sweep.stores.optuna_adapter import (
    HEARTBEAT_ATTR,
    claim_waiting_trial,
    fail_stale_trials,
    heartbeat,
)
from harness.sweep.stores.storage import JOURNAL_FILE, make_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)

BACKENDS = ["journal", "sqlite", "postgresql"]
HEARTBEAT_S = 1
GRACE_S = 2
CELLS, SEEDS = 6, 4  # 24 (cell, seed) trials


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_results: Path) -> str | None:
    """The ``--storage`` value for one backend; results go to ``tmp_results``."""
    if request.param == "journal":
        return None
    if request.param == "sqlite":
        return f"sqlite:///{tmp_results / 'optuna.db'}"
    pg = request.getfixturevalue("pg")
    return pg.create_database(f"optuna_{uuid.uuid4().hex[:8]}")


def _storage(
    url: str | None, results: Path, outage_s: float | None = None, grace_s: int = GRACE_S
) -> optuna.storages.BaseStorage:
    return make_storage(
        url, results, heartbeat_interval=HEARTBEAT_S, grace_period=grace_s, outage_s=outage_s
    )


def _enqueue_grid(study: optuna.Study) -> set[tuple[int, int]]:
    for cell in range(CELLS):
        for seed in range(SEEDS):
            study.enqueue_trial(
                {"cell": cell, "seed": seed},
                user_attrs={"cell": cell, "seed": seed},
                skip_if_exists=True,
            )
    return {(c, s) for c in range(CELLS) for s in range(SEEDS)}


def _worker(
    url: str | None,
    results: str,
    study_name: str,
    out: str,
    barrier=None,
    hang_marker: str | None = None,
    trial_seconds: float = 0.0,
    outage_s: float | None = None,
    grace_s: int = GRACE_S,
) -> None:
    """A grid worker: take WAITING trials until none is WAITING or RUNNING, like `harness worker`.

    ``hang_marker``: after claiming the first trial, write this file and hang (to be SIGKILLed).
    ``outage_s``: the storage's retry budget through an outage (RDB storages retry every call
    themselves). When the database stays away longer, the worker stops as `harness worker`
    does: ``out`` says ``unavailable`` and its trial is left RUNNING for the heartbeat.
    ``grace_s``: seconds without a beat before a RUNNING trial is stale. Tests where no worker
    dies use a long one: on a loaded 2-core machine a beat can be seconds late, and a live
    trial judged stale gets a FAIL copy, which is correct but not what those tests count.
    """
    if barrier is not None:
        barrier.wait()
    storage = _storage(url, Path(results), outage_s, grace_s)
    study = optuna.load_study(study_name=study_name, storage=storage)
    done: list[int] = []
    try:
        while True:
            fail_stale_trials(study)
            trial = claim_waiting_trial(study)
            if trial is None:
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                if not running and not waiting:
                    break
                time.sleep(0.2)  # a RUNNING trial may belong to a dead worker: wait for it
                continue
            with heartbeat(study, trial):
                if hang_marker is not None:
                    partial = Path(hang_marker + ".partial")  # renamed: never read half-written
                    partial.write_text(str(trial.number))
                    partial.replace(hang_marker)
                    time.sleep(600)
                time.sleep(trial_seconds)
                value = 10.0 * trial.user_attrs["cell"] + trial.user_attrs["seed"]
            try:
                study.tell(trial, value)
            except (UpdateFinishedTrialError, ValueError) as err:  # as `harness worker` does:
                if "finished" not in str(err) and "Cannot tell" not in str(err):
                    raise
                continue  # judged stale (a late beat on a loaded machine); its copy counts
            done.append(trial.number)
    except StorageUnavailable:
        Path(out).write_text("unavailable")
        return
    Path(out).write_text(json.dumps(done))


def _check_each_cell_complete_once(study: optuna.Study, expected: set[tuple[int, int]]) -> None:
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    keys = [(t.user_attrs["cell"], t.user_attrs["seed"]) for t in complete]
    assert sorted(keys) == sorted(expected), "a (cell, seed) is missing or duplicated"
    for trial in complete:
        assert trial.value == 10.0 * trial.user_attrs["cell"] + trial.user_attrs["seed"]
    others = {t.state for t in study.trials} - {TrialState.COMPLETE, TrialState.FAIL}
    assert not others, f"trials left in states {others}"


# -- contract ---------------------------------------------------------------------------------


def test_heartbeat_is_enabled(storage_url: str | None, tmp_results: Path) -> None:
    storage = _storage(storage_url, tmp_results)
    assert is_heartbeat_enabled(storage)
    assert storage.get_heartbeat_interval() == HEARTBEAT_S
    if storage_url is None:
        assert (tmp_results / JOURNAL_FILE).exists()


def test_enqueue_is_idempotent_and_claims_never_create_trials(
    storage_url: str | None, tmp_results: Path
) -> None:
    study = optuna.create_study(study_name="s", storage=_storage(storage_url, tmp_results))
    expected = _enqueue_grid(study)
    _enqueue_grid(study)  # a resumed `harness ablate` enqueues again: nothing is added
    assert len(study.trials) == len(expected)
    claimed = []
    while (trial := claim_waiting_trial(study)) is not None:
        claimed.append(trial)
        study.tell(trial, 1.0)
    assert len(claimed) == len(expected) == len(study.trials)  # no stray sampler trial
    assert claim_waiting_trial(study) is None


def test_four_workers_complete_every_trial_exactly_once(
    storage_url: str | None, tmp_results: Path
) -> None:
    """4 processes pull 24 enqueued trials; none lost, none run twice."""
    study = optuna.create_study(study_name="grid", storage=_storage(storage_url, tmp_results))
    expected = _enqueue_grid(study)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    outs = [tmp_results / f"worker{i}.json" for i in range(4)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(storage_url, str(tmp_results), "grid", str(out), barrier),
            kwargs={"trial_seconds": 0.05, "grace_s": 120},
        )
        for out in outs
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    done = [number for out in outs for number in json.loads(out.read_text())]
    assert len(done) == len(set(done)) == len(expected)
    study = optuna.load_study(study_name="grid", storage=_storage(storage_url, tmp_results))
    assert len(study.trials) == len(expected)
    _check_each_cell_complete_once(study, expected)


def test_trial_of_a_killed_worker_is_failed_and_retried(
    storage_url: str | None, tmp_results: Path
) -> None:
    """SIGKILL mid-trial: the heartbeat goes stale, the trial is re-enqueued."""
    study = optuna.create_study(study_name="kill", storage=_storage(storage_url, tmp_results))
    study.enqueue_trial({"cell": 0, "seed": 0}, user_attrs={"cell": 0, "seed": 0})
    study.enqueue_trial({"cell": 1, "seed": 0}, user_attrs={"cell": 1, "seed": 0})
    marker = tmp_results / "claimed"
    ctx = mp.get_context("spawn")
    victim = ctx.Process(
        target=_worker,
        args=(storage_url, str(tmp_results), "kill", str(tmp_results / "victim.json")),
        kwargs={"hang_marker": str(marker)},
    )
    victim.start()
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the victim never claimed a trial"
    victim.kill()  # SIGKILL: no cleanup, the trial stays RUNNING
    victim.join()
    killed_number = int(marker.read_text())

    began = time.monotonic()
    _worker(storage_url, str(tmp_results), "kill", str(tmp_results / "rescuer.json"))
    recovered_in = time.monotonic() - began

    study = optuna.load_study(study_name="kill", storage=_storage(storage_url, tmp_results))
    killed = study.trials[killed_number]
    assert killed.state == TrialState.FAIL
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed_number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].system_attrs["retry_history"] == [killed_number]
    assert retries[0].user_attrs == killed.user_attrs
    _check_each_cell_complete_once(study, {(0, 0), (1, 0)})
    assert recovered_in < 60  # driven by the grace period, not by a timeout


def test_retry_is_not_judged_stale_by_its_copied_heartbeat(
    storage_url: str | None, tmp_results: Path
) -> None:
    """A retry copies the dead trial's system attrs, old beat included, yet is not stale."""
    storage = _storage(storage_url, tmp_results)
    study = optuna.create_study(study_name="copy", storage=storage)
    study.enqueue_trial({"cell": 0}, user_attrs={"cell": 0, "seed": 0})
    trial = claim_waiting_trial(study)
    assert trial is not None
    with heartbeat(study, trial):
        pass  # one beat, then the "worker" dies
    time.sleep(GRACE_S + 1.5)  # SQLite's CURRENT_TIMESTAMP has 1 s resolution
    fail_stale_trials(study)
    retry = claim_waiting_trial(study)
    # Judged right after the claim, before anything else reads the store: the claim's own beat
    # is seconds younger than the grace even on a loaded machine; the copied one is older.
    fail_stale_trials(study)
    assert retry is not None and retry.number != trial.number
    assert study.trials[trial.number].state == TrialState.FAIL
    assert study.trials[retry.number].state == TrialState.RUNNING


def test_storage_pickles(storage_url: str | None, tmp_results: Path) -> None:
    """Storages cross process boundaries by pickle (e.g. Optuna's n_jobs, joblib workers)."""
    storage = _storage(storage_url, tmp_results)
    optuna.create_study(study_name="p", storage=storage).enqueue_trial({"x": 1})
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.get_heartbeat_interval() == HEARTBEAT_S
    study = optuna.load_study(study_name="p", storage=clone)
    assert claim_waiting_trial(study) is not None


# -- journal specifics ------------------------------------------------------------------------


def test_journal_heartbeat_attr_names_its_trial(tmp_results: Path) -> None:
    study = optuna.create_study(storage=_storage(None, tmp_results))
    study.enqueue_trial({"x": 1})
    trial = claim_waiting_trial(study)
    assert trial is not None
    with heartbeat(study, trial):
        pass
    beat = study.trials[0].system_attrs[HEARTBEAT_ATTR]
    assert beat["trial_id"] == trial._trial_id and beat["time"] > time.time() - 60


# -- factory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["mysql://u:pw@h/db", "redis://h", "optuna.db", "sqlite://rel.db"])
def test_unknown_schemes_are_refused(url: str, tmp_results: Path) -> None:
    with pytest.raises(ValueError, match=r"storage: scheme '.*' is not supported .*journal"):
        make_storage(url, tmp_results)


def test_unwritable_results_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="storage: cannot write .*optuna-journal.log"):
        make_storage(None, blocker / "results")


def test_unreachable_postgresql_fails_fast_and_redacted(tmp_results: Path) -> None:
    began = time.perf_counter()
    with pytest.raises(ValueError) as error:
        make_storage("postgresql://alice:s3cret-pw@127.0.0.1:1/db", tmp_results)
    message = str(error.value)
    assert message.startswith("storage: cannot connect to postgresql://alice:***@127.0.0.1:1/db (")
    assert "refused" in message and "s3cret-pw" not in message
    assert time.perf_counter() - began < 6


def test_wrong_password_is_reported_without_it(pg, tmp_results: Path) -> None:
    url = pg.url.replace(pg.password, "wrong-pw")
    with pytest.raises(ValueError, match="password authentication failed") as error:
        make_storage(url, tmp_results)
    assert "wrong-pw" not in str(error.value) and pg.password not in str(error.value)


def test_bare_postgresql_urls_use_psycopg2() -> None:
    assert sqlalchemy_url("postgresql://u@h/db").startswith("postgresql+psycopg2://")
    assert sqlalchemy_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert sqlalchemy_url("sqlite:///x.db") == "sqlite:///x.db"


# -- outages ----------------------------------------------------------------------------------


def _operational_error() -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))


def test_transient_errors_are_recognised_through_optuna_wrapping() -> None:
    wrapped = StorageInternalError("commit failed")
    wrapped.__cause__ = _operational_error()
    assert is_transient_db_error(_operational_error())
    assert is_transient_db_error(wrapped)
    assert not is_transient_db_error(sa_exc.IntegrityError("INSERT", {}, Exception("dup")))
    assert not is_transient_db_error(ValueError("x"))


def test_with_retries_backs_off_then_succeeds_or_gives_up() -> None:
    sleeps: list[float] = []
    calls = iter([_operational_error(), _operational_error(), "ok"])

    def flaky() -> str:
        outcome = next(calls)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert with_retries(flaky, attempts=5, base_delay=1.0, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.5 and 1.0 <= sleeps[1] <= 3.0

    def down() -> None:
        raise _operational_error()

    with pytest.raises(sa_exc.OperationalError):
        with_retries(down, attempts=3, base_delay=0.0, sleep=sleeps.append)

    def bug() -> None:
        raise KeyError("not transient")

    sleeps.clear()
    with pytest.raises(KeyError):
        with_retries(bug, attempts=3, sleep=sleeps.append)
    assert sleeps == []


def _wait_while_working(worker: threading.Thread, done: Any, bound: float = 300) -> None:
    """Poll ``done()`` while ``worker`` runs; the bound only stops a hang (a loaded machine
    takes seconds per trial)."""
    deadline = time.monotonic() + bound
    while not done():
        assert worker.is_alive(), "the worker ended first"
        assert time.monotonic() < deadline, f"not done within {bound} s"
        time.sleep(0.05)


def test_postgresql_restart_mid_sweep_loses_nothing(
    pg, tmp_results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server restarts (down 2 s) while a worker runs; the sweep finishes as if it had not.

    What must hold after an outage: exactly one trial per (cell, seed) — no claim, tell or
    enqueue repeated by a retry — every one COMPLETE with its value, none RUNNING or WAITING,
    and the worker ends by itself.
    """
    url = pg.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    storage = make_storage(url, tmp_results, heartbeat_interval=1, grace_period=30)
    study = optuna.create_study(study_name="outage", storage=storage)
    expected = _enqueue_grid(study)
    out = tmp_results / "worker.json"
    worker = threading.Thread(
        target=_worker,
        args=(url, str(tmp_results), "outage", str(out)),
        kwargs={"trial_seconds": 0.2, "outage_s": 300},
    )
    worker.start()
    _wait_while_working(worker, lambda: len(study.get_trials(states=(TrialState.COMPLETE,))) >= 5)
    pg.restart(down_seconds=2.0)
    worker.join(timeout=300)
    assert not worker.is_alive()
    assert out.read_text() != "unavailable", "the worker gave up during a 2 s outage"
    study = optuna.load_study(study_name="outage", storage=make_storage(url, tmp_results))
    _check_each_cell_complete_once(study, expected)
    assert len(study.trials) == len(expected)
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    assert "database unavailable" in caplog.text, "the outage was not hit"


def test_outage_longer_than_the_retry_budget_stops_the_worker_cleanly(
    pg, tmp_results: Path
) -> None:
    """Down for longer than the worker's budget: the worker stops by itself (no hang, no
    heartbeat thread left), and its trial is recovered by the next worker exactly once."""
    url = pg.create_database(f"budget_{uuid.uuid4().hex[:8]}")
    storage = make_storage(url, tmp_results, heartbeat_interval=1, grace_period=3)
    study = optuna.create_study(study_name="budget", storage=storage)
    expected = _enqueue_grid(study)
    out = tmp_results / "worker.json"
    worker = threading.Thread(
        target=_worker,
        args=(url, str(tmp_results), "budget", str(out)),
        kwargs={"trial_seconds": 0.5, "outage_s": 2},
    )
    worker.start()
    _wait_while_working(worker, lambda: bool(study.get_trials(states=(TrialState.COMPLETE,))))
    pg.stop_server()
    try:
        worker.join(timeout=120)
        assert not worker.is_alive()
        assert out.read_text() == "unavailable"
        assert not [t for t in threading.enumerate() if t.name.startswith("heartbeat-")]
    finally:
        pg.start_server()
    rescuer = tmp_results / "rescuer.json"
    _worker(url, str(tmp_results), "budget", str(rescuer), outage_s=60)
    study = optuna.load_study(study_name="budget", storage=make_storage(url, tmp_results))
    _check_each_cell_complete_once(study, expected)
    states = [t.state for t in study.trials]
    # Only the trial that was RUNNING when the server went away may have a FAIL (stale) copy.
    assert states.count(TrialState.FAIL) <= 1
    assert len(study.trials) == len(expected) + states.count(TrialState.FAIL)
