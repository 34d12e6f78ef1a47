"""`harness ui --start` serves the MLflow UI and optuna-dashboard on 127.0.0.1: the parent run and
its children are readable through MLflow's REST API, the sweep left what a person comparing
cells needs (saved view, summaries as single values, ranking on the parent, trial params), and
the servers keep secrets out of argv and never outlive `harness ui`."""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.ui_servers import (
    ROOT,
    Served,
    alive,
    cmdline,
    descendants,
    get,
    start_ui,
    stop_ui,
)


def test_ui_prints_commands_bound_to_loopback(tmp_path):
    r = CliRunner().invoke(app, ["ui", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0
    assert "--host 127.0.0.1" in r.output and "--workers 1" in r.output
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in r.output
    assert "workflowType=machine_learning" in r.output


def test_ui_start_serves_parent_and_children(served: Served):
    base = served.mlflow
    assert "this can take a minute" in served.output()
    exp = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=smoke")["experiment"]
    runs = get(
        f"{base}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [exp["experiment_id"]], "max_results": 100},
    )["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
    parents = [r for r, t in zip(runs, tags, strict=True) if t.get("harness.role") == "parent"]
    children = [t for t in tags if t.get("harness.role") == "child"]
    assert len(parents) == 1 and len(children) == 4
    parent_id = parents[0]["info"]["run_id"]
    assert all(t["mlflow.parentRunId"] == parent_id for t in children)
    assert {t["ablation.cell"] for t in children} == {"c_clip=none", "c_clip=3"}
    # bound to loopback only: the port is not open on another local address
    with socket.socket() as s:
        s.settimeout(1)
        other = socket.gethostbyname(socket.gethostname())
        if other != "127.0.0.1" and not other.startswith("127."):
            assert s.connect_ex((other, int(base.rsplit(":", 1)[1]))) != 0
    # the printed URL lands on the saved, grouped runs view of the experiment
    url = f"{base}/#/experiments/{exp['experiment_id']}/runs?workflowType=machine_learning"
    assert f"{url}&viewStateShareKey=harness-cells   (smoke)" in served.output()


def test_ui_start_runs_two_mlflow_processes(served: Served):
    """MLflow with job execution off: the CLI and one uvicorn worker (13 processes before)."""
    mlflow = [
        p
        for p in descendants(served.proc.pid)
        if "mlflow" in cmdline(p) and "harness.sweep.present.ui" not in cmdline(p)
    ]
    assert len(mlflow) == 2, [cmdline(p) for p in mlflow]


def test_sweep_leaves_a_comparable_experiment_in_mlflow(served: Served):
    base = served.mlflow
    exp = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=smoke")["experiment"]
    etags = {t["key"]: t["value"] for t in exp["tags"]}
    assert etags["mlflow.note.content"].startswith("Smoke test of the sweep machinery")
    assert etags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(etags["mlflow.sharedViewState.harness-cells"])
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "ablation.cell"}]
    assert view["selectedColumns"][0] == "metrics.`final/reward`"
    runs = get(
        f"{base}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [exp["experiment_id"]], "max_results": 100},
    )["runs"]
    for run in runs:
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        metrics = {m["key"]: m for m in run["data"].get("metrics", [])}
        if tags["harness.role"] == "child":
            # run-level summaries are single values at step 0, not a dot at the last step
            assert metrics["final/reward"]["step"] == 0
            assert metrics["final/steps_done"]["value"] == 3.0
        else:
            ranks = {k: m["value"] for k, m in metrics.items() if k.endswith("/rank")}
            assert sorted(ranks.values()) == [1.0, 2.0]
            assert set(ranks) == {"cell/c_clip:none/rank", "cell/c_clip:3/rank"}
            low = metrics["cell/c_clip:3/iqm_ci_low"]["value"]
            high = metrics["cell/c_clip:3/iqm_ci_high"]["value"]
            assert low <= metrics["cell/c_clip:3/iqm"]["value"] <= high
            assert "| rank | cell | IQM | 95 % CI | runs used |" in tags["mlflow.note.content"]
            arts = get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run['info']['run_id']}")
            assert [f["path"] for f in arts["files"]] == ["experiment.yaml", "report"]


