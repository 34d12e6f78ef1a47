"""`harness ui --start` as a test drives it: start it in the background, read what it serves,
and kill it with every process below it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.pg import free_port

ROOT = Path(__file__).resolve().parents[2]


def get(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    # A bound against a hang only: MLflow's first answers take seconds under load.
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Served:
    proc: subprocess.Popen
    mlflow: str
    dashboard: str
    lines: list[str]
    results: Path

    def output(self) -> str:
        return "\n".join(self.lines)


def start_ui(
    results: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 900
) -> Served:
    """`harness ui --start` in the background; returns once both servers answer.

    ``timeout`` only stops a hang: `harness ui` itself waits up to its START_TIMEOUT_S for each
    server in turn, and on a loaded 2-core machine MLflow's start alone can take minutes."""
    port, dash = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "ui", "--start", "--port", str(port)]
        + ["--dashboard-port", str(dash), "--results-dir", str(results), *extra],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
    reader.daemon = True
    reader.start()
    served = Served(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dash}", lines, results)
    deadline = time.time() + timeout
    while not any("Ctrl-C stops both" in line for line in lines):
        if proc.poll() is not None or time.time() > deadline:
            stop_ui(served)
            raise AssertionError("harness ui did not start:\n" + served.output()[-3000:])
        time.sleep(0.5)
    return served


def stop_ui(served: Served) -> None:
    for pid in [served.proc.pid, *descendants(served.proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    served.proc.wait(timeout=10)
