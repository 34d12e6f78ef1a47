"""The test side of the faults ``sitecustomize.py`` injects: run a command in its own process
group until a hooked process writes its pid to a marker file (it then hangs in the state under
test), and SIGKILL the whole group there, as a power cut would; or SIGTERM the command there,
as ``kill`` or a scheduler would, and release the hold once the stop was asked."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def kill_group_at_marker(
    cmd: list[str], env: dict[str, str], marker: Path, what: str, cwd: Path | None = None
) -> str:
    """Start ``cmd``; once ``marker`` names a pid, SIGKILL its process group; return that pid.
    Fails with the command's output if it ends first, and after 600 s naming ``what``."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (marker.exists() and marker.read_text()):
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise AssertionError(f"the command ended before {what}:\n{out[-3000:]}")
            assert time.monotonic() < deadline, f"waited 600 s for {what}"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group, the hooked process included
        proc.wait()
    return marker.read_text()


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (gone, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_worker_at_marker(
    cmd: list[str], env: dict[str, str], marker: Path, what: str, cwd: Path | None = None
) -> int:
    """:func:`kill_group_at_marker`, then wait (60 s at most: it was killed already) until the
    hooked process that wrote the marker is gone; return its pid."""
    worker = int(kill_group_at_marker(cmd, env, marker, what, cwd))
    end = time.monotonic() + 60
    while not gone(worker):
        assert time.monotonic() < end, f"worker {worker} still alive 60 s after SIGKILL"
        time.sleep(0.05)
    return worker


def rerun_to_the_end(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    """Run ``cmd`` again (600 s at most), as a user would after the cut: it must exit 0 without a
    traceback."""
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def term_at_marker(
    cmd: list[str],
    env: dict[str, str],
    marker: Path,
    what: str,
    *,
    while_held: Callable[[], object] = lambda: None,
    cwd: Path | None = None,
) -> tuple[int, str]:
    """Start ``cmd`` (a sweep: ``env`` holds its worker at ``HARNESS_TEST_HOLD_SECOND_RUN``);
    once ``marker`` names a pid, call ``while_held``, SIGTERM the command's own process, and
    once it says it is stopping the workers, release the hold; return (its exit status, its
    output).  Each wait is on a state (600 s at most, naming ``what``); the group is SIGKILLed
    if the command is still running when this returns."""
    release = marker.with_name(marker.name + ".release")
    env = {**env, "HARNESS_TEST_HOLD_RELEASE": str(release)}
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(
        target=lambda: out.extend(ln.decode(errors="replace") for ln in proc.stdout), daemon=True
    )
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not (marker.exists() and marker.read_text()):
            assert proc.poll() is None, "".join(out)[-3000:]
            assert time.monotonic() < deadline, f"waited 600 s for {what}"
            time.sleep(0.05)
        while_held()
        proc.send_signal(signal.SIGTERM)  # the coordinator only, as `kill` sends it
        while not any("stopping the workers" in ln for ln in out):  # the stop was asked
            assert proc.poll() is None, "".join(out)[-3000:]
            assert time.monotonic() < deadline, "the coordinator never said it was stopping"
            time.sleep(0.05)
        release.write_text("")
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=60)
    return code, "".join(out)
