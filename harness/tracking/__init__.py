"""Experiment tracking behind a small interface, so the training loop never touches MLflow.

The training loop and the sweep talk to a :class:`Tracker`. Two implementations share one
contract (``tests/tracking/test_tracking.py`` runs the same suite against both):

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

Importing this module does not import MLflow: :func:`make_tracker` imports
:mod:`harness.tracking.mlflow_tracker` (which imports MLflow) when it builds one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.core.configtools import ConfigError
from harness.core.fsutil import ensure_results_dir
from harness.core.redact import redact_url
from harness.tracking.base import (
    END_STATUSES,
    MAX_PARAM_VALUE_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    RunRecord,
    RunStatus,
    Tracker,
    flatten_params,
    stringify,
)
from harness.tracking.memory import MemoryRun, MemoryTracker
from harness.tracking.probe import (
    check_http_credentials,
    check_sqlite_path,
    check_tracking_scheme,
    probe_store,
    probe_tracking_uri,
)

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
        reason = probe_store(uri, scheme)
        if reason is not None:
            raise ValueError(f"tracking_uri: cannot connect to {redact_url(uri)} ({reason})")
    if scheme in ("sqlite", "postgresql"):
        kwargs.setdefault("artifact_location", results_dir / "mlartifacts")
    from harness.tracking.mlflow_tracker import MlflowTracker  # noqa: PLC0415 - factory: loads MLflow when an MLflow tracker is built

    return MlflowTracker(uri, **kwargs)


def open_tracker(uri: str | None, results_dir: Path) -> Tracker:
    """The tracker of a command whose ``--tracking-uri`` was checked and probed already: the
    results dir is created, and a store that cannot be opened is a one-line ConfigError."""
    ensure_results_dir(results_dir)
    try:
        return make_tracker(uri, results_dir, check=False)  # probed by probe_tracking_uri
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


__all__ = [
    "END_STATUSES",
    "MemoryRun",
    "MemoryTracker",
    "RunRecord",
    "RunStatus",
    "Tracker",
    "MAX_PARAM_VALUE_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "default_tracking_uri",
    "flatten_params",
    "check_http_credentials",
    "check_sqlite_path",
    "check_tracking_scheme",
    "make_tracker",
    "open_tracker",
    "probe_store",
    "probe_tracking_uri",
    "stringify",
]
