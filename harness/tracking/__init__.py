"""Experiment tracking behind a small interface, so the training loop never touches MLflow.

The training loop and the sweep talk to a :class:`Tracker`. Two implementations share one
contract (``tests/test_tracking.py`` runs the same suite against both):

* :class:`MlflowTracker` writes to any MLflow tracking store through ``MlflowClient`` —
  ``sqlite:///results/mlflow.db`` (the default), ``postgresql://...`` or an ``http(s)://``
  tracking server. It never uses MLflow's fluent API (``mlflow.start_run``), whose global
  "active run" state breaks as soon as one process drives several runs or a worker attaches to
  a parent run created elsewhere.
* :class:`MemoryTracker` keeps everything in plain dicts, for fast tests of the training loop.

Contract, shared by both:

* Params are flattened (``{"ppo": {"c_clip": 3}}`` becomes ``ppo.c_clip = "3"``), stringified,
  cut to MLflow's 6,000 characters, and immutable: logging the same value again (a resumed run)
  is fine, a different value raises :class:`ValueError`.
* Param values, tag values and text artifacts go through :func:`harness.core.redact.redact_text`, so
  a storage URL with a password cannot leak into the tracking store.
* Metrics are buffered per run and written with one ``log_batch`` per flush (at most 1,000
  metrics per call), because one round trip per value dominates the cost of a short step.
  Measured on SQLite, 2 CPU cores, 40 metrics per step: one ``log_metric`` per value 105 ms per
  step; one ``log_batch`` per step 8.6 ms; one per 10 steps (the default) 2.9 ms per step. A
  process killed with SIGKILL loses at most the unflushed buffer (``flush_every_steps`` steps
  or ``flush_every_seconds`` seconds).
* Non-finite metric values are recorded, not skipped: NaN is stored as NaN; MLflow's SQL
  stores clamp ±inf to ±``sys.float_info.max`` (about ±1.8e308), the memory tracker keeps ±inf.
  A diverged run therefore shows where it diverged; detecting divergence is the caller's job.

Importing this module does not import MLflow; :class:`MlflowTracker` imports it when built.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

from harness.core.db import (
    database_connect_error,
    is_transient_db_error,
    sqlalchemy_url,
    with_retries,
)
from harness.core.redact import redact_text, redact_url

if TYPE_CHECKING:
    from mlflow.entities import Metric

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
END_STATUSES: tuple[str, ...] = ("FINISHED", "FAILED", "KILLED")

# MLflow 3.17 limits (mlflow/utils/validation.py).
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

PARENT_RUN_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"

_T = TypeVar("_T")


@dataclass
class RunRecord:
    """What a tracker knows about one run; returned by :meth:`Tracker.get_run`."""

    run_id: str
    experiment: str
    run_name: str
    status: str
    parent_run_id: str | None
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Tracker(Protocol):
    """Where runs, params, tags, step metrics and artifacts go.

    Implementations must be usable from several processes at once against one store (each
    process builds its own tracker), and a run started in one process may be resumed in
    another by passing its ``run_id``.
    """

    def start_run(
        self,
        *,
        experiment: str,
        run_name: str,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run (or, with ``run_id``, resume that run) and return its id.

        The experiment is created if missing. ``parent_run_id`` nests the run under a parent
        created by another process (MLflow's ``mlflow.parentRunId`` tag).
        """
        ...

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Log flattened, stringified params; raise ValueError if a logged value changes."""
        ...

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        """Buffer one step of metrics; written at the next flush."""
        ...

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) tags; values are stringified and redacted."""
        ...

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts, under ``artifact_path`` if given."""
        ...

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """Store ``text`` (redacted) as the artifact ``artifact_file``."""
        ...

    def end_run(self, run_id: str, status: RunStatus = "FINISHED") -> None:
        """Flush the run's metrics and mark it FINISHED, FAILED or KILLED."""
        ...

    def flush(self) -> None:
        """Write every buffered metric of every run now."""
        ...

    def find_run(
        self, experiment: str, tags: Mapping[str, str], *, status: str | None = None
    ) -> str | None:
        """Return the id of the newest active (not deleted) run of ``experiment`` carrying all
        ``tags``, and with ``status`` (e.g. ``"RUNNING"``) if given."""
        ...

    def get_metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """Return ``[(step, value), ...]`` for one metric, in step order (flushes first)."""
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """Return the run's status, params and tags (flushes first)."""
        ...

    def set_experiment_tags(self, experiment: str, tags: Mapping[str, Any]) -> None:
        """Set tags on the experiment (created if missing): its description, saved UI views."""
        ...


