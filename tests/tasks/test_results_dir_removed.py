"""A results directory removed while a command runs (here by the run's own ``python:`` reward, as a
tester found it; ``rm -rf`` in another shell is the same) is one line saying so, exit 1: SQLite
refused every later write to its unlinked database and the journal's next open failed, each with
a traceback of its own (651 lines for one ``harness run``, a thousand for a two-trial ablate)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from harness.core.fsutil import StoreRemovedError, fatal_store_error, removed_reason
from tests.tasks.test_reward_lifecycle import SMALL, _harness

REMOVES = """
import shutil

RESULTS = {results!r}


def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(40)]


def score(prompt, completion, answer):
    shutil.rmtree(RESULTS, ignore_errors=True)
    return 1.0
"""


def _removes(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results"
    module = tmp_path / "removes.py"
    module.write_text(REMOVES.format(results=str(results)))
    return module, results


def _assert_said_once(err: str, results: Path) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
    gone = f"error: the directory {results} was removed during the run, and the "
    assert lines[-1].startswith(gone), lines[-3:]
    assert lines[-1].endswith(("MLflow store mlflow.db with it", "journal.log with it"))
    assert sum("was removed during the run" in ln for ln in lines) <= 2, lines  # and the table


def _run_to_end(args: list[str]) -> tuple[int, str]:
    """``harness ARGS`` run to its end (at most 600 s): its exit code and its stderr."""
    proc = _harness(args)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    return proc.returncode, err


# -- the commands ----------------------------------------------------------------------------


def test_harness_run_says_in_one_line_that_the_results_directory_was_removed(tmp_path):
    module, results = _removes(tmp_path)
    args = ["run", "--set", f"task=python:{module}:score", *SMALL, "--results-dir", str(results)]
    code, err = _run_to_end(args)
    assert code == 1, err[-3000:]
    _assert_said_once(err, results)
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 3, err  # progress, the line


@pytest.mark.slow  # 30+ s: a whole sweep or several processes
def test_harness_ablate_stops_with_one_line_when_the_results_directory_is_removed(tmp_path):
    module, results = _removes(tmp_path)
    exp = tmp_path / "exp.yaml"
    base = {"task": f"python:{module}:score", **_small_fields()}
    exp.write_text(json.dumps({"name": "rm", "base": base, "grid": {"ppo.eps_clip": [0.2]}}))
    code, err = _run_to_end(["ablate", str(exp), "--results-dir", str(results)])
    assert code == 1, err[-3000:]
    _assert_said_once(err, results)
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 8, err


def _small_fields() -> dict:
    """``SMALL``'s ``--set key=value`` pairs as a nested config mapping."""
    fields: dict = {}
    for item in SMALL[1::2]:
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = fields
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = int(value)
    return fields


# -- the stores: each says which store went, and how -----------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_mlflow_tracker_names_its_removed_database_and_mlflow_logs_no_traceback(tmp_path):
    from harness.tracking.mlflow_tracker import MlflowTracker

    results = tmp_path / "results"
    tracker = MlflowTracker(f"sqlite:///{results / 'mlflow.db'}", artifact_location=tmp_path / "a")
    rid = tracker.start_run(experiment="e", run_name="r")
    shutil.rmtree(results)
    # On MLflow's logger itself: the "mlflow" logger does not propagate to pytest's handler.
    seen = _Records()
    logger = logging.getLogger("mlflow.store.db.utils")
    logger.addHandler(seen)
    try:
        with pytest.raises(StoreRemovedError) as err:
            tracker.set_tags(rid, {"k": "v"})
        with pytest.raises(StoreRemovedError):
            tracker.end_run(rid, "FAILED")
    finally:
        logger.removeHandler(seen)
    assert str(err.value) == (
        f"the directory {results} was removed during the run, and the MLflow store mlflow.db "
        "with it"
    )
    assert not [r for r in seen.records if r.exc_info], [r.getMessage() for r in seen.records]


def test_the_journal_names_itself_when_it_was_removed(tmp_path):
    from harness.sweep.stores.journal import SafeJournalFileBackend

    results = tmp_path / "results"
    results.mkdir()
    path = results / "optuna-journal.log"
    path.touch()
    journal = SafeJournalFileBackend(str(path))
    journal.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}])
    path.unlink()  # the file alone: its directory stays
    why = f"the Optuna journal {path} was removed during the run"
    with pytest.raises(StoreRemovedError, match=f"^{why}$"):
        list(journal.read_logs(0))
    with pytest.raises(StoreRemovedError, match=f"^{why}$"):
        journal.append_logs([{"op_code": 0}])
    shutil.rmtree(results)  # and then the directory
    with pytest.raises(StoreRemovedError) as err:
        journal.append_logs([{"op_code": 0}])
    assert str(err.value) == (
        f"the directory {results} was removed during the run, and the Optuna journal "
        "optuna-journal.log with it"
    )


def test_a_removed_store_stops_a_sweep_as_a_full_disk_does(tmp_path):
    """The sweep's one test for what ends it: a removed store anywhere in the chain, as itself."""
    inner = StoreRemovedError(removed_reason(tmp_path / "gone" / "x.db", "the MLflow store"))
    try:
        try:
            raise inner
        except StoreRemovedError as e:
            raise RuntimeError("a trial's own wrapping") from e
    except RuntimeError as outer:
        fatal = fatal_store_error(outer)
    assert isinstance(fatal, StoreRemovedError) and str(fatal) == str(inner)
    assert fatal_store_error(FileNotFoundError(2, "No such file")) is None
