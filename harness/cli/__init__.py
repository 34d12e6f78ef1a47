"""The ``harness`` command line.  Thin: every command imports its heavy modules lazily so that
``harness --help`` answers at once, and turns bad input into one line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

try:  # typer >= 0.22 vendors click; its usage errors are typer._click's, not click's
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as _click_exc  # type: ignore[no-redef]


class _OneLineUsageErrors(TyperGroup):
    """Usage errors (``--workers abc``, an unknown option, a missing argument) as the harness's
    one line on stderr with exit code 2, instead of click's multi-line usage box."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_errors_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_errors_one_line() -> Iterator[None]:
    try:
        yield
    except _click_exc.NoArgsIsHelpError:
        raise  # bare `harness`/`harness ablate`: the help text is the answer
    except _click_exc.UsageError as err:
        msg = " ".join(err.format_message().split())
        if msg.startswith("Invalid value for "):
            # "Invalid value for '--workers': 'abc' is not a valid integer." → "--workers: ..."
            name, _, rest = msg[len("Invalid value for ") :].partition(": ")
            for kind in ("integer", "number", "boolean"):
                if f"valid {kind}" in rest:
                    rest = f"must be {'a' if kind != 'integer' else 'an'} {kind}"
            msg = f"{name.strip(chr(39))}: {rest}"
        msg = msg.rstrip(".")
        where = f" (see `{err.ctx.command_path} --help`)" if err.ctx is not None else ""
        typer.echo(f"error: {msg}{where}", err=True)
        raise typer.Exit(2) from None


app = typer.Typer(
    cls=_OneLineUsageErrors,
    help="Ablation harness for PPO fine-tuning of language models: which clipping and "
    "normalization settings keep a PPO run stable?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


@app.callback()
def _root() -> None:
    """Ablation harness for PPO fine-tuning of language models."""
    import logging
    import os

    from harness.core.fsutil import restrict_umask
    from harness.core.perf import tune_malloc

    restrict_umask()  # nothing the harness writes is group/world-writable, whatever the umask
    tune_malloc()
    # Library chatter (MLflow's schema migrations, Optuna's "study created") is not for users.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("mlflow", "alembic", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)


ResultsDir = Annotated[
    Path, typer.Option("--results-dir", help="Where embedded stores, caches and reports go.")
]
TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        envvar="HARNESS_TRACKING_URI",
        help="MLflow tracking URI (default sqlite:///RESULTS/mlflow.db; http(s)://host:port for a server). "
        "Also read from $HARNESS_TRACKING_URI, which keeps a password out of the process list.",
    ),
]


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


RESUME_HINT = "free some space and run the same command again (a sweep resumes where it stopped)"


def user_errors(fn: F) -> F:
    """Bad input → ``error: <one line>`` on stderr, exit code 2, no traceback.  A full disk
    (any write of any store) → ``error: disk full (...)`` and how to go on, exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from harness.core.configtools import ConfigError
        from harness.core.db import StorageUnavailable
        from harness.core.fsutil import disk_full_message, is_disk_full

        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            fail(str(err).splitlines()[0])
        except StorageUnavailable as err:  # an outage past the retry budget: not bad input
            fail(str(err).splitlines()[0], code=1)
        except typer.Exit:
            raise  # already said what it had to (even while handling a full disk)
        except Exception as err:
            if not is_disk_full(err):
                raise
            fail(f"{disk_full_message(err)}; {RESUME_HINT}", code=1)

    return wrapper  # type: ignore[return-value]


@app.command("run")
@user_errors
def run_cmd(
    config: Annotated[
        Path | None, typer.Argument(help="Run config YAML (omit for the defaults).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a config key, e.g. --set ppo.eps_clip=0.3 (repeatable)."
        ),
    ] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment name.")] = "harness-run",
    run_name: Annotated[str | None, typer.Option(help="MLflow run name.")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Train one PPO policy, log it to MLflow and print a final summary."""
    from harness.config import load_run_config

    cfg = load_run_config(config, set_ or [])
    _check_devices([cfg.device], "device")
    _check_store_urls(None, tracking_uri)
    _probe_remote(None, tracking_uri)
    tracker = _tracker(tracking_uri, results_dir)

    from harness.cli.console import run_with_progress
    from harness.tasks.base import RewardError

    try:
        result, rid = run_with_progress(
            cfg,
            tracker,
            experiment=experiment,
            run_name=run_name or f"{cfg.task}-seed{cfg.seed}",
            results_dir=results_dir,
        )
    except RewardError as err:
        # The MLflow run is already ended FAILED with this reason (harness.run.tracked): a run
        # failure, not bad input, so exit 1 with the reason and no traceback.
        fail(f"run FAILED: {err}", code=1)
    except (RuntimeError, MemoryError) as err:  # out of memory, a device or library error
        # Recorded as the MLflow run's reason too; a run failure, so exit 1, not 2.
        text = str(err).strip().splitlines()
        fail(f"run FAILED: {type(err).__name__}: {text[0] if text else ''}"[:500], code=1)
    if result.status != "completed":
        sys.exit(1)


