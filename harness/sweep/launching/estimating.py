"""The dry run's measurement of what a sweep spends outside its runs' training, on the sweep's
own code paths, in a scratch directory that is removed afterwards (the dry run writes nothing).

In order, each timed on its own so that none slows another:

1. the Optuna storage and the tracker opened, the study created with its parent run
   (``open_stores``, ``open_study``): ``stores_s``;
2. the sweep's workers (up to one per core), spawned at once by the local launcher on an empty
   twin study: each imports the training stack, opens the stores, finds nothing to do and
   exits, as a sweep's workers do at their start and end: ``worker_s``, until the last one
   exits (scaled by workers / cores past the cores, where the starts share a core);
3. one probe run per run shape, each a trial of the scratch study recorded as the worker records
   one (enqueue, claim, labels, heartbeat, the run tracked in MLflow, attributes, tell): the
   probe's own parts (``harness.sweep.scheduler.estimate.timed_probe``) and ``trial_s``, the
   bookkeeping around it;
4. ``finish_study`` over those trials, its console output held back: the ranking, the report
   and the parent run's close: ``report_s`` (a report over more runs reads more of them).

``command_s``, the command's own start, is the caller's: the dry-run process's age when the
estimate begins, with this module's import (the sweep's machinery, which the sweep's command
loads at that point too): the same interpreter start, imports and file checks as the sweep's.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.experiment import ExperimentSpec
from harness.config.schema import RunConfig
from harness.core.db import with_retries
from harness.core.provenance import machine_text
from harness.sweep.launching.launchers.base import Resources
from harness.sweep.launching.launchers.local import LocalLauncher
from harness.sweep.launching.worker import WorkerOptions
from harness.sweep.present.finish import finish_study
from harness.sweep.scheduler.estimate import (
    RunCosts,
    SweepCosts,
    WallTimeEstimate,
    estimate_wall_time,
    timed_probe,
)
from harness.sweep.scheduler.labels import label_trial, summary_attrs
from harness.sweep.scheduler.spec import StudySpec, trial_key
from harness.sweep.scheduler.study import open_study
from harness.sweep.scheduler.trials import child_run_tags, end_orphaned_runs, ended_attempts
from harness.sweep.stores.opening import open_stores
from harness.sweep.stores.optuna_adapter import claim_waiting_trial, frozen_trial, heartbeat
from harness.tracking import Tracker

if TYPE_CHECKING:
    import optuna

COMMAND = "harness ablate --dry-run"

# The most a scratch worker may take to start and exit: past it the dry run says so instead.
WORKER_TIMEOUT_S = 600.0

# Seconds the scratch workers took to start and exit, by how many were started at once: measured
# once per process.  A dry run is one process, so this changes nothing there; a process that
# estimates many sweeps (a notebook, the test suite) pays the spawn once per worker count rather
# than once per estimate, and each estimate still gets this machine's own measured start.
_WORKER_START_S: dict[int, float] = {}


def measured_wall_time(
    spec: ExperimentSpec,
    workers: int,
    command_s: float = 0.0,
    packs: list[list[str]] | None = None,
) -> WallTimeEstimate:
    """The estimate of ``spec`` run by ``workers`` local workers, every part measured here;
    ``command_s``: the command's own start, as its caller saw it; ``packs``: the cells a worker
    trains together, handed on to ``estimate_wall_time``."""
    grouping: dict[str, Any] = {"packs": packs} if packs is not None else {}
    with ScratchSweep(spec) as scratch:
        scratch.open_and_start(workers)
        return estimate_wall_time(
            spec,
            workers,
            probe=scratch.probe,
            sweep=lambda: scratch.finish(command_s),
            **grouping,
        )


class ScratchSweep:
    """A sweep's stores and study in a temporary directory (see the module docstring)."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self._dir = tempfile.TemporaryDirectory(prefix="harness-estimate-")
        self.root = Path(self._dir.name)
        self.study: optuna.Study | None = None
        self.study_spec: StudySpec | None = None
        self.tracker: Tracker | None = None
        self.store: Any = None
        self._launcher: LocalLauncher | None = None
        self._once = SweepCosts()

    def __enter__(self) -> ScratchSweep:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._launcher is not None:
            self._launcher.terminate()
            self._launcher.close()
        if self.tracker is not None:
            with contextlib.suppress(Exception):
                self.tracker.flush()
        self._dir.cleanup()

    def open_and_start(self, workers: int) -> None:
        """Open the stores and the study (timed), then time the workers' start and exit."""
        t0 = time.perf_counter()
        # What the command loads once the file is valid (harness.cli.commands.sweep).
        from harness.sweep.launching.driver import sweep  # noqa: F401, PLC0415 - timed: the command's own import

        self.store, self.tracker = open_stores(None, None, self.root)
        self.study, self.study_spec = self._open("probe")
        stores_s = time.perf_counter() - t0
        self._once = SweepCosts(stores_s=stores_s, worker_s=self._time_workers(workers))

    def _open(self, name: str) -> tuple[optuna.Study, StudySpec]:
        assert self.tracker is not None
        return open_study(  # type: ignore[no-any-return]
            self.spec,
            storage=self.store,
            tracker=self.tracker,
            study_name=name,
            tracking_uri=None,
            command=COMMAND,
        )

    def _time_workers(self, workers: int) -> float:
        """Seconds from spawning the sweep's workers (up to one per core) on an empty study to
        their exit, scaled by ``workers / cores`` past the cores (the starts then share a core).
        All of them at once, as the sweep starts them: on a loaded machine they compete with
        each other too, and the sweep's runs wait for the workers to be up."""
        cores = os.cpu_count() or 1
        started = max(1, min(workers, cores))
        if started not in _WORKER_START_S:
            _WORKER_START_S[started] = self._start_and_exit(started)
        return _WORKER_START_S[started] * max(1.0, workers / cores)

    def _start_and_exit(self, started: int) -> float:
        """Seconds for ``started`` workers, spawned at once on an empty twin study, to exit."""
        empty, _ = self._open("worker-start")
        self._launcher = launcher = LocalLauncher()
        opts = WorkerOptions(study=empty.study_name, storage=None, results_dir=self.root)
        t0 = time.perf_counter()
        launcher.start(started, opts, Resources())
        crashed: list[str] = []
        while launcher.running():
            crashed += [
                str(e.get("reason")) for e in launcher.events(0.05) if e["event"] == "crash"
            ]
            if time.perf_counter() - t0 > WORKER_TIMEOUT_S:
                raise RuntimeError(f"a worker did not start and exit in {WORKER_TIMEOUT_S:g} s")
        elapsed = time.perf_counter() - t0
        crashed += [str(e.get("reason")) for e in launcher.events(0.05) if e["event"] == "crash"]
        launcher.close()
        self._launcher = None
        if crashed:
            raise RuntimeError(f"a worker failed to start: {crashed[0]}")
        return elapsed

    def probe(self, cfg: RunConfig, label: str) -> RunCosts:
        """Probe ``cfg`` as a worker runs a trial (the calls of ``run_grid_trial``,
        ``harness.sweep.launching.trial``): the probe's costs with ``trial_s``, the bookkeeping
        around the run."""
        from optuna.trial import TrialState  # noqa: PLC0415 - the sweep's store library, loaded with it

        study, spec, tracker = self.study, self.study_spec, self.tracker
        assert study is not None and spec is not None and tracker is not None
        seed = cfg.seed
        t0 = time.perf_counter()
        attrs = {"cell": label, "seed": seed, "attempt": 0}
        with_retries(lambda: study.enqueue_trial({}, user_attrs=attrs))
        trial = with_retries(lambda: claim_waiting_trial(study))
        if trial is None:
            raise RuntimeError("the scratch study gave no trial to probe")
        with_retries(lambda: frozen_trial(study, trial))  # the worker reads the trial's cell
        label_trial(study, trial, spec, label, seed)
        with heartbeat(study, trial):
            earlier = ended_attempts(study, trial, lambda o: trial_key(o) == (label, seed))
            end_orphaned_runs(tracker, spec, study.study_name, earlier)
            t1 = time.perf_counter()
            got = timed_probe(
                cfg,
                tracker,
                experiment=spec.experiment,
                run_name=f"{label} seed={seed}",
                parent_run_id=spec.parent_run_id,
                tags=child_run_tags(spec, study.study_name, label, seed, trial.number),
            )
            run_s = time.perf_counter() - t1
        result = got.result
        summary = {k: v for k, v in result.summary.items() if math.isfinite(v)}
        record = {
            "outcome": result.status,
            "reason": result.reason,
            "run_id": got.run_id,
            **summary_attrs(summary),
            "inert_clip": result.inert_clip,
            "wall_time": run_s,
            "machine": machine_text(result.tags),
        }
        for k, v in record.items():
            trial.set_user_attr(k, v)
        value = result.summary.get(spec.metric, math.nan)
        if result.status == "completed" and math.isfinite(value):
            with_retries(lambda: study.tell(trial, value))
        else:
            with_retries(lambda: study.tell(trial, state=TrialState.FAIL))
        trial_s = time.perf_counter() - t0 - run_s
        return replace(got.costs, trial_s=trial_s)

    def finish(self, command_s: float) -> SweepCosts:
        """The costs measured at the start, ``command_s``, and ``finish_study`` over the probes'
        trials, timed, its console output held back."""
        study, spec, tracker = self.study, self.study_spec, self.tracker
        assert study is not None and spec is not None and tracker is not None
        held = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            finish_study(study, tracker, spec, command=COMMAND, results_dir=self.root)
        return replace(self._once, command_s=command_s, report_s=time.perf_counter() - t0)
