"""The source tree itself: no merge left half-done (a conflict marker inside a docstring or a
Markdown page breaks nothing that runs, so nothing else would catch it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)


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
