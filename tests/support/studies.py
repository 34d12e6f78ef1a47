"""A study opened in the test's own process, as ``harness ablate`` opens it before it starts
its workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def open_test_study(
    exp: Path,
    results: Path,
    tracker: Any = None,
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    enqueue: bool = True,
    **options: Any,
) -> tuple[Any, Any]:
    """(study, StudySpec) of experiment file ``exp`` in ``storage`` under ``results`` (by default
    its journal), its parent run in ``tracker`` (by default the MLflow store under
    ``results``), every (cell, seed) enqueued unless ``enqueue`` is False; ``options`` go to
    ``open_study`` (``max_retries``)."""
    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.study import enqueue_missing, open_study
    from harness.sweep.stores.storage import make_storage
    from harness.tracking import make_tracker

    study, spec = open_study(
        load_experiment(exp),
        storage=make_storage(storage, results),
        tracker=tracker if tracker is not None else make_tracker(None, results),
        study_name=None,
        tracking_uri=tracking_uri,
        command="test",
        **options,
    )
    if enqueue:
        enqueue_missing(study, spec)
    return study, spec
