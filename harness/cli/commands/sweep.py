"""The bodies of the sweep commands: ``ablate`` (a grid) and ``search`` (TPE), which share one
path, and ``worker`` and ``status`` for a running study."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from harness import tracking
from harness.cli.options import command_line, say, startup_s
from harness.config.experiment import ExperimentSpec, load_experiment
from harness.config.experiment_schema import MAX_CELLS_PER_WORKER
from harness.core.configtools import ConfigError, check_name
from harness.core.fsutil import fatal_event_error
from harness.sweep.launching.launch import stop_grace_s
from harness.sweep.launching.launch_checks import (
    LaunchChoice,
    check_devices,
    devices_to_check,
    launch_choice,
    workers_and_devices,
)
from harness.sweep.launching.worker import WorkerOptions, worker_loop
from harness.sweep.present.display import print_grid, print_search, print_status
from harness.sweep.scheduler.packs import PackPlan, check_packing, plan_lines
from harness.sweep.stores.opening import (
    check_store_urls,
    existing_storage,
    load_existing_study,
    open_stores,
)

if TYPE_CHECKING:
    from harness.sweep.launching.launchers.ray_launcher import RayLauncher


def run_experiment(
    experiment_file: Path,
    *,
    grid: bool,
    workers: int,
    devices: str | None,
    study_name: str | None,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
    launcher: tuple[str, str | None, float, float, bool],
    max_retries: int = 0,
    fail_fast: bool = False,
    report: bool = True,
    dry_run: bool = False,
    cells_per_worker: int | None = None,
) -> None:
    """`ablate` (``grid``) and `search`: validate everything, then open the stores and sweep.
    ``launcher`` is (--launcher, --ray-address, --gpus-per-worker, --cpus-per-worker,
    --shared-fs); ``cells_per_worker`` None takes the file's."""
    started = time.perf_counter() - startup_s()  # this command's start, as the dry run counts it
    workers, device_list = workers_and_devices(workers, devices)
    if not 0 <= max_retries <= 100:
        raise ConfigError(f"--max-retries: must be an integer in [0, 100]; got {max_retries}")
    spec = load_experiment(experiment_file)
    if grid and spec.search is not None:
        raise ConfigError(f"{experiment_file}: has a search section; run it with `harness search`")
    if not grid and spec.search is None:
        raise ConfigError(
            f"{experiment_file}: has no search section; run a grid with `harness ablate`"
        )
    if study_name is not None:
        check_name(study_name, "--study-name")
    k = cells_per_worker if cells_per_worker is not None else file_cells_per_worker(spec)
    plan = check_packing(spec, k, workers) if k != 1 else None
    if dry_run:
        print_dry_run(spec, workers, plan, k, started)
        return
    check_devices(*devices_to_check(spec, device_list))
    stop_grace_s()  # a bad HARNESS_STOP_GRACE_S is refused before any store is opened
    choice = launch_choice(*launcher, storage, tracking_uri)
    placed = placed_ray_launcher(choice)
    try:
        optuna_storage, tracker = open_stores(storage, tracking_uri, results_dir)
        # The sweep's machinery (workers, finishing, the report) loads once the input is valid,
        # so a bad file or flag answers in seconds, before transformers is imported.
        from harness.sweep.launching.driver import SweepOptions, sweep  # noqa: PLC0415 - loads the training stack: only for valid input

        opts = SweepOptions(
            storage=storage,
            tracking_uri=tracking_uri,
            results_dir=results_dir,
            study_name=study_name,
            workers=workers,
            device_list=device_list,
            command=command_line(),
            choice=choice,
            max_retries=max_retries,
            fail_fast=fail_fast,
            report=report,
            cells_per_worker=k,
            launcher=placed,
        )
        code = sweep(spec, opts, optuna_storage=optuna_storage, tracker=tracker, say=say)
    finally:
        if placed is not None:  # the sweep closed it; a refusal before the workers did not
            placed.close()
    if code:
        raise typer.Exit(code)


def print_dry_run(
    spec: ExperimentSpec, workers: int, plan: PackPlan | None, k: int, started: float
) -> None:
    """The dry run: the grid and its packs, or the search space and how its points pack, then
    the wall-time estimate (``started``: the command's start on the perf counter)."""
    if spec.search is None:
        print_grid(spec)
        for line in plan_lines(spec, plan) if plan is not None else []:
            print(line)
    else:
        print_search(spec)
        if k > 1:
            print(
                f"packing: up to {k} points per worker: each seed of the points a worker asks "
                "for together trains as one pack on one base model"
            )
    packs = plan.groups if plan is not None else None
    print(wall_time_line(spec, workers, time.perf_counter() - started, packs=packs, k=k))


def placed_ray_launcher(choice: LaunchChoice) -> RayLauncher | None:
    """``--launcher ray``: the Ray launcher, joined to its cluster (or the Ray started here),
    once it has checked that some node can hold one worker with ``--gpus-per-worker`` and
    ``--cpus-per-worker`` (a ConfigError otherwise: Ray would keep the tasks pending for ever).
    Before any store is opened, so a refusal writes nothing; the sweep then uses this launcher.
    None for the local launcher."""
    if choice.name != "ray":
        return None
    from harness.sweep.launching.launchers.ray_launcher import RayLauncher  # noqa: PLC0415 - loads Ray: only for --launcher ray

    launcher = RayLauncher(choice.ray_address)
    launcher.check_placement(choice.gpus, choice.cpus)
    return launcher