def test_optuna_dashboard_shows_cell_params_and_named_metric(served: Served):
    studies = get(f"{served.dashboard}/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == "smoke")
    detail = get(f"{served.dashboard}/api/studies/{study_id}")
    assert detail["objective_names"] == ["final/reward"]
    trials = detail["trials"]
    assert len(trials) == 4
    seen = set()
    for t in trials:
        params = {p["name"]: p["param_external_value"] for p in t["params"]}
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert set(params) == {"ppo.c_clip", "seed"}
        assert int(params["seed"]) == int(attrs["seed"])
        assert "summary" not in attrs and "final/reward" in attrs  # one attribute per summary
        seen.add((params["ppo.c_clip"], int(params["seed"])))
    assert seen == {("none", 0), ("none", 1), ("3.0", 0), ("3.0", 1)}
    # importance used to fail with HTTP 500 (ZeroDivisionError) on trials without params
    importances = get(f"{served.dashboard}/api/studies/{study_id}/param_importances")
    names = {p["name"] for p in importances["param_importances"][0]}
    assert names == {"ppo.c_clip", "seed"}


@pytest.mark.slow
def test_ui_with_postgresql_stores_keeps_the_password_out_of_argv_and_stops_on_sigterm(
    pg, tmp_path
):
    """PostgreSQL storage works (psycopg2 driver), no process shows
    the password in its argv, and SIGTERM to `harness ui` stops every server process."""
    import optuna

    from harness.core.db import sqlalchemy_url

    storage_url = pg.create_database("ui_optuna")
    tracking_url = pg.create_database("ui_mlflow")
    optuna.create_study(study_name="pg-study", storage=sqlalchemy_url(storage_url))
    # The stores come through harness's own environment variables, so that no process at all
    # (harness ui included) shows the password; the servers get it through theirs.
    served = start_ui(
        tmp_path / "results",
        env={"HARNESS_STORAGE": storage_url, "HARNESS_TRACKING_URI": tracking_url},
    )
    try:
        studies = get(f"{served.dashboard}/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["pg-study"]
        assert get(f"{served.mlflow}/api/2.0/mlflow/experiments/search", {"max_results": 5})
        procs = descendants(served.proc.pid)
        assert len(procs) >= 3
        for pid in [served.proc.pid, *procs]:
            assert pg.password not in cmdline(pid), cmdline(pid)
        assert pg.password not in served.output()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=30) is not None
        deadline = time.time() + 10
        while any(alive(p) for p in procs) and time.time() < deadline:
            time.sleep(0.2)
        assert not [cmdline(p) for p in procs if alive(p)]
    finally:
        stop_ui(served)


class _AuthServer(BaseHTTPRequestHandler):
    """An MLflow-like server that wants HTTP basic auth for its API, not for /health."""

    expected = "Basic " + base64.b64encode(b"ana:pa55").decode()
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        auth = self.headers.get("Authorization", "")
        if self.path != "/health":
            type(self).seen.append(auth)
        if self.path == "/health" or auth == self.expected:
            body = json.dumps({"experiments": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 - MLflow's client searches with POST
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_tracking_credentials_come_from_mlflow_environment_variables(tmp_path, monkeypatch):
    """user:pass@ in an http tracking URI is refused with one line naming
    MLflow's variables (and nothing written); the variables themselves are used and checked."""
    from harness.tracking import make_tracker

    results = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "ablate", "experiments/smoke.yaml"]
        + ["--tracking-uri", "http://ana:pa55@127.0.0.1:1", "--results-dir", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "pa55" not in r.stderr + r.stdout
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in r.stderr
    assert not results.exists()

    server = ThreadingHTTPServer(("127.0.0.1", 0), _AuthServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ana")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(ValueError, match=r"HTTP 401: credentials were refused; set MLFLOW"):
            make_tracker(uri, results, retries=1)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pa55")
        make_tracker(uri, results, retries=1)  # the probe and MLflow's own client log in
        assert _AuthServer.seen[-1] == _AuthServer.expected
        assert len(_AuthServer.seen) >= 3
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        with pytest.raises(ValueError, match=re.escape("credentials are required")):
            make_tracker(uri, results, retries=1)
    finally:
        server.shutdown()
