"""Where a run came from: git commit and dirty flag, package versions (logged as tags)."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def provenance_tags() -> dict[str, str]:
    tags: dict[str, str] = {}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if commit.returncode == 0:
            tags["git.commit"] = commit.stdout.strip()
            tags["git.dirty"] = str(bool(dirty.stdout.strip())).lower()
    except (OSError, subprocess.SubprocessError):
        pass
    for pkg in ("harness", "torch", "transformers", "optuna", "mlflow"):
        try:
            tags[f"version.{pkg}"] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return tags
