"""The ``harness`` command line: the Typer app, its commands and ``main``.  Thin: a group's module
(run, sweep, report, export, ui) declares its commands' options and help, and each command's body
is one import of ``harness.cli.commands.<group>`` (which imports the rest of the harness at its
top) when the command runs, so that ``harness --help`` answers without torch, MLflow or Optuna;
bad input is one line on stderr and exit code 2 (``harness.cli.options.user_errors``)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperGroup

from harness.cli.export import export_cmd
from harness.cli.options import mark_command_process
from harness.cli.report import report_cmd
from harness.cli.run import fields_cmd, run_cmd
from harness.cli.sweep import ablate_cmd, search_cmd, status_cmd, worker_cmd
from harness.cli.ui import ui_cmd
from harness.core.exiting import exit_despite_threads, exit_status
from harness.core.fsutil import restrict_umask
from harness.core.perf import tune_malloc

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


class _ExitingTyper(typer.Typer):
    """The app as the ``harness`` command runs it (the console script, ``python -m harness``):
    once the command is done the process ends, whatever threads user code left running
    (``harness.core.exiting``).  ``CliRunner`` calls the click command, not this, so a test's
    process is never ended here."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mark_command_process()  # the dry run's estimate counts this process's own start
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as done:
            code, text = exit_status(done.code)

            def say_why() -> None:  # what Python prints for sys.exit("message")
                if text is not None:
                    print(text, file=sys.stderr)

            exit_despite_threads(code, before_exit=say_why)
            raise
        except BaseException:
            exit_despite_threads(1, before_exit=traceback.print_exc)
            raise


app = _ExitingTyper(
    cls=_OneLineUsageErrors,
    help="Ablation harness for PPO fine-tuning of language models: which clipping and "
    "normalization settings keep a PPO run stable?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Ablation harness for PPO fine-tuning of language models."""
    restrict_umask()  # nothing the harness writes is group/world-writable, whatever the umask
    tune_malloc()
    # Library chatter (MLflow's schema migrations, Optuna's "study created") is not for users.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("mlflow", "alembic", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)


# The order here is the order of `harness --help`.
app.command("run")(run_cmd)
app.command("fields")(fields_cmd)
app.command("ablate")(ablate_cmd)
app.command("search")(search_cmd)
app.command("worker")(worker_cmd)
app.command("status")(status_cmd)
app.command("report")(report_cmd)
app.command("export")(export_cmd)
app.command("ui")(ui_cmd)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