def file_cells_per_worker(spec: ExperimentSpec) -> int:
    """The experiment file's ``cells_per_worker`` (validated with the file), 1 when absent."""
    return int(spec.raw.get("cells_per_worker") or 1)


def wall_time_line(
    spec: ExperimentSpec,
    workers: int,
    command_s: float = 0.0,
    *,
    packs: list[list[str]] | None = None,
    k: int = 1,
) -> str:
    """The dry run's wall-time estimate (a grid's: harness.sweep.scheduler.estimate, a search's:
    harness.sweep.scheduler.search_estimate), or why there is none: a probe that cannot run here
    (a CUDA cell on a CPU machine, ...) is said, not hidden.  ``command_s``: what the command
    spent before the estimate began, as the sweep's command spends it too; ``packs``: the cells
    a worker trains together, ``k``: the points (``--cells-per-worker``)."""
    # The sweep's measuring loads its machinery (workers, the report): only for a valid file.
    # The sweep's command loads the same at this point (its driver): part of its start.
    loading = time.perf_counter()
    from harness.sweep.launching.estimating import measured_wall_time  # noqa: PLC0415 - loads the training stack: only for valid input
    from harness.sweep.launching.search_estimating import measured_search_wall_time  # noqa: PLC0415 - likewise
    from harness.sweep.scheduler.estimate import estimate_text  # noqa: PLC0415 - loads torch: only for valid input
    from harness.sweep.scheduler.search_estimate import search_estimate_text  # noqa: PLC0415 - likewise

    command_s += time.perf_counter() - loading

    try:
        if spec.search is not None:
            est = measured_search_wall_time(spec, workers, command_s=command_s, k=k)
            return search_estimate_text(spec, est, workers)
        est = measured_wall_time(spec, workers, command_s=command_s, packs=packs)
    except Exception as err:  # the probe is a real run: any failure is a reason, not a crash
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return f"estimated wall time: not measured (the probe run failed: {first})"
    return estimate_text(est, workers)


def join_study(
    study: str,
    *,
    storage: str | None,
    device: str | None,
    threads: int,
    tracking_uri: str | None,
    results_dir: Path,
    wait: bool,
    worker_id: int,
    events: str,
    cells_per_worker: int = 1,
) -> None:
    """`worker`: check the study and the stores, then work through the study's waiting trials
    until none is left (or, with ``wait``, until SIGTERM/SIGINT)."""
    if events not in ("text", "jsonl"):
        raise ConfigError(f"--events: must be text or jsonl; got {events!r}")

    if not 0 <= threads <= 1024:
        raise ConfigError(f"--threads: must be an integer in [0, 1024]; got {threads}")
    if not 1 <= cells_per_worker <= MAX_CELLS_PER_WORKER:
        raise ConfigError(
            f"--cells-per-worker: must be an integer in [1, {MAX_CELLS_PER_WORKER}]; "
            f"got {cells_per_worker}"
        )
    if device is not None:
        check_devices([device], "--device")
    check_store_urls(storage, tracking_uri)
    optuna_storage = existing_storage(storage, results_dir, study)
    load_existing_study(
        study,
        optuna_storage,
        f"--study: no study named {study!r} in this storage (see `harness status`)",
    )
    tracking.probe_tracking_uri(tracking_uri)
    # fails now, not in every trial, if it cannot be opened
    tracking.open_tracker(tracking_uri, results_dir)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    fatal: list[OSError] = []

    def emit(e: dict[str, Any]) -> None:
        if e["event"] == "fatal":
            fatal.append(fatal_event_error(e))
        if events == "jsonl":  # for a launcher that reads this worker's progress
            sys.stdout.write(json.dumps(e, default=str) + "\n")
            sys.stdout.flush()
        elif e["event"] == "done":
            say(f"{e['cell']} seed={e['seed']}: {e['outcome']} {e.get('reason') or ''}")

    counts = worker_loop(
        WorkerOptions(
            study=study,
            storage=storage,
            results_dir=results_dir,
            tracking_uri=tracking_uri,
            device=device,
            threads=threads,
            worker_id=worker_id,
            exit_when_idle=not wait,
            cells_per_worker=cells_per_worker,
        ),
        emit=emit,
        should_stop=stop.is_set,
    )
    if fatal:
        raise fatal[0]  # one line and exit 1 (user_errors)
    say(f"worker done: {counts}")


def print_study_status(study: str | None, *, storage: str | None, results_dir: Path) -> None:
    """`status`: done / running / waiting / failed trials of ``study`` (every study when None)."""
    st = existing_storage(storage, results_dir, study)
    if st is None:
        say(f"no studies yet (no Optuna storage under {results_dir})")
        return
    print_status(st, study)