Storage = Annotated[
    str | None,
    typer.Option(
        "--storage",
        envvar="HARNESS_STORAGE",
        help="Optuna storage: journal file under RESULTS (default), sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB. "
        "Also read from $HARNESS_STORAGE, which keeps a password out of the process list.",
    ),
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


@dataclass(frozen=True)
class LaunchChoice:
    """--launcher and its resources, validated before any store is opened."""

    name: str = "local"
    ray_address: str | None = None
    gpus: float = 0.0
    cpus: float = 1.0


def _launch_choice(
    launcher: str,
    ray_address: str | None,
    gpus: float,
    cpus: float,
    shared_fs: bool,
    storage: str | None,
    tracking_uri: str | None,
) -> LaunchChoice:
    import math

    from harness.core.configtools import ConfigError

    if launcher not in ("local", "ray"):
        raise ConfigError(f"--launcher: must be local or ray; got {launcher!r}")
    for flag, v in (("--gpus-per-worker", gpus), ("--cpus-per-worker", cpus)):
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"{flag}: must be a number >= 0; got {v}")
    if launcher == "local":
        if ray_address is not None or gpus or cpus != 1.0 or shared_fs:
            raise ConfigError(
                "--ray-address, --gpus-per-worker, --cpus-per-worker and --shared-fs need "
                "--launcher ray"
            )
        return LaunchChoice()
    from harness.sweep.launchers.ray_launcher import check_shareable, import_ray, probe_address

    import_ray()
    check_shareable(storage, tracking_uri, address=ray_address, shared_fs=shared_fs)
    if ray_address is not None:
        probe_address(ray_address)
    return LaunchChoice("ray", ray_address, gpus, cpus)


def _probe_remote(storage: str | None, tracking_uri: str | None) -> None:
    """Connect to a PostgreSQL storage / a remote tracking store before anything is created
    locally, so that an unreachable server leaves no results dir, journal or mlflow.db behind."""
    from harness.core.configtools import ConfigError
    from harness.core.db import url_scheme
    from harness.core.redact import redact_url

    if storage not in (None, "journal") and url_scheme(storage) == "postgresql":
        from harness.core.db import database_connect_error

        reason = database_connect_error(storage)
        if reason is not None:
            raise ConfigError(f"storage: cannot connect to {redact_url(storage)} ({reason})")
    if tracking_uri not in (None, "memory"):
        scheme = url_scheme(tracking_uri)
        if scheme != "sqlite":
            from harness.tracking import _probe

            reason = _probe(tracking_uri, scheme)
            if reason is not None:
                raise ConfigError(
                    f"tracking_uri: cannot connect to {redact_url(tracking_uri)} ({reason})"
                )


def _tracker(tracking_uri: str | None, results_dir: Path) -> Any:
    from harness.core.configtools import ConfigError
    from harness.core.fsutil import ensure_results_dir

    ensure_results_dir(results_dir)
    try:
        from harness.tracking import make_tracker

        return make_tracker(tracking_uri, results_dir, check=False)  # probed by _probe_remote
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def _stores(storage: str | None, tracking_uri: str | None, results_dir: Path) -> tuple[Any, Any]:
    """Open the Optuna storage and the tracker; any problem is a one-line ConfigError.  Remote
    stores are probed before the results dir or any local store is created."""
    from harness.core.configtools import ConfigError
    from harness.core.fsutil import ensure_results_dir

    _check_store_urls(storage, tracking_uri)
    _probe_remote(storage, tracking_uri)
    ensure_results_dir(results_dir)
    try:
        from harness.sweep.storage import make_storage

        optuna_storage = make_storage(storage, results_dir)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    return optuna_storage, _tracker(tracking_uri, results_dir)


