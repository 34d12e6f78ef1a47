"""What the commands share: their common options, and how a command turns bad input into one
line on stderr with exit code 2 (a full disk, a store outage or a store removed: one line, exit
code 1)."""

from __future__ import annotations

import functools
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from harness.core.configtools import ConfigError
from harness.core.db import StorageUnavailable
from harness.core.fsutil import disk_full_message, is_disk_full, store_removed_reason
from harness.core.redact import redact_text

F = TypeVar("F", bound=Callable[..., Any])

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
Storage = Annotated[
    str | None,
    typer.Option(
        "--storage",
        envvar="HARNESS_STORAGE",
        help="Optuna storage: journal file under RESULTS (default), sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB. "
        "Also read from $HARNESS_STORAGE, which keeps a password out of the process list.",
    ),
]

RESUME_HINT = "free some space and run the same command again (a sweep resumes where it stopped)"


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def say(message: str) -> None:
    """A line for the user on stderr (stdout is for what a command prints as its result)."""
    typer.echo(message, err=True)


def user_errors(fn: F) -> F:
    """Bad input → ``error: <one line>`` on stderr, exit code 2, no traceback.  A full disk
    (any write of any store) → ``error: disk full (...)`` and how to go on, exit code 1; a store
    removed while the command ran → ``error: the directory ... was removed during the run ...``,
    exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            fail(str(err).splitlines()[0])
        except StorageUnavailable as err:  # an outage past the retry budget: not bad input
            fail(str(err).splitlines()[0], code=1)
        except typer.Exit:
            raise  # already said what it had to (even while handling a full disk)
        except Exception as err:
            removed = store_removed_reason(err)
            if removed is not None:  # nothing more can be recorded: no hint to resume
                fail(removed, code=1)
            if not is_disk_full(err):
                raise
            fail(f"{disk_full_message(err)}; {RESUME_HINT}", code=1)

    return wrapper  # type: ignore[return-value]


def command_line() -> str:
    """This command line as typed, with any password redacted (recorded on the study)."""
    return redact_text("harness " + " ".join(shlex.quote(a) for a in sys.argv[1:]), [])


_process_runs_the_command = False  # set by the app as the console script runs it


def mark_command_process() -> None:
    """This process was started to run one harness command (the console script or ``python -m
    harness``), not a test's ``CliRunner`` inside a process that did other things first."""
    global _process_runs_the_command
    _process_runs_the_command = True


def startup_s() -> float:
    """Seconds this process spent before the command's body began: the interpreter's start and
    the imports, when the process was started for the command (0 otherwise: its age says
    nothing about the command)."""
    if not _process_runs_the_command:
        return 0.0
    import psutil  # noqa: PLC0415 - a banned-at-top library, loaded where used

    return max(0.0, time.time() - psutil.Process().create_time())
