"""Which optional extras this environment has, for tests that walk every shipped file: an
experiment that needs an extra that is not installed is left out of such walks (its own tests
skip with the reason), so a missing extra never breaks the rest."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def engine_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def usable_here(path: Path) -> bool:
    """False for an experiment file that samples with the inference engine when it is absent."""
    return engine_installed() or "vllm" not in path.read_text()