def _existing_storage(storage: str | None, results_dir: Path, study: str | None) -> Any:
    """The Optuna storage for a read-only command (status, report, worker): a journal or SQLite
    file that does not exist is never created; ``None`` when there is no storage (and no study
    was asked for)."""
    from harness.core.configtools import ConfigError

    _check_store_urls(storage, None)
    local: Path | None = None
    if storage in (None, "journal"):
        from harness.sweep.storage import JOURNAL_FILE

        local = results_dir / JOURNAL_FILE
    elif storage.startswith("sqlite:///"):
        local = Path(storage[len("sqlite:///") :])
    if local is not None and not local.is_file():
        if study is not None:
            raise ConfigError(
                f"study: no study named {study!r} (no Optuna storage at {local}; "
                "check --results-dir / --storage)"
            )
        return None
    _probe_remote(storage, None)
    try:
        from harness.sweep.storage import make_storage

        return make_storage(storage, results_dir)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def _check_devices(devices: list[str], where: str) -> None:
    """A device this machine does not have is a config error up front, not N failed trials."""
    if all(d.strip().lower() == "cpu" for d in devices):
        return  # no torch import for the common case
    from harness.core.configtools import ConfigError
    from harness.model.build import resolve_device

    for d in devices:
        try:
            resolve_device(d)
        except ValueError as err:
            msg = str(err).splitlines()[0]
            raise ConfigError(msg.replace("device:", f"{where}:", 1)) from None


def _check_store_urls(storage: str | None, tracking_uri: str | None) -> None:
    """Scheme checks that need no connection (so bad URLs fail before anything is written)."""
    from harness.core.configtools import ConfigError
    from harness.core.db import url_scheme
    from harness.core.redact import redact_url

    if storage not in (None, "journal"):
        scheme = url_scheme(storage)
        if scheme not in ("sqlite", "postgresql"):
            raise ConfigError(
                f"--storage: scheme {scheme or redact_url(storage)!r} is not supported "
                "(use journal, sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB)"
            )
    if tracking_uri not in (None, "memory"):
        scheme = url_scheme(tracking_uri)
        if scheme not in ("sqlite", "postgresql", "http", "https"):
            raise ConfigError(
                f"--tracking-uri: scheme {scheme or redact_url(tracking_uri)!r} is not supported "
                "(use sqlite:///PATH, http(s)://HOST:PORT or postgresql://...)"
            )
        from harness.tracking import check_http_credentials

        try:
            check_http_credentials(tracking_uri)
        except ValueError as error:
            raise ConfigError(f"--{error}".replace("--tracking_uri", "--tracking-uri", 1)) from None
    for flag, url in (("--storage", storage), ("--tracking-uri", tracking_uri)):
        if url is not None and url.startswith("sqlite:///"):
            _check_sqlite_path(flag, url[len("sqlite:///") :])


def _check_sqlite_path(flag: str, path: str) -> None:
    """sqlite:///PATH must name a file in an existing directory: SQLAlchemy/MLflow would
    otherwise create the directories (anywhere on the machine) or use an in-memory database."""
    from harness.core.configtools import ConfigError

    if not path or path.endswith("/"):
        raise ConfigError(f"{flag}: sqlite:///PATH needs a database file path; got {path!r}")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag}: {path!r} is a directory; name a database file in it")
    if not target.parent.is_dir():
        raise ConfigError(
            f"{flag}: directory {str(target.parent)!r} does not exist (create it first)"
        )


MAX_WORKERS = 256  # local worker processes; more is a typo, not a plan (each loads torch)


def _workers_and_devices(workers: int, devices: str | None) -> tuple[int, list[str] | None]:
    """--workers / --devices of `ablate` and `search`: validated; with devices and the default
    worker count, one worker per device."""
    from harness.core.configtools import ConfigError, is_device_name

    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"--workers: must be an integer in [1, {MAX_WORKERS}]; got {workers}")
    if not devices:
        return workers, None
    device_list = [d.strip() for d in devices.split(",")]
    for d in device_list:
        if not is_device_name(d, allow_auto=False):
            raise ConfigError(f"--devices: {d!r} is not cpu, cuda or cuda:N")
    return (len(device_list) if workers == 1 else workers), device_list


