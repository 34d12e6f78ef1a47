"""The source tree itself: no merge left half-done (a conflict marker inside a docstring or a
Markdown page breaks nothing that runs, so nothing else would catch it), and tests/ mirroring
harness/ (a test file's folder says which package it tests)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
# Folders of tests/ that test no package of their own: whole-CLI journeys, data files, the hooks
# a test puts on a subprocess's path, and what the tests share.
SHARED = {"e2e", "fixtures", "hooks", "support"}


def test_no_merge_conflict_markers() -> None:
    found = []
    for folder in ("harness", "tests", "docs", "benchmarks", "tools", "experiments"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml"} and path.is_file():
                for m in MARKER.finditer(path.read_text(encoding="utf-8", errors="replace")):
                    line = path.read_text(errors="replace").count("\n", 0, m.start()) + 1
                    found.append(f"{path.relative_to(ROOT)}:{line}")
    for name in ("README.md", "Makefile", "pyproject.toml", "mkdocs.yml"):
        if MARKER.search((ROOT / name).read_text()):
            found.append(name)
    assert not found, found


def _folders(top: Path) -> list[Path]:
    """The folders under ``top``, without caches (``__pycache__``, ``.pytest_cache``, ...)."""
    found = []
    for p in sorted(top.rglob("*")):
        if p.is_dir() and not any(s.startswith((".", "__")) for s in p.relative_to(top).parts):
            found.append(p)
    return found


def test_tests_mirror_the_packages() -> None:
    """tests/X/Y holds the tests of harness/X/Y: every folder of tests/ (but the shared ones) is
    a package of harness/ and has an ``__init__.py`` (the tests import each other as
    ``tests.X...``), so `pytest tests/X/Y` runs the tests of that package and no other's."""
    tests = ROOT / "tests"
    wrong = []
    for folder in _folders(tests):
        rel = folder.relative_to(tests)
        if rel.parts[0] in SHARED:
            continue
        if not (ROOT / "harness" / rel / "__init__.py").is_file():
            wrong.append(f"tests/{rel.as_posix()}: no package harness/{rel.as_posix()}")
        if not (folder / "__init__.py").is_file():
            wrong.append(f"tests/{rel.as_posix()}: no __init__.py")
    assert not wrong, wrong


def test_sweep_tests_are_in_the_sweeps_rooms() -> None:
    """tests/sweep/ has one folder per room of harness/sweep/ (stores, scheduler, present,
    launching) and no other, so a sweep test sits with the room whose behaviour it tests."""
    rooms = {
        p.name for p in (ROOT / "harness" / "sweep").iterdir() if (p / "__init__.py").is_file()
    }
    folders = {p.name for p in _folders(ROOT / "tests" / "sweep") if p.parent.name == "sweep"}
    assert rooms == {"stores", "scheduler", "present", "launching"}
    assert folders == rooms
