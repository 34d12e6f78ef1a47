"""The tracker contract: the :class:`Tracker` protocol, run statuses, MLflow's limits, and the
param/tag/metric preparation both backends share, so that they accept and reject exactly the same
inputs (``tests/tracking/test_tracking.py`` runs one suite against both)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from harness.core.redact import redact_text

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

        Both backends subclass this protocol and share this body, so that they prepare tags
        and tag the parent the same way; they differ only in ``_resume_run``/``_create_run``.
        """
        prepared = _prepare_tags(tags)
        if run_id is not None:
            self._resume_run(run_id, prepared)
            return run_id
        if parent_run_id is not None:
            prepared[PARENT_RUN_TAG] = parent_run_id
        return self._create_run(experiment, run_name, parent_run_id, prepared)

    def _resume_run(self, run_id: str, tags: dict[str, str]) -> None:
        """Mark ``run_id`` running again and add ``tags`` (already prepared)."""
        ...

    def _create_run(
        self, experiment: str, run_name: str, parent_run_id: str | None, tags: dict[str, str]
    ) -> str:
        """Create a run with ``tags`` (prepared, the parent tag included); return its id."""
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


def _param_change_message(run_id: str, old: Mapping[str, str], changed: Mapping[str, str]) -> str:
    diffs = ", ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in sorted(changed.items()))
    return f"params of run {run_id} cannot change once logged ({diffs})"