# --------------------------------------------------------------------------------------------
# Shared preparation: both backends must accept and reject exactly the same inputs.


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings and dataclasses into dotted keys (``ppo.c_clip``).

    Lists stay whole values: a grid axis such as ``seeds: [0, 1]`` is one param, not two.
    """
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def stringify(value: Any, limit: int) -> str:
    """MLflow's string form of a param or tag value, redacted and cut to ``limit`` characters."""
    if isinstance(value, enum.Enum):
        value = value.value
    text = redact_text(str(value))
    if len(text) > limit:
        suffix = f"...[{len(text) - limit} more chars]"
        text = text[: limit - len(suffix)] + suffix
    return text


def _prepare_params(params: Mapping[str, Any]) -> dict[str, str]:
    return {k: stringify(v, MAX_PARAM_VALUE_LENGTH) for k, v in flatten_params(params).items()}


def _prepare_tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {k: stringify(v, MAX_TAG_VALUE_LENGTH) for k, v in (tags or {}).items()}


def _check_status(status: str) -> None:
    if status not in END_STATUSES:
        raise ValueError(f"run status must be one of {', '.join(END_STATUSES)}; got {status!r}")


def _check_metric(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {key!r} must be a number; got {value!r}") from None


def _chunks(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# --------------------------------------------------------------------------------------------
# In-memory backend.


@dataclass
class MemoryRun:
    """One run as the :class:`MemoryTracker` stores it; every field is meant to be inspected."""

    run_id: str
    experiment: str
    run_name: str
    parent_run_id: str | None
    status: str = "RUNNING"
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    resumed: int = 0


class MemoryTracker:
    """A :class:`Tracker` that keeps runs in memory, for tests of the training loop.

    Inspect ``tracker.runs[run_id]`` (a :class:`MemoryRun`) after the code under test ran. Params
    are immutable exactly as in MLflow, so a bug that re-logs a changed config fails here too.
    Binary artifacts are stored decoded as UTF-8 with replacement characters.
    """

    def __init__(self) -> None:
        self.runs: dict[str, MemoryRun] = {}
        self.experiment_tags: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def start_run(
        self,
        *,
        experiment: str,
        run_name: str,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        prepared = _prepare_tags(tags)
        with self._lock:
            if run_id is not None:
                run = self._run(run_id)
                run.status = "RUNNING"
                run.resumed += 1
            else:
                run_id = uuid.uuid4().hex
                run = MemoryRun(run_id, experiment, run_name, parent_run_id)
                run.tags[RUN_NAME_TAG] = run_name
                if parent_run_id is not None:
                    run.tags[PARENT_RUN_TAG] = parent_run_id
                self.runs[run_id] = run
            run.tags.update(prepared)
            return run_id

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        prepared = _prepare_params(params)
        with self._lock:
            run = self._run(run_id)
            changed = {k: v for k, v in prepared.items() if run.params.get(k, v) != v}
            if changed:
                raise ValueError(_param_change_message(run_id, run.params, changed))
            run.params.update(prepared)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        values = {k: _check_metric(k, v) for k, v in metrics.items()}
        with self._lock:
            run = self._run(run_id)
            for key, value in values.items():
                run.metrics.setdefault(key, []).append((int(step), value))

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        prepared = _prepare_tags(tags)
        with self._lock:
            self._run(run_id).tags.update(prepared)

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        source = Path(path)
        name = f"{artifact_path.rstrip('/')}/{source.name}" if artifact_path else source.name
        text = source.read_bytes().decode("utf-8", errors="replace")
        with self._lock:
            self._run(run_id).artifacts[name] = text

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        with self._lock:
            self._run(run_id).artifacts[artifact_file] = redact_text(text)

    def end_run(self, run_id: str, status: RunStatus = "FINISHED") -> None:
        _check_status(status)
        with self._lock:
            self._run(run_id).status = status

    def flush(self) -> None:
        """Nothing is buffered in memory."""

    def find_run(
        self, experiment: str, tags: Mapping[str, str], *, status: str | None = None
    ) -> str | None:
        with self._lock:
            for run in reversed(list(self.runs.values())):
                if (
                    run.experiment == experiment
                    and status in (None, run.status)
                    and all(run.tags.get(k) == str(v) for k, v in tags.items())
                ):
                    return run.run_id
        return None

    def get_metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        with self._lock:
            return sorted(self._run(run_id).metrics.get(key, []), key=lambda sv: sv[0])

    def get_run(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._run(run_id)
            return RunRecord(
                run.run_id,
                run.experiment,
                run.run_name,
                run.status,
                run.parent_run_id,
                dict(run.params),
                dict(run.tags),
            )

    def set_experiment_tags(self, experiment: str, tags: Mapping[str, Any]) -> None:
        prepared = _prepare_tags(tags)
        with self._lock:
            self.experiment_tags.setdefault(experiment, {}).update(prepared)

    def get_experiment_tags(self, experiment: str) -> dict[str, str]:
        with self._lock:
            return dict(self.experiment_tags.get(experiment, {}))

    def _run(self, run_id: str) -> MemoryRun:
        try:
            return self.runs[run_id]
        except KeyError:
            raise KeyError(f"no run with id {run_id!r}") from None


def _param_change_message(run_id: str, old: Mapping[str, str], changed: Mapping[str, str]) -> str:
    diffs = ", ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in sorted(changed.items()))
    return f"params of run {run_id} cannot change once logged ({diffs})"


# --------------------------------------------------------------------------------------------
# MLflow backend.


def is_sqlite_locked_error(error: BaseException) -> bool:
    """True for SQLite's transient "database is locked" / "database table is locked" errors.

    MLflow wraps the driver error in an ``MlflowException`` whose message keeps the text, so
    the check is on the message of the error and of its causes.
    """
    seen: BaseException | None = error
    while seen is not None:
        message = str(seen).lower()
        if "database is locked" in message or "database table is locked" in message:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class MlflowTracker:
    """A :class:`Tracker` over ``mlflow.tracking.MlflowClient``; safe to use in many processes.

    Args:
        tracking_uri: ``sqlite:///PATH``, ``postgresql://...`` or ``http(s)://HOST:PORT``.
        artifact_location: Where experiments created by this tracker keep artifacts (a path or
            URI). Leave ``None`` for a tracking server, which decides itself; for SQL stores
            MLflow would otherwise use ``./mlruns`` relative to the working directory.
        flush_every_steps: Write buffered metrics of a run after this many ``log_metrics``
            calls (steps).
        flush_every_seconds: ... or when this long passed since the run's last write.
        retries: Attempts for a call that fails transiently: SQLite's "database is locked"
            (MLflow already sets ``PRAGMA busy_timeout = 20000``, so this is a second line of
            defence for very long writer queues) or a lost SQL connection (a restarted
            PostgreSQL server; MLflow's engine uses ``pool_pre_ping`` and reconnects once the
            server is back). Waits grow from 0.1 s to 5 s: the default rides out about 20 s.

    Notes:
        SQLite: the first process that opens a new database creates MLflow's tables (about
        1.5 s of Alembic migrations); concurrent first openers race on that migration
        (reported by MLflow users as "table already exists" or "database is locked"). This
        class serialises the first open with an ``flock`` on ``PATH.lock`` next to the database,
        so any number of worker processes may start at once. For PostgreSQL, open the store
        once in the coordinator before starting workers.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        artifact_location: str | Path | None = None,
        flush_every_steps: int = 10,
        flush_every_seconds: float = 5.0,
        retries: int = 10,
    ) -> None:
        from mlflow.tracking import MlflowClient

        if flush_every_steps < 1:
            raise ValueError(f"flush_every_steps must be >= 1; got {flush_every_steps}")
        self.tracking_uri = tracking_uri  # as given; the client may get a driver-pinned form
        if isinstance(artifact_location, Path):
            artifact_location = artifact_location.resolve().as_uri()
        self.artifact_location = artifact_location
        self.flush_every_steps = flush_every_steps
        self.flush_every_seconds = flush_every_seconds
        self.retries = retries
        self.batches_sent = 0  # log_batch calls made for metrics; for tests and benchmarks
        self.retried_calls = 0  # transient errors absorbed by retrying
        if tracking_uri.startswith("postgresql://"):
            tracking_uri = sqlalchemy_url(tracking_uri)
        self.client_uri = tracking_uri  # what MlflowClient (and `mlflow ui`) must be given
        self._lock = threading.RLock()
        self._buffers: dict[str, list[Metric]] = {}
        self._buffered_steps: dict[str, int] = {}
        self._last_write: dict[str, float] = {}
        self._experiment_ids: dict[str, str] = {}
        _quiet_disk_full_tracebacks()
        with _sqlite_init_lock(tracking_uri):
            # Building the client opens the store, which creates or migrates the schema.
            self._client = MlflowClient(tracking_uri=tracking_uri)
            self._call(self._client.search_experiments, max_results=1)

    def __repr__(self) -> str:
        return f"MlflowTracker({redact_url(self.tracking_uri)!r})"

    # -- runs ---------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        experiment: str,
        run_name: str,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        prepared = _prepare_tags(tags)
        if run_id is not None:
            self._call(self._client.update_run, run_id, status="RUNNING")
            if prepared:
                self.set_tags(run_id, prepared)
            return run_id
        if parent_run_id is not None:
            prepared[PARENT_RUN_TAG] = parent_run_id
        experiment_id = self._experiment_id(experiment)
        run = self._call(self._client.create_run, experiment_id, run_name=run_name, tags=prepared)
        return str(run.info.run_id)

    def end_run(self, run_id: str, status: RunStatus = "FINISHED") -> None:
        _check_status(status)
        self._flush_run(run_id)
        self._call(self._client.set_terminated, run_id, status=status)

    def find_run(
        self, experiment: str, tags: Mapping[str, str], *, status: str | None = None
    ) -> str | None:
        exp = self._call(self._client.get_experiment_by_name, experiment)
        if exp is None:
            return None
        wanted = _prepare_tags(tags)  # compared as stored (stringified, truncated)
        clauses = [_tag_clause(key, value) for key, value in wanted.items()]
        if status is not None:
            if status not in ("RUNNING", "SCHEDULED", *END_STATUSES):  # words: quoted as they are
                raise ValueError(f"run status: unknown {status!r}")
            clauses.append(f"attributes.status = '{status}'")
        exact = all(" LIKE " not in c for c in clauses)
        page_token = None
        while True:
            runs = self._call(
                self._client.search_runs,
                [exp.experiment_id],
                filter_string=" and ".join(clauses),
                max_results=1 if exact else 100,
                order_by=["attributes.start_time DESC"],
                page_token=page_token,
            )
            for run in runs:  # a LIKE clause may match more than the value: compare exactly
                if all(run.data.tags.get(k) == v for k, v in wanted.items()):
                    return str(run.info.run_id)
            page_token = getattr(runs, "token", None)
            if exact or not page_token:
                return None

    def get_run(self, run_id: str) -> RunRecord:
        self._flush_run(run_id)
        run = self._call(self._client.get_run, run_id)
        experiment = self._call(self._client.get_experiment, run.info.experiment_id)
        return RunRecord(
            run_id=run_id,
            experiment=experiment.name,
            run_name=run.info.run_name,
            status=run.info.status,
            parent_run_id=run.data.tags.get(PARENT_RUN_TAG),
            params=dict(run.data.params),
            tags=dict(run.data.tags),
        )

    # -- params, tags, artifacts --------------------------------------------------------------

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        items = [Param(k, v) for k, v in _prepare_params(params).items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            try:
                self._call(self._client.log_batch, run_id, params=chunk)
            except MlflowException as error:
                if "Changing param values is not allowed" not in str(error):
                    raise
                logged = self._call(self._client.get_run, run_id).data.params
                changed = {p.key: p.value for p in chunk if logged.get(p.key, p.value) != p.value}
                raise ValueError(_param_change_message(run_id, logged, changed)) from None

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in _prepare_tags(tags).items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self._call(self._client.log_batch, run_id, tags=chunk)

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self._call(self._client.log_artifact, run_id, str(path), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._call(self._client.log_text, run_id, redact_text(text), artifact_file)

    def set_experiment_tags(self, experiment: str, tags: Mapping[str, Any]) -> None:
        experiment_id = self._experiment_id(experiment)
        for key, value in _prepare_tags(tags).items():
            self._call(self._client.set_experiment_tag, experiment_id, key, value)

    def get_experiment_tags(self, experiment: str) -> dict[str, str]:
        """The experiment's tags (empty if it does not exist)."""
        exp = self._call(self._client.get_experiment_by_name, experiment)
        return dict(exp.tags) if exp is not None else {}

    # -- metrics ------------------------------------------------------------------------------

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        batch = [
            Metric(key, _check_metric(key, value), timestamp, int(step))
            for key, value in metrics.items()
        ]
        with self._lock:
            self._buffers.setdefault(run_id, []).extend(batch)
            self._buffered_steps[run_id] = self._buffered_steps.get(run_id, 0) + 1
            last = self._last_write.setdefault(run_id, time.monotonic())
            due = (
                self._buffered_steps[run_id] >= self.flush_every_steps
                or time.monotonic() - last >= self.flush_every_seconds
            )
        if due:
            self._flush_run(run_id)

    def flush(self) -> None:
        with self._lock:
            run_ids = [run_id for run_id, buffer in self._buffers.items() if buffer]
        for run_id in run_ids:
            self._flush_run(run_id)

    def get_metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        self._flush_run(run_id)
        history = self._call(self._client.get_metric_history, run_id, key)
        ordered = sorted(history, key=lambda m: (m.step, m.timestamp))
        return [(int(m.step), float(m.value)) for m in ordered]

    def _flush_run(self, run_id: str) -> None:
        # The lock is held across the write so two threads cannot reorder one run's steps.
        with self._lock:
            pending = self._buffers.pop(run_id, [])
            self._buffered_steps.pop(run_id, None)
            self._last_write[run_id] = time.monotonic()
            try:
                for chunk in _chunks(pending, MAX_METRICS_PER_BATCH):
                    self._call(self._client.log_batch, run_id, metrics=chunk)
                    self.batches_sent += 1
                    pending = pending[len(chunk) :]
            finally:
                if pending:  # keep what was not written, for the next flush
                    self._buffers[run_id] = pending + self._buffers.get(run_id, [])

    # -- plumbing -----------------------------------------------------------------------------

    def _experiment_id(self, name: str) -> str:
        """Get or create the experiment; two processes creating it at once both succeed."""
        from mlflow.exceptions import MlflowException

        if name in self._experiment_ids:
            return self._experiment_ids[name]
        exp = self._call(self._client.get_experiment_by_name, name)
        if exp is None:
            try:
                experiment_id = self._call(
                    self._client.create_experiment, name, artifact_location=self.artifact_location
                )
            except MlflowException as error:
                if getattr(error, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = self._call(self._client.get_experiment_by_name, name)
                if exp is None:
                    raise
                experiment_id = exp.experiment_id
        else:
            experiment_id = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                # A deleted experiment still owns its name; runs in it would be invisible.
                self._call(self._client.restore_experiment, experiment_id)
        self._experiment_ids[name] = str(experiment_id)
        return str(experiment_id)

    def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Call ``fn``, retrying transient errors with jittered exponential backoff."""

        def counted(error: BaseException) -> None:
            self.retried_calls += 1

        return with_retries(
            lambda: fn(*args, **kwargs),
            attempts=self.retries,
            base_delay=0.1,
            max_delay=5.0,
            retry_on=lambda error: _is_transient(error, self.client_uri),
            on_retry=counted,
        )


class _DropDiskFull(logging.Filter):
    """Drop MLflow's ERROR-with-traceback for a full disk: the error propagates to the harness,
    which stops the sweep with one line saying so (a traceback per write was hundreds of lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from harness.core.fsutil import is_disk_full

        error = record.exc_info[1] if record.exc_info else None
        return error is None or not is_disk_full(error)


def _quiet_disk_full_tracebacks() -> None:
    log = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _DropDiskFull) for f in log.filters):
        log.addFilter(_DropDiskFull())


def _is_transient(error: BaseException, uri: str) -> bool:
    if is_sqlite_locked_error(error):
        return True
    if not uri.startswith(("postgresql", "mysql")):
        return False
    return is_transient_db_error(error)


def _tag_clause(key: str, value: str) -> str:
    """One MLflow search clause matching tag ``key`` = ``value``.

    MLflow's filter grammar has no escape for a quote inside a quoted literal, so a value with
    both quote kinds (a variant named ``it's "x"``) cannot be written as ``= '...'``; it becomes
    a ``LIKE`` whose quotes and backslashes (an escape character in PostgreSQL's LIKE) are the
    one-character wildcard ``_``, and the caller keeps only runs whose tag equals the value."""
    if "'" not in value:
        return f"tags.`{key}` = '{value}'"
    if '"' not in value:
        return f'tags.`{key}` = "{value}"'
    pattern = value.replace("\\", "_").replace("'", "_").replace('"', "_")
    return f"tags.`{key}` LIKE '{pattern}'"


@contextmanager
def _sqlite_init_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``DB.lock`` while a SQLite store is first opened."""
    if not tracking_uri.startswith("sqlite:///") or os.name != "posix":
        yield
        return
    import fcntl

    db_path = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
    if str(db_path) in ("", ":memory:"):
        yield
        return
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db_path}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Factory.

SUPPORTED_SCHEMES = ("sqlite", "postgresql", "http", "https")


def default_tracking_uri(results_dir: Path) -> str:
    """``sqlite:///<results_dir>/mlflow.db`` with an absolute path (MLflow 3 has no file store)."""
    return f"sqlite:///{(results_dir / 'mlflow.db').resolve()}"


def make_tracker(
    uri: str | None, results_dir: Path, *, check: bool = True, **kwargs: Any
) -> Tracker:
    """Build the tracker for a ``--tracking-uri`` value.

    Args:
        uri: ``None`` for ``sqlite:///<results_dir>/mlflow.db``; ``"memory"`` for a
            :class:`MemoryTracker`; otherwise ``sqlite:///PATH``, ``postgresql://...``
            (``postgresql+DRIVER://`` too) or ``http(s)://HOST:PORT``.
        results_dir: Holds the default database and, for SQL stores, ``mlartifacts/``.
        check: Probe a PostgreSQL or HTTP store first (5 s timeout). Without the probe MLflow
            itself retries an unreachable store for about 100 s (SQL) or minutes (HTTP)
            before failing.
        **kwargs: Passed to :class:`MlflowTracker` (flush policy, retries).

    Raises:
        ValueError: For any other scheme, with a message listing the accepted forms, or for an
            unreachable store, with the password redacted.
    """
    if uri == "memory":
        return MemoryTracker()
    uri = uri or default_tracking_uri(results_dir)
    scheme = urlsplit(uri).scheme.split("+", 1)[0]
    if scheme not in SUPPORTED_SCHEMES or (scheme == "sqlite" and not uri.startswith("sqlite:///")):
        shown = scheme or redact_url(uri)
        raise ValueError(
            f"tracking_uri: scheme '{shown}' is not supported "
            "(use sqlite:///PATH, http(s)://HOST:PORT, postgresql://...)"
        )
    check_http_credentials(uri)
    if check and scheme != "sqlite":
        reason = _probe(uri, scheme)
        if reason is not None:
            raise ValueError(f"tracking_uri: cannot connect to {redact_url(uri)} ({reason})")
    if scheme in ("sqlite", "postgresql"):
        kwargs.setdefault("artifact_location", results_dir / "mlartifacts")
    return MlflowTracker(uri, **kwargs)


CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def check_http_credentials(uri: str) -> None:
    """Refuse ``http(s)://user:pass@host``: MLflow's REST client (urllib/requests) cannot log in
    with credentials in the URL, and a URL is printed, logged and seen in process lists.
    MLflow's own environment variables carry them instead.

    Raises:
        ValueError: naming the variables to use, with the password redacted.
    """
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and (parts.username or parts.password):
        raise ValueError(
            f"tracking_uri: {redact_url(uri)} has credentials in the URL, which MLflow cannot use; "
            f"give the URL without them and set {CREDENTIAL_ENV[0]} and {CREDENTIAL_ENV[1]} "
            "(or MLFLOW_TRACKING_TOKEN) in the environment"
        )


def _auth_headers() -> dict[str, str]:
    """The Authorization header MLflow's client sends, from the same environment variables."""
    import base64

    user, password = (os.environ.get(k) for k in CREDENTIAL_ENV)
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    return {}


def _probe(uri: str, scheme: str, timeout: float = 5.0) -> str | None:
    """Return why the store at ``uri`` cannot be reached or refuses us, or None if it answers."""
    if scheme == "postgresql":
        return database_connect_error(uri, timeout=timeout)
    import urllib.error
    import urllib.request

    base = uri.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout):
            pass
    except urllib.error.HTTPError as error:  # it answered, so it is reachable
        if error.code >= 500:
            return f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return redact_text(str(reason))
    # /health needs no login; an API call does, on a server with authentication.
    request = urllib.request.Request(
        f"{base}/api/2.0/mlflow/experiments/search?max_results=1", headers=_auth_headers()
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            given = "were refused" if _auth_headers() else "are required"
            return (
                f"HTTP {error.code}: credentials {given}; set {CREDENTIAL_ENV[0]} and "
                f"{CREDENTIAL_ENV[1]}"
            )
        return None  # an old or unusual server: MLflow's own client will say more
    except (urllib.error.URLError, OSError) as error:
        return redact_text(str(getattr(error, "reason", error)))


__all__ = [
    "END_STATUSES",
    "MemoryRun",
    "MemoryTracker",
    "MlflowTracker",
    "RunRecord",
    "RunStatus",
    "Tracker",
    "default_tracking_uri",
    "flatten_params",
    "is_sqlite_locked_error",
    "make_tracker",
]
