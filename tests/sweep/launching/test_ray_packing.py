"""`--launcher ray` with LoRA packing and with per-worker resources, on a private Ray.

* `--cells-per-worker 2` on a private loopback Ray head (tests/support/ray_head.py): a 2-cell x
  2-seed LoRA grid on the tiny model runs in Ray tasks, each (cell, seed) COMPLETE exactly once,
  and each seed's two runs trained in one pack (their ``harness.pack`` tag names both trials).
* `--gpus-per-worker` / `--cpus-per-worker` that no node of the cluster can give one worker: one
  line naming the flag, what was asked and what the cluster has, exit 2, nothing written under
  --results-dir and no Ray left running (Ray would keep such tasks pending for ever).  Against
  the Ray started here (no --ray-address: what Ray detects on this machine counts) and against
  a private head; the rule itself on made-up clusters.
* The grid's ``limits:`` and the workers x K bound refuse a Ray sweep as they refuse a local
  one, before Ray is started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.cli import app
from harness.core.configtools import ConfigError
from harness.sweep.launching.launchers.ray_checks import check_placement
from tests.support.packing import CELLS, assert_one_pack_per_seed, lora_grid


def _ablate_on_ray(exp: Path, results: Path, *flags: str) -> Result:
    """``harness ablate EXP --launcher ray FLAGS --results-dir RESULTS``, in this process."""
    argv = ["ablate", str(exp), "--launcher", "ray", *flags, "--results-dir", str(results)]
    return CliRunner().invoke(app, argv)


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def _ray_is_up() -> bool:
    ray = pytest.importorskip("ray")
    return bool(ray.is_initialized())


# -- packing on Ray ----------------------------------------------------------------------------


@pytest.mark.slow  # 4 LoRA runs in Ray tasks: about 2 min on a loaded 2-core machine
def test_a_packed_grid_runs_on_ray_each_cell_seed_once_one_pack_per_seed(
    tmp_path: Path, ray_head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("peft")
    from harness.sweep.launching.launchers import ray_launcher

    started: list[Any] = []
    seen: list[dict[str, Any]] = []
    start, events = ray_launcher.RayLauncher.start, ray_launcher.RayLauncher.events

    def spy_start(self: Any, n: int, opts: Any, resources: Any) -> None:
        started.append((n, opts.cells_per_worker, resources.cpus, resources.gpus))
        start(self, n, opts, resources)

    def spy_events(self: Any, timeout: float) -> list[dict[str, Any]]:
        out = events(self, timeout)
        seen.extend(out)
        return out

    monkeypatch.setattr(ray_launcher.RayLauncher, "start", spy_start)
    monkeypatch.setattr(ray_launcher.RayLauncher, "events", spy_events)
    results = tmp_path / "results"
    # One worker: the packs are then fixed (seed 0's two trials, then seed 1's); two workers
    # could each claim one trial of a seed before either claimed its packmate.
    flags = ["--ray-address", ray_head, "--workers", "1", "--cells-per-worker", "2", "--no-report"]
    # --shared-fs: the head is this machine, the journal and MLflow files are shared.
    r = _ablate_on_ray(lora_grid(tmp_path, "raypack", seeds=2), results, *flags, "--shared-fs")
    assert r.exit_code == 0, r.output
    assert started == [(1, 2, 1.0, 0.0)]  # the Ray launcher ran the workers, K travelled
    starts = [e for e in seen if e["event"] == "start"]
    assert len(starts) == 4 and all(e["pid"] != os.getpid() for e in starts), starts

    # Each (cell, seed) exactly once, and each seed's two runs trained in one pack.
    number, _, _ = assert_one_pack_per_seed(results, "raypack")
    # Both trials of a pack started before either finished: they trained together.
    order = [(e["event"], e["trial"]) for e in seen if e["event"] in ("start", "done")]
    for seed in (0, 1):
        pack = {number[(c, seed)] for c in CELLS}
        first_done = min(i for i, (ev, t) in enumerate(order) if ev == "done" and t in pack)
        assert {t for ev, t in order[:first_done] if ev == "start"} >= pack, order


# -- a worker no node can hold -----------------------------------------------------------------


@pytest.mark.slow  # starts a Ray on this machine (about 10-30 s)
def test_gpus_per_worker_on_a_ray_without_gpus_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --ray-address: the Ray started here counts what it detects on this machine, where
    no GPU is visible (CUDA_VISIBLE_DEVICES empty, so also on a machine with GPUs)."""
    if _ray_is_up():
        pytest.skip("a Ray is already initialized in this process")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no per-user token file shared with others
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    results = tmp_path / "results"
    r = _ablate_on_ray(lora_grid(tmp_path, "raygpu"), results, "--gpus-per-worker", "1")
    assert r.exit_code == 2, r.output
    assert _error_lines(r.output) == [
        "error: --gpus-per-worker: 1 asked per worker, but no node of the Ray cluster has a GPU "
        "(nodes: 1, GPUs: 0)"
    ], r.output
    assert "Traceback" not in r.output
    assert not results.exists()
    assert not _ray_is_up()  # the Ray started for the check was stopped


