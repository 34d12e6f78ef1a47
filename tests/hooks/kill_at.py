"""The test side of the faults ``sitecustomize.py`` injects: run a command in its own process
group until a hooked process writes its pid to a marker file (it then hangs in the state under
test), and SIGKILL the whole group there, as a power cut would."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


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
