"""The sweep commands: ``ablate`` (a grid) and ``search`` (TPE), which share one path, and
``worker`` and ``status`` for a running study."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.options import ResultsDir, Storage, TrackingUri, command_line, say, user_errors

Workers = Annotated[int, typer.Option("--workers", help="Local worker processes.")]
StudyName = Annotated[
    str | None,
    typer.Option("--study-name", help="Study name (default: the experiment's name)."),
]
LauncherOpt = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="Where workers run: local (processes on this machine) or ray (tasks on a Ray cluster; pip install 'harness\\[ray]').",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="Ray cluster to join (e.g. HEAD:6379 or auto; default: start Ray on this machine).",
    ),
]
GpusPerWorker = Annotated[
    float, typer.Option("--gpus-per-worker", help="Ray: GPUs reserved for each worker.")
]
CpusPerWorker = Annotated[
    float, typer.Option("--cpus-per-worker", help="Ray: CPUs reserved for each worker.")
]
SharedFs = Annotated[
    bool,
    typer.Option(
        "--shared-fs",
        help="Ray: RESULTS (journal, SQLite) is on a filesystem every node mounts.",
    ),
]


def _run_experiment(
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
) -> None:
    """`ablate` (``grid``) and `search`: validate everything, then open the stores and sweep.
    ``launcher`` is (--launcher, --ray-address, --gpus-per-worker, --cpus-per-worker,
    --shared-fs)."""
    from harness.config.experiment import load_experiment
    from harness.core.configtools import ConfigError, check_name
    from harness.sweep.launching.driver import SweepOptions, sweep
    from harness.sweep.launching.launch_checks import (
        check_devices,
        devices_to_check,
        launch_choice,
        workers_and_devices,
    )
    from harness.sweep.stores.opening import open_stores

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
    if dry_run:
        from harness.sweep.present.display import print_grid

        print_grid(spec)
        if grid:
            print(wall_time_line(spec, workers))
        return
    check_devices(*devices_to_check(spec, device_list))
    from harness.sweep.launching.launch import stop_grace_s

    stop_grace_s()  # a bad HARNESS_STOP_GRACE_S is refused before any store is opened
    choice = launch_choice(*launcher, storage, tracking_uri)
    optuna_storage, tracker = open_stores(storage, tracking_uri, results_dir)
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
    )
    code = sweep(spec, opts, optuna_storage=optuna_storage, tracker=tracker, say=say)
    if code:
        raise typer.Exit(code)


def wall_time_line(spec: Any, workers: int) -> str:
    """The dry run's wall-time estimate (harness.sweep.scheduler.estimate), or why there is none: a probe
    that cannot run here (a CUDA cell on a CPU machine, ...) is said, not hidden."""
    from harness.sweep.scheduler.estimate import estimate_text, estimate_wall_time

    try:
        return estimate_text(estimate_wall_time(spec, workers), workers)
    except Exception as err:  # the probe is a real run: any failure is a reason, not a crash
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return f"estimated wall time: not measured (the probe run failed: {first})"


Devices = Annotated[
    str | None,
    typer.Option(
        "--devices", help="Comma-separated devices, one worker each (e.g. cuda:0,cuda:1)."
    ),
]


def _with_sweep_options(command: Any) -> Any:
    """Give ``command`` (which takes ``**shared``) the options `ablate` and `search` share: the
    stores and the launcher.  Typer reads a command's signature and type hints, so the shared
    options are declared once, here, and reach the command as keyword arguments."""
    import functools
    import inspect
    from typing import get_type_hints

    def study_name(study_name: StudyName = None) -> None: ...
    def storage(storage: Storage = None) -> None: ...
    def tracking_uri(tracking_uri: TrackingUri = None) -> None: ...
    def results_dir(results_dir: ResultsDir = Path("results")) -> None: ...
    def launcher(launcher: LauncherOpt = "local") -> None: ...
    def ray_address(ray_address: RayAddress = None) -> None: ...
    def gpus_per_worker(gpus_per_worker: GpusPerWorker = 0.0) -> None: ...
    def cpus_per_worker(cpus_per_worker: CpusPerWorker = 1.0) -> None: ...
    def shared_fs(shared_fs: SharedFs = False) -> None: ...

    own = inspect.signature(command, eval_str=True).parameters.values()
    params = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    hints = get_type_hints(command, include_extras=True)
    for declare in (
        study_name,
        storage,
        tracking_uri,
        results_dir,
        launcher,
        ray_address,
        gpus_per_worker,
        cpus_per_worker,
        shared_fs,
    ):
        params.extend(inspect.signature(declare, eval_str=True).parameters.values())
        hints.update(get_type_hints(declare, include_extras=True))

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    del wrapper.__wrapped__  # typer must see the signature below, not the command's own
    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**hints, "return": None}
    return wrapper


def _shared_call(shared: dict[str, Any]) -> dict[str, Any]:
    """The shared options as `_run_experiment` takes them (the launcher's five as one tuple)."""
    names = ("launcher", "ray_address", "gpus_per_worker", "cpus_per_worker", "shared_fs")
    rest = {k: v for k, v in shared.items() if k not in names}
    return {**rest, "launcher": tuple(shared[k] for k in names)}


@user_errors
@_with_sweep_options
def ablate_cmd(
    experiment_file: Annotated[
        Path, typer.Argument(help="Experiment YAML (grid of cells x seeds).")
    ],
    workers: Workers = 1,
    devices: Devices = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Validate the file and print the grid, writing nothing. Validation imports "
            "python: task modules, so it runs their code.",
        ),
    ] = False,
    fail_fast: Annotated[
        bool,
        typer.Option("--fail-fast", help="Stop the sweep at the first failed (errored) trial."),
    ] = False,
    max_retries: Annotated[
        int,
        typer.Option(
            "--max-retries", help="Retry a trial that failed with an error up to N times."
        ),
    ] = 0,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Write the report at the end.")
    ] = True,
    **shared: Any,
) -> None:
    """Run every (cell, seed) of an ablation grid; resumable; ends with a ranking and a report."""
    _run_experiment(
        experiment_file,
        grid=True,
        workers=workers,
        devices=devices,
        max_retries=max_retries,
        fail_fast=fail_fast,
        report=report,
        dry_run=dry_run,
        **_shared_call(shared),
    )