def _devices_to_check(spec: Any, device_list: list[str] | None) -> tuple[list[str], str]:
    """The devices local workers will use: --devices, else every device the cells ask for."""
    if device_list:
        return device_list, "--devices"
    from harness.config import build_run_config

    found = {str(build_run_config(spec.base).device)}
    for cell in getattr(spec, "cells", None) or []:
        if "device" in cell.overrides:
            found.add(str(cell.overrides["device"]))
    return sorted(found), "device"


def _command_line() -> str:
    import shlex

    from harness.core.redact import redact_text

    return redact_text("harness " + " ".join(shlex.quote(a) for a in sys.argv[1:]), [])


@app.command("fields")
def fields_cmd(
    prefix: Annotated[
        str, typer.Argument(help="Only fields under this dotted prefix, e.g. ppo.")
    ] = "",
) -> None:
    """List every run-config field (dotted path, default, help) — what --set and grid axes take."""
    from rich.console import Console

    from harness.config import RunConfig
    from harness.core.configtools import field_defaults, field_help

    defaults = field_defaults(RunConfig)
    rows = [
        (path, repr(defaults.get(path)), text)
        for path, text in field_help(RunConfig).items()
        if path.startswith(prefix)
    ]
    if not sys.stdout.isatty():
        # Piped (`harness fields | grep lora`): one whole line per field, tab-separated, so no
        # dotted name is cut at a table column's width.
        for row in rows:
            typer.echo("\t".join(row))
        return
    Console().print(fields_table(rows))


def fields_table(rows: list[tuple[str, str, str]]) -> Any:
    """The terminal table of ``harness fields``: whole dotted names, help text taken literally."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    # A dotted name is what --set takes: never cut it; the help column wraps instead.
    table.add_column("field", no_wrap=True, min_width=max((len(r[0]) for r in rows), default=5))
    table.add_column("default")
    table.add_column("help")
    for row in rows:  # help texts hold literal brackets ([q_proj, v_proj]): not rich markup
        table.add_row(*(escape(cell) for cell in row))
    return table


@app.command("ablate")
@user_errors
def ablate_cmd(
    experiment_file: Annotated[
        Path, typer.Argument(help="Experiment YAML (grid of cells x seeds).")
    ],
    workers: Annotated[int, typer.Option("--workers", help="Local worker processes.")] = 1,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices", help="Comma-separated devices, one worker each (e.g. cuda:0,cuda:1)."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Validate the file and print the grid, writing nothing. Validation imports "
            "python: task modules, so it runs their code.",
        ),
    ] = False,
    study_name: Annotated[
        str | None,
        typer.Option("--study-name", help="Study name (default: the experiment's name)."),
    ] = None,
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
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
    launcher: LauncherOpt = "local",
    ray_address: RayAddress = None,
    gpus_per_worker: GpusPerWorker = 0.0,
    cpus_per_worker: CpusPerWorker = 1.0,
    shared_fs: SharedFs = False,
) -> None:
    """Run every (cell, seed) of an ablation grid; resumable; ends with a ranking and a report."""
    from harness.config.experiment import load_experiment
    from harness.core.configtools import ConfigError, check_name

    workers, device_list = _workers_and_devices(workers, devices)
    if not 0 <= max_retries <= 100:
        raise ConfigError(f"--max-retries: must be an integer in [0, 100]; got {max_retries}")
    spec = load_experiment(experiment_file)
    if spec.search is not None:
        raise ConfigError(f"{experiment_file}: has a search section; run it with `harness search`")
    if study_name is not None:
        check_name(study_name, "--study-name")
    if dry_run:
        from harness.sweep.display import print_grid

        print_grid(spec)
        return
    _check_devices(*_devices_to_check(spec, device_list))
    choice = _launch_choice(
        launcher, ray_address, gpus_per_worker, cpus_per_worker, shared_fs, storage, tracking_uri
    )
    optuna_storage, tracker = _stores(storage, tracking_uri, results_dir)

    from harness.sweep.study import enqueue_missing, open_study

    command = _command_line()
    study, study_spec = open_study(
        spec,
        storage=optuna_storage,
        tracker=tracker,
        study_name=study_name,
        tracking_uri=tracking_uri,
        max_retries=max_retries,
        command=command,
    )
    with _parent_closed_on_abort(tracker, study_spec):
        enqueued, done = enqueue_missing(study, study_spec)
        typer.echo(
            f"study {study.study_name!r}: {spec.n_trials} trials ({len(spec.cells)} cells x "
            f"{len(spec.seeds)} seeds), {done} already done, {enqueued} enqueued; "
            f"{workers} worker(s)",
            err=True,
        )
        _run_sweep(
            study,
            study_spec,
            tracker,
            storage=storage,
            tracking_uri=tracking_uri,
            results_dir=results_dir,
            workers=workers,
            device_list=device_list,
            done=done,
            fail_fast=fail_fast,
            command=command,
            report=report,
            choice=choice,
        )


@contextlib.contextmanager
def _parent_closed_on_abort(tracker: Any, spec: Any) -> Iterator[None]:
    """A sweep stopped by Ctrl-C/SIGTERM or a full disk after its parent MLflow run was opened
    ends that run KILLED (where the store still takes it) instead of leaving it RUNNING.
    Ctrl-C ends the command with exit 130 and the resume hint, no traceback."""
    import signal

    from harness.core.fsutil import disk_full_message, is_disk_full

    try:
        yield
    except BaseException as err:
        if isinstance(err, typer.Exit):
            raise  # the command's own exit (unfinished, interrupted during the trials)
        if isinstance(err, KeyboardInterrupt):
            reason = "interrupted"
        elif isinstance(err, Exception) and is_disk_full(err):
            reason = disk_full_message(err)
        else:
            raise
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this
        try:
            _close_parent(tracker, spec, reason)
        finally:
            signal.signal(signal.SIGINT, old)
        if isinstance(err, KeyboardInterrupt):
            typer.echo("interrupted: run the same command again to resume", err=True)
            raise typer.Exit(130) from None
        raise


def _close_parent(tracker: Any, spec: Any, reason: str) -> None:
    """End the sweep's parent run KILLED with ``reason``, as far as the tracking store allows."""
    from harness.sweep.finish import OUTCOME_TAG

    parent = spec.parent_run_id
    if not parent:
        return
    for call in (
        lambda: tracker.set_tags(parent, {OUTCOME_TAG: reason}),
        lambda: tracker.end_run(parent, "KILLED"),
    ):
        try:
            call()
        except Exception:
            pass  # a full disk may refuse it too; the next run of the command ends it