@pytest.mark.slow  # joins the session's private Ray head
@pytest.mark.parametrize(
    ("flags", "want"),
    [
        (
            ["--gpus-per-worker", "0.5"],
            "--gpus-per-worker: 0.5 asked per worker, but no node of the Ray cluster has a GPU "
            "(nodes: 1, GPUs: 0)",
        ),
        (
            ["--cpus-per-worker", "3"],
            "--cpus-per-worker: 3 asked per worker, but no node of the Ray cluster has that many "
            "(at most 2 on one node; nodes: 1, CPUs: 2)",
        ),
    ],
)
def test_a_worker_the_private_head_cannot_hold_is_one_line_and_writes_nothing(
    tmp_path: Path, ray_head: str, flags: list[str], want: str
) -> None:
    results = tmp_path / "results"
    r = _ablate_on_ray(
        lora_grid(tmp_path, "rayfit"), results, "--ray-address", ray_head, "--shared-fs", *flags
    )
    assert r.exit_code == 2, r.output
    assert _error_lines(r.output) == [f"error: {want}"], r.output
    assert "Traceback" not in r.output
    assert not results.exists()
    assert not _ray_is_up()


def _node(gpus: float, cpus: float, alive: bool = True) -> dict[str, Any]:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"Alive": alive, "Resources": resources}


def test_placement_is_judged_per_node_on_live_nodes() -> None:
    eight = [_node(8, 96), _node(0, 16)]
    check_placement(eight, 1, 1)  # one GPU of the 8-GPU node per worker: 8 workers at once
    check_placement(eight, 8, 96)
    check_placement([_node(0, 2)], 0, 0)  # nothing asked: nothing to hold
    with pytest.raises(ConfigError) as err:
        check_placement([_node(2, 8), _node(2, 8)], 4, 1)  # 4 GPUs in all, but 2 per node
    assert str(err.value) == (
        "--gpus-per-worker: 4 asked per worker, but no node of the Ray cluster has that many "
        "(at most 2 on one node; nodes: 2, GPUs: 4)"
    )
    with pytest.raises(ConfigError) as err:  # a dead node's GPUs are not there
        check_placement([_node(0, 4), _node(8, 96, alive=False)], 1, 1)
    assert str(err.value) == (
        "--gpus-per-worker: 1 asked per worker, but no node of the Ray cluster has a GPU "
        "(nodes: 1, GPUs: 0)"
    )
    with pytest.raises(ConfigError) as err:  # GPUs on one node, the CPUs on another
        check_placement([_node(8, 2), _node(0, 64)], 1, 4)
    assert str(err.value) == (
        "--cpus-per-worker: 4 asked per worker with --gpus-per-worker 1, but no node of the Ray "
        "cluster has both (GPUs/CPUs of its 2 nodes: 8/2, 0/64)"
    )


# -- the grid's limits, the same under Ray ---------------------------------------------------


@pytest.mark.parametrize(
    ("over", "workers", "want"),
    [
        (
            {"limits": {"cells": 1}},
            "2",
            "grid: 2 cells (2) exceed the limit of 1; shrink the grid or raise it with "
            "limits: {cells: 2} in the file",
        ),
        (
            {"seeds": 2, "limits": {"trials": 3}},
            "2",
            "grid: 2 cells x 2 seeds = 4 trials exceed the limit of 3; fewer cells or seeds, "
            "or raise it with limits: {trials: 4} in the file",
        ),
        (
            {},
            "129",
            "--cells-per-worker: 129 workers x 2 cells per worker = 258 trials at once; "
            "at most 256",
        ),
    ],
)
def test_limits_refuse_a_packed_ray_sweep_as_a_local_one_before_ray_starts(
    tmp_path: Path, over: dict[str, Any], workers: str, want: str
) -> None:
    exp = lora_grid(tmp_path, "raylimits", **over)
    outputs = {}
    for launcher in (["--launcher", "local"], ["--launcher", "ray", "--shared-fs"]):
        results = tmp_path / f"results-{launcher[1]}"
        argv = ["ablate", str(exp), *launcher, "--workers", workers, "--cells-per-worker", "2"]
        r = CliRunner().invoke(app, [*argv, "--results-dir", str(results)])
        assert r.exit_code == 2, r.output
        assert "Traceback" not in r.output and not results.exists()
        outputs[launcher[1]] = _error_lines(r.output)
    assert outputs["ray"] == outputs["local"]
    assert len(outputs["ray"]) == 1 and outputs["ray"][0].endswith(want), outputs
    assert not _ray_is_up()