@user_errors
@_with_sweep_options
def search_cmd(
    experiment_file: Annotated[Path, typer.Argument(help="Experiment YAML with a search section.")],
    workers: Workers = 1,
    devices: Devices = None,
    **shared: Any,
) -> None:
    """TPE (or two-objective) search; seeds inside each trial; median/Wilcoxon pruning; resumable."""
    _run_experiment(
        experiment_file, grid=False, workers=workers, devices=devices, **_shared_call(shared)
    )


@user_errors
def worker_cmd(
    study: Annotated[str, typer.Option("--study", help="Study to join.")],
    storage: Storage = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Device for this worker (cpu, cuda:N).")
    ] = None,
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads.")] = 1,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
    wait: Annotated[
        bool, typer.Option("--wait/--exit-when-idle", help="Keep polling for new trials.")
    ] = False,
    worker_id: Annotated[int, typer.Option("--worker-id", hidden=True)] = 0,
    events: Annotated[str, typer.Option("--events", hidden=True)] = "text",
) -> None:
    """Join a running study (from another machine or GPU) and work through its waiting trials."""
    import json
    import signal as _signal
    import threading

    from harness import tracking
    from harness.core.configtools import ConfigError
    from harness.sweep.launching.launch_checks import check_devices
    from harness.sweep.stores.opening import check_store_urls, existing_storage

    if events not in ("text", "jsonl"):
        raise ConfigError(f"--events: must be text or jsonl; got {events!r}")

    if not 0 <= threads <= 1024:
        raise ConfigError(f"--threads: must be an integer in [0, 1024]; got {threads}")
    if device is not None:
        check_devices([device], "--device")
    check_store_urls(storage, tracking_uri)
    optuna_storage = existing_storage(storage, results_dir, study)
    import optuna

    try:
        optuna.load_study(study_name=study, storage=optuna_storage)
    except KeyError:
        raise ConfigError(
            f"--study: no study named {study!r} in this storage (see `harness status`)"
        ) from None
    tracking.probe_tracking_uri(tracking_uri)
    # fails now, not in every trial, if it cannot be opened
    tracking.open_tracker(tracking_uri, results_dir)
    from harness.sweep.launching.worker import WorkerOptions, worker_loop

    stop = threading.Event()
    _signal.signal(_signal.SIGTERM, lambda *_: stop.set())
    _signal.signal(_signal.SIGINT, lambda *_: stop.set())

    fatal: list[str] = []

    def emit(e: dict[str, Any]) -> None:
        if e["event"] == "fatal":
            fatal.append(str(e.get("reason") or "disk full"))
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
        ),
        emit=emit,
        should_stop=stop.is_set,
    )
    if fatal:
        from harness.core.fsutil import DiskFullError

        raise DiskFullError(fatal[0])  # one line and exit 1 (user_errors)
    say(f"worker done: {counts}")


@user_errors
def status_cmd(
    study: Annotated[str | None, typer.Argument(help="Study name (omit to list all).")] = None,
    storage: Storage = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Done / running / waiting / failed trials per study."""
    from harness.sweep.stores.opening import existing_storage

    st = existing_storage(storage, results_dir, study)
    if st is None:
        say(f"no studies yet (no Optuna storage under {results_dir})")
        return
    from harness.sweep.present.display import print_status

    print_status(st, study)
