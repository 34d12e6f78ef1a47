"""The sweep commands: ``ablate`` (a grid) and ``search`` (TPE), which share one path, and
``worker`` and ``status`` for a running study."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from harness.cli.options import ResultsDir, Storage, TrackingUri, user_errors

Workers = Annotated[int, typer.Option("--workers", help="Local worker processes.")]
Devices = Annotated[
    str | None,
    typer.Option(
        "--devices", help="Comma-separated devices, one worker each (e.g. cuda:0,cuda:1)."
    ),
]
CellsPerWorker = Annotated[
    int | None,
    typer.Option(
        "--cells-per-worker",
        help="LoRA trials each worker trains at once on one base model (trials of one seed "
        "that share the base fields; default: the file's cells_per_worker, else 1; "
        "docs/scaling.md).",
    ),
]
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


def _dry_run(prints: str) -> Any:
    return typer.Option(
        "--dry-run",
        help=f"Validate the file and print {prints}, writing nothing. Validation imports "
        "python: task modules, so it runs their code.",
    )


GridDryRun = Annotated[bool, _dry_run("the grid")]
SearchDryRun = Annotated[bool, _dry_run("the search space, the budget and the estimated wall time")]


def _with_sweep_options(command: Any) -> Any:
    """Give ``command`` (which takes ``**shared``) the options `ablate` and `search` share: the
    stores and the launcher.  Typer reads a command's signature and type hints, so the shared
    options are declared once, here, and reach the command as keyword arguments."""

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
    """The shared options as `run_experiment` takes them (the launcher's five as one tuple)."""
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
    cells_per_worker: CellsPerWorker = None,
    dry_run: GridDryRun = False,
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
    from harness.cli.commands.sweep import run_experiment  # noqa: PLC0415 - a command's body loads when it runs

    run_experiment(
        experiment_file,
        grid=True,
        workers=workers,
        devices=devices,
        cells_per_worker=cells_per_worker,
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
    cells_per_worker: CellsPerWorker = None,
    dry_run: SearchDryRun = False,
    **shared: Any,
) -> None:
    """TPE (or two-objective) search; seeds inside each trial; median/Wilcoxon pruning; resumable."""
    from harness.cli.commands.sweep import run_experiment  # noqa: PLC0415 - a command's body loads when it runs

    run_experiment(
        experiment_file,
        grid=False,
        workers=workers,
        devices=devices,
        cells_per_worker=cells_per_worker,
        dry_run=dry_run,
        **_shared_call(shared),
    )


@user_errors
def worker_cmd(
    study: Annotated[str, typer.Option("--study", help="Study to join.")],
    storage: Storage = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Device for this worker (cpu, cuda:N).")
    ] = None,
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads.")] = 1,
    cells_per_worker: Annotated[
        int,
        typer.Option(
            "--cells-per-worker",
            help="LoRA trials of a grid this worker trains at once on one base model.",
        ),
    ] = 1,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
    wait: Annotated[
        bool, typer.Option("--wait/--exit-when-idle", help="Keep polling for new trials.")
    ] = False,
    worker_id: Annotated[int, typer.Option("--worker-id", hidden=True)] = 0,
    events: Annotated[str, typer.Option("--events", hidden=True)] = "text",
) -> None:
    """Join a running study (from another machine or GPU) and work through its waiting trials."""
    from harness.cli.commands.sweep import join_study  # noqa: PLC0415 - a command's body loads when it runs

    join_study(
        study,
        storage=storage,
        device=device,
        threads=threads,
        cells_per_worker=cells_per_worker,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
        wait=wait,
        worker_id=worker_id,
        events=events,
    )


@user_errors
def status_cmd(
    study: Annotated[str | None, typer.Argument(help="Study name (omit to list all).")] = None,
    storage: Storage = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Done / running / waiting / failed trials per study."""
    from harness.cli.commands.sweep import print_study_status  # noqa: PLC0415 - a command's body loads when it runs

    print_study_status(study, storage=storage, results_dir=results_dir)
