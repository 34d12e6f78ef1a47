"""A filesystem mounted for one test (root only; the test is skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted(args: list[str], where: Path) -> Iterator[Path]:
    """``mount ARGS WHERE`` for the test (a fixture yields from it), lazily unmounted after;
    the test is skipped when this process is not root or the mount fails."""
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
