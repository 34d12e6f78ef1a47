"""Tracker contract: one suite run against MemoryTracker and MlflowTracker (SQLite, PostgreSQL).

Plus MLflow-only checks: batching, race-free experiment creation, and 4 processes writing to
one SQLite store at once.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.redact import redact_text, redact_url, url_password
from harness.tracking import (
    MAX_PARAM_VALUE_LENGTH,
    MemoryTracker,
    Tracker,
    flatten_params,
    make_tracker,
)
from harness.tracking.mlflow_tracker import MlflowTracker

BACKENDS = ["memory", "sqlite", "postgresql"]
SECRET_URL = "postgresql://alice:s3cret-pw@db.example:5432/optuna"


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One database per module: creating MLflow's schema costs about 1.5 s.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def mlflow_pg_url(pg) -> str:
    # MLflow and Optuna both keep an `alembic_version` table: never share one database.
    return pg.create_database(f"mlflow_{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=BACKENDS)
def tracker(request: pytest.FixtureRequest, tmp_path: Path) -> Tracker:
    if request.param == "memory":
        return MemoryTracker()
    uri = request.getfixturevalue("sqlite_uri" if request.param == "sqlite" else "mlflow_pg_url")
    return MlflowTracker(uri, artifact_location=tmp_path / "artifacts", flush_every_steps=5)


@pytest.fixture
def experiment() -> str:
    return f"exp-{uuid.uuid4().hex[:8]}"


def read_artifact(tracker: Tracker, run_id: str, name: str, tmp_path: Path) -> str:
    if isinstance(tracker, MemoryTracker):
        return tracker.runs[run_id].artifacts[name]
    from mlflow.tracking import MlflowClient

    assert isinstance(tracker, MlflowTracker)
    local = MlflowClient(tracker.client_uri).download_artifacts(run_id, name, str(tmp_path))
    return Path(local).read_text()


@dataclass
class PPOKnobs:
    c_clip: float = 3.0
    eps_clip: float = 0.2


# -- contract ---------------------------------------------------------------------------------


def test_start_run_records_name_parent_and_tags(tracker: Tracker, experiment: str) -> None:
    parent = tracker.start_run(experiment=experiment, run_name="study")
    child = tracker.start_run(
        experiment=experiment,
        run_name="cell=a seed=0",
        parent_run_id=parent,
        tags={"ablation.cell": "a", "seed": 0},  # type: ignore[dict-item]
    )
    assert isinstance(child, str) and child != parent
    run = tracker.get_run(child)
    assert run.experiment == experiment
    assert run.run_name == "cell=a seed=0"
    assert run.status == "RUNNING"
    assert run.parent_run_id == parent
    assert run.tags["ablation.cell"] == "a" and run.tags["seed"] == "0"
    assert tracker.get_run(parent).parent_run_id is None


def test_experiment_tags_are_set_redacted_and_overwritten(
    tracker: Tracker, experiment: str
) -> None:
    tracker.set_experiment_tags(experiment, {"mlflow.note.content": "first", "k": SECRET_URL})
    tracker.set_experiment_tags(experiment, {"mlflow.note.content": "second"})
    tags = tracker.get_experiment_tags(experiment)  # type: ignore[attr-defined]
    assert tags["mlflow.note.content"] == "second"
    assert tags["k"] == redact_url(SECRET_URL) and "s3cret" not in tags["k"]


def test_params_are_flattened_stringified_truncated(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    many = {f"k{i}": i for i in range(150)}  # more than one 100-param batch
    tracker.log_params(
        run_id,
        {
            "ppo": {"clip": PPOKnobs(), "adv_norm": {"mean_level": "group"}},
            "seeds": [0, 1],
            "flag": True,
            "none": None,
            "long": "x" * 7000,
            "many": many,
        },
    )
    params = tracker.get_run(run_id).params
    assert params["ppo.clip.c_clip"] == "3.0"
    assert params["ppo.clip.eps_clip"] == "0.2"
    assert params["ppo.adv_norm.mean_level"] == "group"
    assert params["seeds"] == "[0, 1]"
    assert params["flag"] == "True" and params["none"] == "None"
    assert len(params["long"]) == MAX_PARAM_VALUE_LENGTH
    assert params["long"].endswith("more chars]")
    assert params["many.k149"] == "149"
    assert len(params) == 7 + 150


def test_params_relog_same_value_ok_changed_value_raises(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    tracker.log_params(run_id, {"lr": 1e-3, "steps": 10})
    tracker.log_params(run_id, {"lr": 1e-3, "steps": 10})  # what a resumed run does
    with pytest.raises(ValueError, match="cannot change.*lr"):
        tracker.log_params(run_id, {"lr": 2e-3})
    assert tracker.get_run(run_id).params["lr"] == "0.001"


def test_metric_history_in_step_order(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    for step in range(23):  # not a multiple of the flush interval: the tail is buffered
        tracker.log_metrics(run_id, {"reward": step / 10, "loss": -step, "kl": 0.01}, step=step)
    history = tracker.get_metric_history(run_id, "reward")
    assert history == [(s, s / 10) for s in range(23)]
    assert tracker.get_metric_history(run_id, "loss")[-1] == (22, -22.0)
    assert tracker.get_metric_history(run_id, "missing") == []


def test_more_than_1000_metrics_in_one_step(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    tracker.log_metrics(run_id, {f"layer/{i}": float(i) for i in range(1500)}, step=0)
    tracker.flush()
    assert tracker.get_metric_history(run_id, "layer/1499") == [(0, 1499.0)]
    assert tracker.get_metric_history(run_id, "layer/0") == [(0, 0.0)]


def test_non_finite_values_are_recorded(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    tracker.log_metrics(run_id, {"loss": 1.0}, step=0)
    tracker.log_metrics(run_id, {"loss": float("nan")}, step=1)
    tracker.log_metrics(run_id, {"loss": float("inf")}, step=2)
    tracker.log_metrics(run_id, {"loss": float("-inf")}, step=3)
    (_, v0), (_, v1), (_, v2), (_, v3) = tracker.get_metric_history(run_id, "loss")
    assert v0 == 1.0 and math.isnan(v1)
    # MLflow's SQL stores clamp ±inf to ±sys.float_info.max; memory keeps ±inf.
    assert v2 >= sys.float_info.max and v3 <= -sys.float_info.max
    with pytest.raises(ValueError, match="must be a number"):
        tracker.log_metrics(run_id, {"loss": "high"}, step=4)  # type: ignore[dict-item]


def test_end_statuses_and_resume(tracker: Tracker, experiment: str) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    tracker.log_params(run_id, {"lr": 0.1})
    tracker.log_metrics(run_id, {"reward": 1.0}, step=0)
    tracker.end_run(run_id, "FAILED")
    assert tracker.get_run(run_id).status == "FAILED"
    assert tracker.get_metric_history(run_id, "reward") == [(0, 1.0)]  # flushed on end

    resumed = tracker.start_run(
        experiment=experiment, run_name="r", run_id=run_id, tags={"resumed": "1"}
    )
    assert resumed == run_id
    assert tracker.get_run(run_id).status == "RUNNING"
    tracker.log_params(run_id, {"lr": 0.1})
    tracker.log_metrics(run_id, {"reward": 2.0}, step=1)
    tracker.end_run(run_id, "KILLED")
    run = tracker.get_run(run_id)
    assert run.status == "KILLED" and run.tags["resumed"] == "1"
    assert tracker.get_metric_history(run_id, "reward") == [(0, 1.0), (1, 2.0)]
    tracker.end_run(run_id)
    assert tracker.get_run(run_id).status == "FINISHED"
    with pytest.raises(ValueError, match="FINISHED, FAILED, KILLED"):
        tracker.end_run(run_id, "DONE")  # type: ignore[arg-type]


def test_find_run_by_tags(tracker: Tracker, experiment: str) -> None:
    tags = {"harness.study": "clip-ab12", "harness.kind": "parent"}
    assert tracker.find_run(experiment, tags) is None  # experiment does not exist yet
    first = tracker.start_run(experiment=experiment, run_name="p1", tags=tags)
    time.sleep(0.01)  # MLflow orders by start time in milliseconds
    second = tracker.start_run(experiment=experiment, run_name="p2", tags=tags)
    tracker.start_run(experiment=experiment, run_name="other", tags={"harness.study": "x y:z"})
    assert tracker.find_run(experiment, tags) == second != first
    assert tracker.find_run(experiment, {"harness.study": "x y:z"}) is not None
    assert tracker.find_run(experiment, {"harness.study": "nope"}) is None
    assert tracker.find_run(experiment, {"harness.study": "it's"}) is None


def test_artifacts(tracker: Tracker, experiment: str, tmp_path: Path) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    tracker.log_text(run_id, "name: clip\n", "config.yaml")
    source = tmp_path / "summary.json"
    source.write_text('{"reward": 1}')
    tracker.log_artifact(run_id, source, artifact_path="reports")
    assert read_artifact(tracker, run_id, "config.yaml", tmp_path / "a") == "name: clip\n"
    got = read_artifact(tracker, run_id, "reports/summary.json", tmp_path / "b")
    assert got == '{"reward": 1}'


def test_secrets_never_reach_the_store(tracker: Tracker, experiment: str, tmp_path: Path) -> None:
    run_id = tracker.start_run(experiment=experiment, run_name="r", tags={"storage": SECRET_URL})
    tracker.log_params(run_id, {"sweep": {"storage": SECRET_URL}})
    tracker.set_tags(run_id, {"note": f"resumed from {SECRET_URL}"})
    tracker.log_text(run_id, f"storage: {SECRET_URL}\n", "config.yaml")
    run = tracker.get_run(run_id)
    stored = [*run.params.values(), *run.tags.values()]
    stored.append(read_artifact(tracker, run_id, "config.yaml", tmp_path))
    assert not [value for value in stored if "s3cret-pw" in value]
    assert run.params["sweep.storage"] == "postgresql://alice:***@db.example:5432/optuna"


# -- MLflow specifics -------------------------------------------------------------------------


def test_metrics_are_written_in_batches(sqlite_uri: str, experiment: str) -> None:
    from mlflow.tracking import MlflowClient

    tracker = MlflowTracker(sqlite_uri, flush_every_steps=10, flush_every_seconds=3600)
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    for step in range(25):
        tracker.log_metrics(run_id, {f"m{i}": float(step) for i in range(40)}, step=step)
    assert tracker.batches_sent == 2  # steps 0-9 and 10-19; 20-24 still buffered
    seen_elsewhere = MlflowClient(sqlite_uri).get_metric_history(run_id, "m0")
    assert len(seen_elsewhere) == 20
    tracker.end_run(run_id)
    assert tracker.batches_sent == 3
    assert len(MlflowClient(sqlite_uri).get_metric_history(run_id, "m39")) == 25
    tracker.log_metrics(run_id, {f"x{i}": 1.0 for i in range(2500)}, step=0)
    tracker.flush()
    assert tracker.batches_sent == 6  # 2500 metrics: chunks of at most 1000


def test_experiment_creation_race_is_absorbed(
    sqlite_uri: str, experiment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rival = MlflowTracker(sqlite_uri)
    winner = rival._experiment_id(experiment)
    late = MlflowTracker(sqlite_uri)
    calls = []
    real_get = late._client.get_experiment_by_name

    def stale_first_lookup(name: str):  # the rival created it between our lookup and create
        calls.append(name)
        return None if len(calls) == 1 else real_get(name)

    monkeypatch.setattr(late._client, "get_experiment_by_name", stale_first_lookup)
    assert late._experiment_id(experiment) == winner
    assert len(calls) == 2


def _log_runs(uri: str, experiment: str, worker: int, barrier, runs: int, steps: int) -> None:
    """One worker process of the SQLite concurrency test: a log_batch every step (worst case)."""
    barrier.wait()  # all processes open the fresh database at the same moment
    tracker = MlflowTracker(uri, flush_every_steps=1)
    for r in range(runs):
        run_id = tracker.start_run(
            experiment=experiment,
            run_name=f"w{worker}-r{r}",
            tags={"worker": str(worker), "run": str(r)},
        )
        tracker.log_params(run_id, {"worker": worker, "run": r, "cfg": {"lr": 1e-4, "seed": r}})
        for step in range(steps):
            tracker.log_metrics(run_id, {f"m{i}": step + i / 100 for i in range(30)}, step=step)
        tracker.end_run(run_id)
    print(f"worker {worker}: retried_calls={tracker.retried_calls}", flush=True)


def _four_writers(tmp_path: Path, runs: int, steps: int) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = "concurrency"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_log_runs, args=(uri, experiment, w, barrier, runs, steps))
        for w in range(4)
    ]
    began = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    elapsed = time.perf_counter() - began
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]

    check = MlflowTracker(uri)
    for w in range(4):
        for r in range(runs):
            run_id = check.find_run(experiment, {"worker": str(w), "run": str(r)})
            assert run_id is not None
            assert check.get_run(run_id).status == "FINISHED"
            history = check.get_metric_history(run_id, "m29")
            assert [s for s, _ in history] == list(range(steps))
    print(f"4 processes x {runs} runs x {steps} steps x 30 metrics: {elapsed:.1f} s")


@pytest.mark.slow
def test_four_processes_share_one_sqlite_store(tmp_path: Path) -> None:
    """4 writers start at once on a fresh database; no lock or schema error."""
    _four_writers(tmp_path, runs=2, steps=50)


@pytest.mark.slow
def test_four_processes_share_one_sqlite_store_long(tmp_path: Path) -> None:
    _four_writers(tmp_path, runs=6, steps=100)


# -- factory and import hygiene ---------------------------------------------------------------


def test_make_tracker_defaults_and_memory(tmp_results: Path) -> None:
    assert isinstance(make_tracker("memory", tmp_results), MemoryTracker)
    default = make_tracker(None, tmp_results)
    assert isinstance(default, MlflowTracker)
    assert default.tracking_uri == f"sqlite:///{(tmp_results / 'mlflow.db').resolve()}"
    assert (tmp_results / "mlflow.db").exists()
    run_id = default.start_run(experiment="e", run_name="r")
    default.log_text(run_id, "x", "x.txt")
    assert (tmp_results / "mlartifacts").is_dir()  # not ./mlruns in the working directory


@pytest.mark.parametrize(
    ("uri", "scheme"),
    [
        ("file:./mlruns", "file"),
        ("s3://bucket/x", "s3"),
        ("mlruns", "mlruns"),
        ("sqlite://x", "sqlite"),
    ],
)
def test_make_tracker_rejects_other_schemes(uri: str, scheme: str, tmp_results: Path) -> None:
    message = (
        f"tracking_uri: scheme '{scheme}' is not supported "
        "(use sqlite:///PATH, http(s)://HOST:PORT, postgresql://...)"
    )
    with pytest.raises(ValueError) as error:
        make_tracker(uri, tmp_results)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("postgresql://alice:s3cret-pw@127.0.0.1:1/db", r"cannot connect to .*alice:\*\*\*@"),
        ("http://127.0.0.1:1", r"cannot connect to http://127.0.0.1:1 "),
        # urllib cannot log in with credentials in the URL: MLflow's variables carry them
        (
            "http://alice:s3cret-pw@127.0.0.1:1",
            r"http://alice:\*\*\*@.*set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
        ),
    ],
)
def test_make_tracker_unreachable_store_fails_fast_and_redacted(
    uri: str, expected: str, tmp_results: Path
) -> None:
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"^tracking_uri: " + expected) as error:
        make_tracker(uri, tmp_results)
    assert "s3cret-pw" not in str(error.value)
    assert time.perf_counter() - began < 6


def test_make_tracker_postgresql(mlflow_pg_url: str, tmp_results: Path) -> None:
    tracker = make_tracker(mlflow_pg_url, tmp_results)
    assert isinstance(tracker, MlflowTracker)
    assert "***" in repr(tracker) and mlflow_pg_url.split(":")[2].split("@")[0] not in repr(tracker)


def test_flatten_params_keeps_lists_whole() -> None:
    assert flatten_params({"a": {"b": [1, 2]}, "c": 1}) == {"a.b": [1, 2], "c": 1}


def test_importing_tracking_does_not_import_mlflow() -> None:
    code = (
        "import sys, harness.tracking, harness.core.redact, harness.sweep.stores.storage;"
        "print(sorted(m for m in ('mlflow', 'optuna', 'sqlalchemy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_mlflow_on_postgresql_rides_out_a_restart(pg, mlflow_pg_url: str, experiment: str) -> None:
    """The tracking server is down 2 s while a run logs every step."""
    tracker = MlflowTracker(mlflow_pg_url, flush_every_steps=1)
    run_id = tracker.start_run(experiment=experiment, run_name="r")
    outage = threading.Thread(target=pg.restart, kwargs={"down_seconds": 2.0})
    steps = 0
    outage.start()
    while outage.is_alive() or steps < 5:
        tracker.log_metrics(run_id, {"reward": float(steps)}, step=steps)
        steps += 1
        time.sleep(0.05)
    tracker.end_run(run_id)
    assert tracker.retried_calls > 0, "the outage was not hit"
    history = tracker.get_metric_history(run_id, "reward")
    assert history == [(s, float(s)) for s in range(steps)]
    assert tracker.get_run(run_id).status == "FINISHED"


# -- redaction --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:secret@host:5432/db", "postgresql://user:***@host:5432/db"),
        ("postgresql+psycopg2://u:p@ss/w@h/db?x=1", "postgresql+psycopg2://u:***@h/db?x=1"),
        ("http://user:pw@host", "http://user:***@host"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("postgresql://h/db?user=u&password=abc&x=1", "postgresql://h/db?user=u&password=***&x=1"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_hides_urls_pairs_and_literal_secrets() -> None:
    line = (
        "cannot connect to postgresql://u:s3cr%40t@h/db: password=hunter2 host=x; "
        "FATAL for s3cr@t (dsn='http://a:b@c/d')"
    )
    out = redact_text(line, ["s3cr@t"])
    assert "s3cr" not in out and "hunter2" not in out and ":b@" not in out
    assert "postgresql://u:***@h/db" in out and "http://a:***@c/d" in out
    assert redact_text("nothing to hide", []) == "nothing to hide"
    assert url_password("postgresql://u:p%40ss@h/db") == "p%40ss"
    assert url_password("postgresql://u@h/db") is None
