"""The body of ``harness run``: one PPO run, logged to a tracker, with live progress and a final
summary (``harness fields`` has its own module: listing fields loads no training stack)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import harness.run.trainers  # noqa: F401 - each trainer's checks, loaded before a config is read
from harness import tracking
from harness.cli.options import fail
from harness.config import load_run_config
from harness.sweep.launching.launch_checks import check_devices
from harness.sweep.stores.opening import check_store_urls
from harness.tasks.base import RewardError


def run_one(
    config: Path | None,
    sets: list[str],
    *,
    experiment: str,
    run_name: str | None,
    tracking_uri: str | None,
    results_dir: Path,
) -> None:
    """Train one PPO policy, log it to MLflow and print a final summary; exit code 1 when the
    run did not complete."""
    cfg = load_run_config(config, sets)
    check_devices([cfg.device], "device")
    check_store_urls(None, tracking_uri)
    tracking.probe_tracking_uri(tracking_uri)
    tracker = tracking.open_tracker(tracking_uri, results_dir)
    # The training stack loads once the input is valid, so a bad --set answers in seconds,
    # before transformers is imported.
    from harness.cli.console import run_with_progress  # noqa: PLC0415 - loads the training stack: only for valid input
    from harness.run.tracked import Terminated, interrupt_reason, signals_interrupt  # noqa: PLC0415 - loads the training stack: only for valid input

    try:
        # SIGTERM/SIGHUP as Ctrl-C: the run is closed KILLED with the reason, not left RUNNING;
        # a signal whose exception Python dropped still stops it before the next step.
        with signals_interrupt() as stop:
            result, rid = run_with_progress(
                cfg,
                tracker,
                experiment=experiment,
                run_name=run_name or f"{cfg.task}-seed{cfg.seed}",
                results_dir=results_dir,
                should_stop=stop.check,
            )
    except KeyboardInterrupt as err:
        # Closed KILLED with this reason (harness.run.tracked); the shell's code for the signal.
        code = 128 + (err.signum if isinstance(err, Terminated) else signal.SIGINT)
        fail(f"run KILLED: {interrupt_reason(err)}", code=code)
    except SystemExit as err:  # library code that exits mid-run: closed FAILED with the reason
        fail(f"run FAILED: SystemExit: {err.code!r} (sys.exit during the run)", code=1)
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
