"""The in-memory :class:`~harness.tracking.base.Tracker`, for fast tests of the training loop."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.redact import redact_text
from harness.tracking.base import (
    RUN_NAME_TAG,
    RunRecord,
    RunStatus,
    Tracker,
    _check_metric,
    _check_status,
    _param_change_message,
    _prepare_params,
    _prepare_tags,
)


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


class MemoryTracker(Tracker):
    """A :class:`Tracker` that keeps runs in memory, for tests of the training loop.

    Inspect ``tracker.runs[run_id]`` (a :class:`MemoryRun`) after the code under test ran. Params
    are immutable exactly as in MLflow, so a bug that re-logs a changed config fails here too.
    Binary artifacts are stored decoded as UTF-8 with replacement characters.
    """

    def __init__(self) -> None:
        self.runs: dict[str, MemoryRun] = {}
        self.experiment_tags: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _resume_run(self, run_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            run = self._run(run_id)
            run.status = "RUNNING"
            run.resumed += 1
            run.tags.update(tags)

    def _create_run(
        self, experiment: str, run_name: str, parent_run_id: str | None, tags: dict[str, str]
    ) -> str:
        with self._lock:
            run_id = uuid.uuid4().hex
            run = MemoryRun(run_id, experiment, run_name, parent_run_id)
            run.tags[RUN_NAME_TAG] = run_name
            run.tags.update(tags)
            self.runs[run_id] = run
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
