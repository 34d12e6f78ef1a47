"""The MLflow :class:`~harness.tracking.base.Tracker`, over ``MlflowClient`` (never MLflow's
fluent API, whose global "active run" breaks as soon as one process drives several runs).
This module imports MLflow; ``harness.tracking.make_tracker`` imports this module only when an
MLflow tracker is built, so importing ``harness.tracking`` stays free of MLflow."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from harness.core.db import is_transient_db_error, sqlalchemy_url, with_retries
from harness.core.fsutil import (
    StoreRemovedError,
    file_identity,
    removed_reason,
)
from harness.core.redact import redact_text, redact_url
from harness.tracking.base import (
    END_STATUSES,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    PARENT_RUN_TAG,
    RunRecord,
    RunStatus,
    Tracker,
    _check_metric,
    _check_status,
    _chunks,
    _param_change_message,
    _prepare_params,
    _prepare_tags,
)
from harness.tracking.mlflow_sqlite import (
    OPEN_DATABASES,
    is_sqlite_locked_error,
    quiet_disk_full_tracebacks,
    replaced,
    sqlite_init_lock,
    sqlite_path,
)

_T = TypeVar("_T")


class MlflowTracker(Tracker):
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
        quiet_disk_full_tracebacks()
        self._db = sqlite_path(tracking_uri)
        self._db_identity: tuple[int, int] | None = None
        with sqlite_init_lock(tracking_uri):
            # Building the client opens the store, which creates or migrates the schema.
            self._client = MlflowClient(tracking_uri=tracking_uri)
            self._call(self._client.search_experiments, max_results=1)
        if self._db is not None:
            self._db_identity = file_identity(self._db)
            OPEN_DATABASES[self._db] = self._db_identity

    def __repr__(self) -> str:
        return f"MlflowTracker({redact_url(self.tracking_uri)!r})"

    # -- runs ---------------------------------------------------------------------------------

    def _resume_run(self, run_id: str, tags: dict[str, str]) -> None:
        self._call(self._client.update_run, run_id, status="RUNNING")
        if tags:
            self.set_tags(run_id, tags)

    def _create_run(
        self, experiment: str, run_name: str, parent_run_id: str | None, tags: dict[str, str]
    ) -> str:
        experiment_id = self._experiment_id(experiment)
        run = self._call(self._client.create_run, experiment_id, run_name=run_name, tags=tags)
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

        try:
            return with_retries(
                lambda: fn(*args, **kwargs),
                attempts=self.retries,
                base_delay=0.1,
                max_delay=5.0,
                retry_on=lambda error: _is_transient(error, self.client_uri),
                on_retry=counted,
            )
        except Exception as error:
            # SQLite keeps writing to the file it opened; once that file is unlinked every write
            # is "attempt to write a readonly database": say what happened instead.
            if self._db is not None and replaced(self._db, self._db_identity):
                raise StoreRemovedError(removed_reason(self._db, "the MLflow store")) from error
            raise


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
