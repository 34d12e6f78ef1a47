"""Hostile and careless use of a sweep as a whole: grids too big to enumerate, stores on
filesystems that refuse writes, a worker killed by the OOM killer, SIGTERM to the coordinator,
and two coordinators on one study."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def _mount(args: list[str], where: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    where.mkdir(exist_ok=True)
    r = subprocess.run(["mount", *args, str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only mount (a bind mount of itself): root cannot write it either."""
    d = tmp_path / "ro"
    d.mkdir()
    (d / "old.db").write_bytes(b"")  # an existing database file there
    yield from _mount(["--bind", "-o", "ro", str(d)], d)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 200 KiB tmpfs."""
    yield from _mount(["-t", "tmpfs", "-o", "size=200k", "tmpfs"], tmp_path / "tiny")


# -- stores on filesystems that refuse writes ----------------------------------------------------


@pytest.mark.parametrize(
    "where", ["/proc/harness-x.db", "ro/new.db", "ro/old.db"], ids=["proc", "ro-new", "ro-old"]
)
def test_a_tracking_database_that_cannot_be_written_is_one_line(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    if where.startswith("ro/"):
        where = str(request.getfixturevalue("read_only_dir") / where[3:])
    results = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        [
            "ablate",
            str(SMOKE),
            "--results-dir",
            str(results),
            "--tracking-uri",
            f"sqlite:///{where}",
        ],
    )
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert line.startswith(f"error: --tracking-uri: cannot write the SQLite database '{where}'")
    assert "Read-only file system" in line or "No such file" in line, line
    assert not results.exists()  # nothing written


def test_a_results_dir_on_a_read_only_mount_is_one_line(
    tmp_path: Path, read_only_dir: Path
) -> None:
    for results, why in (
        (read_only_dir, "not writable (Read-only file system)"),
        (read_only_dir / "results", "cannot create it (Read-only file system)"),
    ):
        r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--results-dir", str(results)])
        assert r.exit_code == 2, r.output
        assert _one_error_line(r.output) == f"error: results dir {str(results)!r}: {why}"
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["old.db"]


def test_a_results_dir_on_a_tiny_filesystem_is_refused_before_it_is_created(
    tiny_fs: Path,
) -> None:
    results = tiny_fs / "results"
    r = CliRunner().invoke(app, ["ablate", str(SMOKE), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert line == f"error: results dir {str(results)!r}: only 0 MiB free (need at least 50 MiB)"
    assert list(tiny_fs.iterdir()) == []  # not even the directory


# -- grids too big to enumerate -----------------------------------------------------------------


def _grid_file(tmp_path: Path, grid: dict[str, Any], seeds: Any = 2, **extra: Any) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(grid=grid, seeds=seeds, **extra)
    doc.pop("baseline", None)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The size check must come before a single cell is built."""
    import harness.config.experiment as experiment

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the grid was enumerated before its size was checked")

    monkeypatch.setattr(experiment, "_expand_grid", refuse)


def _lr_axis(n: int) -> list[float]:
    return [round(1e-5 * (i + 1), 8) for i in range(n)]


@pytest.mark.parametrize("command", [["ablate", "--dry-run"], ["ablate"]])
def test_a_grid_of_a_million_cells_is_refused_before_it_is_enumerated(
    tmp_path: Path, no_enumeration: None, command: list[str]
) -> None:
    grid = {"optim.lr": _lr_axis(1000), "ppo.gamma": [0.9 + i / 1e4 for i in range(1000)]}
    exp = _grid_file(tmp_path, grid)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, [*command, str(exp), "--results-dir", str(results)])
    assert r.exit_code == 2, r.output
    assert _one_error_line(r.output) == (
        f"error: {exp}: grid: 1000000 cells (1000 x 1000) exceed the limit of 10000; shrink the "
        "grid or raise it with limits: {cells: 1000000} in the file"
    )
    assert not results.exists()


def test_adaptive_seeds_count_their_max_against_the_trial_limit(
    tmp_path: Path, no_enumeration: None
) -> None:
    adaptive = {"min": 3, "max": 500, "batch": 50, "decide": "ranking"}
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(100)}, seeds=adaptive)
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2, r.output
    assert _one_error_line(r.output) == (
        f"error: {exp}: grid: 100 cells x 500 seeds = 50000 trials exceed the limit of 20000; "
        "fewer cells or seeds, or raise it with limits: {trials: 50000} in the file"
    )


def test_the_limits_can_be_raised_in_the_file(tmp_path: Path) -> None:
    from harness.config.experiment import load_experiment

    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"cells": 5})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "6 cells (6) exceed the limit of 5" in r.output, r.output
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"trials": 23})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "= 24 trials exceed the limit of 23" in r.output, r.output
    exp = _grid_file(
        tmp_path, {"optim.lr": _lr_axis(6)}, seeds=4, limits={"cells": 6, "trials": 24}
    )
    assert len(load_experiment(exp).cells) == 6
    exp = _grid_file(tmp_path, {"optim.lr": _lr_axis(6)}, limits={"cells": 0})
    r = CliRunner().invoke(app, ["ablate", "--dry-run", str(exp)])
    assert r.exit_code == 2 and "limits.cells" in _one_error_line(r.output), r.output
