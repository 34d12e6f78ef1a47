"""`--launcher ray` end to end on a private loopback Ray head (see tests/support/ray_head.py), and its
one-line refusals.  The launcher contract itself runs in
tests/sweep/launching/test_launcher_contract.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.sweep.stores.storage import make_storage
from tests.support.studies import open_test_study

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def _exp(tmp_path: Path, name: str, steps: int) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name=name, steps=steps)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _pairs(storage: str, name: str, results: Path) -> Counter[tuple[str, int, str]]:
    study = optuna.load_study(study_name=name, storage=make_storage(storage, results))
    return Counter(
        (t.user_attrs["cell"], int(t.user_attrs["seed"]), t.state.name) for t in study.trials
    )


@pytest.mark.slow
def test_ray_sweep_on_postgresql_runs_each_pair_exactly_once(
    tmp_path: Path, pg: Any, ray_head: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    storage = pg.create_database(f"rayopt_{tag}")
    tracking = pg.create_database(f"raymlf_{tag}")
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        [
            "ablate",
            str(_exp(tmp_path, "raysweep", steps=2)),
            "--launcher",
            "ray",
            "--ray-address",
            ray_head,
            "--workers",
            "2",
            "--storage",
            storage,
            "--tracking-uri",
            tracking,
            "--results-dir",
            str(results),
            "--no-report",
        ],
    )
    assert r.exit_code == 0, r.output
    pairs = _pairs(storage, "raysweep", results)
    want = {(c, s, "COMPLETE") for c in ("c_clip=none", "c_clip=3") for s in (0, 1)}
    assert set(pairs) == want and set(pairs.values()) == {1}, pairs


@pytest.mark.slow  # long multi-process run; CI's slow suite runs it
def test_killed_ray_worker_trial_is_recovered_exactly_once(
    tmp_path: Path, ray_head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.sweep.launching.launch import make_launcher, run_workers
    from harness.sweep.launching.worker import WorkerOptions
    from harness.tracking import make_tracker

    monkeypatch.setenv("HARNESS_HEARTBEAT_S", "1")  # the study's clock: stale after 4 s
    results = tmp_path / "results"
    tracker = make_tracker(None, results)
    study, spec = open_test_study(_exp(tmp_path, "raykill", steps=40), results, tracker)
    killed: list[int] = []
    said: list[str] = []

    def on_event(e: dict[str, Any]) -> None:
        if e["event"] == "start" and not killed and e["worker"] == 0:
            killed.append(int(e["pid"]))
            os.kill(killed[0], signal.SIGKILL)  # the Ray worker process, mid-trial

    run_workers(
        make_launcher("ray", ray_address=ray_head),
        2,
        WorkerOptions(study=study.study_name, storage=None, results_dir=results),
        total=4,
        done_before=0,
        on_event=on_event,
        show_progress=False,
        say=said.append,
    )
    assert killed
    died = [ln for ln in said if f"(pid {killed[0]}) died while running trial " in ln]
    assert len(died) == 1 and "restarted as pid" in died[0], said
    pairs = _pairs(None, "raykill", results)  # type: ignore[arg-type]
    complete = [
        (c, s) for (c, s, state), n in pairs.items() if state == "COMPLETE" for _ in range(n)
    ]
    assert sorted(complete) == sorted(
        (c, s) for c in ("c_clip=none", "c_clip=3") for s in (0, 1)
    ), pairs
    assert pairs and any(state == "FAIL" for (_, _, state) in pairs)  # the dead worker's trial
    assert not any(state == "RUNNING" for (_, _, state) in pairs)


def test_non_shareable_storage_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        [
            "ablate",
            str(SMOKE),
            "--launcher",
            "ray",
            "--ray-address",
            "10.255.255.1:6379",
            "--results-dir",
            str(results),
        ],
    )
    assert r.exit_code == 2, r.output
    assert "--shared-fs" in r.output and "Traceback" not in r.output
    assert not results.exists()


def test_missing_ray_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app, ["ablate", str(SMOKE), "--launcher", "ray", "--results-dir", str(results)]
    )
    assert r.exit_code == 2, r.output
    assert "pip install 'harness[ray]'" in r.output and "Traceback" not in r.output
    assert not results.exists()


def test_ray_flags_need_the_ray_launcher(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--gpus-per-worker", "1"])
    assert r.exit_code == 2 and "need --launcher ray" in r.output


def test_the_launch_checks_harness_run_uses_load_neither_optuna_nor_the_worker() -> None:
    """`harness run` checks its devices and store URLs with ``launch_checks`` and
    ``stores/opening.py``; the Ray checks among them live apart from the Ray launcher, whose
    worker loop imports Optuna at its top."""
    code = (
        "import sys, harness.sweep.launching.launch_checks, harness.sweep.stores.opening; "
        "bad = {'optuna', 'harness.sweep.launching.worker'} & set(sys.modules); "
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