def _run_sweep(
    study: Any,
    spec: Any,
    tracker: Any,
    *,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: Path,
    workers: int,
    device_list: list[str] | None,
    done: int,
    command: str,
    fail_fast: bool = False,
    report: bool = True,
    choice: LaunchChoice = LaunchChoice(),
) -> None:
    """Run the workers of an opened study (grid or search), then finish it: the one path of
    `ablate` and `search`."""
    import signal

    from harness.core.fsutil import DiskFullError
    from harness.sweep.finish import finish_study
    from harness.sweep.launch import Resources, make_launcher, run_workers
    from harness.sweep.worker import WorkerOptions

    opts = WorkerOptions(
        study=study.study_name,
        storage=storage,
        results_dir=results_dir,
        tracking_uri=tracking_uri,
        threads=1,  # one torch thread per run: results must not depend on the worker count
    )
    fatal: list[str] = []

    def on_event(e: dict[str, Any]) -> None:
        if e["event"] == "fatal":
            fatal.append(str(e.get("reason") or "disk full"))

    counts = run_workers(
        make_launcher(choice.name, ray_address=choice.ray_address),
        workers,
        opts,
        resources=Resources(devices=tuple(device_list or ()), gpus=choice.gpus, cpus=choice.cpus),
        total=spec.expected_trials,
        done_before=done,
        fail_fast=fail_fast,
        on_event=on_event,
    )
    if fatal:  # a worker found the disk full: no report from a store that cannot take it
        raise DiskFullError(fatal[0])

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM while finishing: close the parent run, as on Ctrl-C

    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        finished = finish_study(
            study, tracker, spec, command=command, results_dir=results_dir, write_report=report
        )
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if counts.get("interrupted_by_user"):
        typer.echo("interrupted: run the same command again to resume", err=True)
        raise typer.Exit(130)
    if not finished.complete and spec.kind == "grid":
        raise typer.Exit(1)
    if not finished.completed:  # a search in which every trial failed (reasons printed above)
        raise typer.Exit(1)


