"""`harness ui --start` serves the MLflow UI on 127.0.0.1; the parent run and its children are
readable through MLflow's REST API there."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_ui_prints_commands_bound_to_loopback(tmp_path):
    r = CliRunner().invoke(app, ["ui", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0
    assert "--host 127.0.0.1" in r.output and "--workers 1" in r.output


def test_ui_start_serves_parent_and_children(tmp_path):
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        [
            "ablate",
            "experiments/smoke.yaml",
            "--workers",
            "2",
            "--results-dir",
            str(results),
            "--no-report",
        ],
    )
    assert r.exit_code == 0, r.output
    port, dash = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "ui",
            "--start",
            "--port",
            str(port),
            "--dashboard-port",
            str(dash),
            "--results-dir",
            str(results),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise AssertionError(
                        proc.stdout.read().decode()[-3000:]
                        if proc.poll() is not None
                        else "UI did not start"
                    ) from None
                time.sleep(0.5)
        exp = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=smoke")[
            "experiment"
        ]
        runs = get(
            f"{base}/api/2.0/mlflow/runs/search",
            {"experiment_ids": [exp["experiment_id"]], "max_results": 100},
        )["runs"]
        tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
        parents = [t for t in tags if t.get("harness.role") == "parent"]
        children = [t for t in tags if t.get("harness.role") == "child"]
        assert len(parents) == 1 and len(children) == 4
        parent_id = [
            run["info"]["run_id"]
            for run, t in zip(runs, tags, strict=False)
            if t.get("harness.role") == "parent"
        ][0]
        assert all(t["mlflow.parentRunId"] == parent_id for t in children)
        assert {t["ablation.cell"] for t in children} == {"c_clip=none", "c_clip=3"}
        # bound to loopback only: the port is not open on another local address
        with socket.socket() as s:
            s.settimeout(1)
            other = socket.gethostbyname(socket.gethostname())
            if other != "127.0.0.1" and not other.startswith("127."):
                assert s.connect_ex((other, port)) != 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