@app.command("search")
@user_errors
def search_cmd(
    experiment_file: Annotated[Path, typer.Argument(help="Experiment YAML with a search section.")],
    workers: Annotated[int, typer.Option("--workers", help="Local worker processes.")] = 1,
    devices: Annotated[
        str | None, typer.Option("--devices", help="Comma-separated devices, one worker each.")
    ] = None,
    study_name: Annotated[
        str | None,
        typer.Option("--study-name", help="Study name (default: the experiment's name)."),
    ] = None,
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
    launcher: LauncherOpt = "local",
    ray_address: RayAddress = None,
    gpus_per_worker: GpusPerWorker = 0.0,
    cpus_per_worker: CpusPerWorker = 1.0,
    shared_fs: SharedFs = False,
) -> None:
    """TPE (or two-objective) search; seeds inside each trial; median/Wilcoxon pruning; resumable."""
    from harness.config.experiment import load_experiment
    from harness.core.configtools import ConfigError, check_name

    workers, device_list = _workers_and_devices(workers, devices)
    spec = load_experiment(experiment_file)
    if spec.search is None:
        raise ConfigError(
            f"{experiment_file}: has no search section; run a grid with `harness ablate`"
        )
    if study_name is not None:
        check_name(study_name, "--study-name")
    _check_devices(*_devices_to_check(spec, device_list))
    choice = _launch_choice(
        launcher, ray_address, gpus_per_worker, cpus_per_worker, shared_fs, storage, tracking_uri
    )
    optuna_storage, tracker = _stores(storage, tracking_uri, results_dir)
    from harness.sweep.study import enqueue_missing, open_study

    command = _command_line()
    study, study_spec = open_study(
        spec,
        storage=optuna_storage,
        tracker=tracker,
        study_name=study_name,
        tracking_uri=tracking_uri,
        command=command,
    )
    with _parent_closed_on_abort(tracker, study_spec):
        _, done = enqueue_missing(study, study_spec)
        typer.echo(
            f"study {study.study_name!r}: up to {spec.search.n_trials} trials x {len(spec.seeds)} seeds, {workers} worker(s)",
            err=True,
        )
        _run_sweep(
            study,
            study_spec,
            tracker,
            storage=storage,
            tracking_uri=tracking_uri,
            results_dir=results_dir,
            workers=workers,
            device_list=device_list,
            done=done,
            command=command,
            choice=choice,
        )


@app.command("worker")
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

    from harness.core.configtools import ConfigError

    if events not in ("text", "jsonl"):
        raise ConfigError(f"--events: must be text or jsonl; got {events!r}")

    if not 0 <= threads <= 1024:
        raise ConfigError(f"--threads: must be an integer in [0, 1024]; got {threads}")
    if device is not None:
        _check_devices([device], "--device")
    _check_store_urls(storage, tracking_uri)
    optuna_storage = _existing_storage(storage, results_dir, study)
    import optuna

    try:
        optuna.load_study(study_name=study, storage=optuna_storage)
    except KeyError:
        raise ConfigError(
            f"--study: no study named {study!r} in this storage (see `harness status`)"
        ) from None
    _probe_remote(None, tracking_uri)
    _tracker(tracking_uri, results_dir)  # fails now, not in every trial, if it cannot be opened
    from harness.sweep.worker import WorkerOptions, worker_loop

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
            typer.echo(
                f"{e['cell']} seed={e['seed']}: {e['outcome']} {e.get('reason') or ''}", err=True
            )

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
    typer.echo(f"worker done: {counts}", err=True)


@app.command("status")
@user_errors
def status_cmd(
    study: Annotated[str | None, typer.Argument(help="Study name (omit to list all).")] = None,
    storage: Storage = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Done / running / waiting / failed trials per study."""
    st = _existing_storage(storage, results_dir, study)
    if st is None:
        typer.echo(f"no studies yet (no Optuna storage under {results_dir})", err=True)
        return
    from harness.sweep.display import print_status

    print_status(st, study)


@app.command("report")
@user_errors
def report_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Write results/<study>/report.md (and report.html for a grid) and attach them to the parent
    MLflow run.  Exit code 1 when no run of the study completed: the report is still written and
    says why (each distinct failure reason with its count, also printed on stderr)."""
    import optuna

    from harness.core.configtools import ConfigError, check_name
    from harness.sweep.finish import finish_study
    from harness.sweep.spec import COMMAND_ATTR, load_study_spec

    check_name(study, "study")  # the report goes to RESULTS/<study>/
    _check_store_urls(storage, tracking_uri)
    optuna_storage = _existing_storage(storage, results_dir, study)
    try:
        st = optuna.load_study(study_name=study, storage=optuna_storage)
    except KeyError:
        raise ConfigError(f"study: no study named {study!r} (see `harness status`)") from None
    spec = load_study_spec(st)
    _probe_remote(None, tracking_uri)
    tracker = _tracker(tracking_uri, results_dir)
    finished = finish_study(
        st,
        tracker,
        spec,
        command=st.user_attrs.get(COMMAND_ATTR, _command_line()),
        results_dir=results_dir,
        write_report=True,
        end_parent=False,
    )
    if not finished.completed:
        typer.echo(f"study {study!r}: no run completed", err=True)
        raise typer.Exit(1)


@app.command("export")
@user_errors
def export_cmd(
    file: Annotated[Path, typer.Argument(help="Experiment file.")],
    to: Annotated[str, typer.Option("--to", help="Target framework: trl, verl or areal.")],
    cell: Annotated[
        str | None,
        typer.Option(help="The cell: its label, or KEY=VALUE pairs, e.g. 'eps_clip=0.2 c_clip=3'."),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="The top cell of the finished study of this file.")
    ] = False,
    study_name: Annotated[
        str | None, typer.Option(help="Study name for --best (default: the file's name).")
    ] = None,
    storage: Storage = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Print one cell's settings as TRL GRPOConfig code, verl Hydra overrides or AReaL YAML.
    --best takes a finished study's top cell (a grid) or best trial (a search), with its
    uncertainty as a comment; a study in which no run completed is refused (exit 2).

    The experiment file is validated first, which imports python: task modules (runs their code).
    """
    from harness.config.experiment import load_experiment
    from harness.core.configtools import ConfigError
    from harness.sweep.export import TARGETS, best_to_export, export_cell, resolve_cell
    from harness.sweep.spec import HASH_ATTR, StudySpec, load_study_spec

    if to not in TARGETS:
        raise ConfigError(f"--to must be one of {', '.join(TARGETS)}; got {to!r}")
    if (cell is None) == (not best):
        raise ConfigError("give exactly one of --cell or --best")
    spec = load_experiment(file)
    notes: list[str] = []
    if best:
        import optuna

        _check_store_urls(storage, None)
        name = study_name or spec.name
        if storage is None and not (results_dir / "optuna-journal.log").exists():
            raise ConfigError(f"--best: no study store under {results_dir} (run the sweep first)")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from harness.sweep.storage import make_storage

        try:
            st = optuna.load_study(study_name=name, storage=make_storage(storage, results_dir))
        except KeyError:
            raise ConfigError(f"--best: no study named {name!r} (see `harness status`)") from None
        study_spec = load_study_spec(st)
        label, overrides, notes = best_to_export(study_spec, st)
        now = StudySpec.from_experiment(spec).grid_hash
        if st.user_attrs.get(HASH_ATTR) not in (None, now):
            # As `ablate` refuses a changed grid: say it; export what the study ran.
            changed = (
                f"{file} changed since study {name!r} ran (hash {st.user_attrs[HASH_ATTR]} != "
                f"{now}): these are the settings the study ran, not the file's"
            )
            typer.echo(f"warning: {changed}", err=True)
            notes.append(changed)
    else:
        if spec.search is not None:
            raise ConfigError(
                f"{file}: --cell needs a grid experiment (this one is a search; use --best)"
            )
        assert cell is not None
        label, overrides = resolve_cell(spec, cell)
        study_spec = StudySpec.from_experiment(spec)
    cfg = study_spec.run_config(overrides, seed=None)
    what = "point" if study_spec.kind == "search" else "cell"
    header = [f"harness {what} {label!r} of {file} for {to}", *notes]
    typer.echo(export_cell(cfg, to, header), nl=False)


@app.command("ui")
@user_errors
def ui_cmd(
    start: Annotated[
        bool, typer.Option("--start", help="Start the UIs (default: print the commands).")
    ] = False,
    host: Annotated[
        str,
        typer.Option("--host", help="Interface to bind (127.0.0.1 unless you mean to expose it)."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="MLflow UI port.")] = 5000,
    dashboard_port: Annotated[
        int, typer.Option("--dashboard-port", help="optuna-dashboard port.")
    ] = 8080,
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("results"),
) -> None:
    """Print (or start) the MLflow UI and optuna-dashboard for this project's stores."""
    from harness.sweep.ui import ui

    _check_store_urls(storage, tracking_uri)
    ui(
        start=start,
        host=host,
        port=port,
        dashboard_port=dashboard_port,
        storage=storage,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
    )


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
