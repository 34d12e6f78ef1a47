"""Where a run came from: git commit and dirty flag, package versions, and the machine (logged as
tags).  The machine matters to a reader: a PPO run amplifies the last bits of its CPU kernels,
which differ by instruction set, so the same seed gives other numbers on another processor."""

from __future__ import annotations

import functools
import os
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


# CPU flags -> the instruction-set level PyTorch's CPU kernels dispatch on (ATen's capability
# names), most capable first.
_ISA_LEVELS = (("avx512f", "AVX512"), ("avx2", "AVX2"), ("asimd", "NEON"))


@functools.lru_cache(maxsize=1)
def machine_tags() -> dict[str, str]:
    """``machine.cpu`` (the model name), ``machine.isa`` (the SIMD level the kernels use) and
    ``machine.cores`` of the machine this process runs on, read from ``/proc/cpuinfo``."""
    cpu, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "cpu model") and not cpu:
                    cpu = " ".join(value.split())
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if cpu and flags:
                    break
    except OSError:
        pass
    isa = next((name for flag, name in _ISA_LEVELS if flag in flags), "DEFAULT")
    if isa == "AVX512" and os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
        isa = "AVX2"  # the kernels are held to AVX2 by the environment
    return {
        "machine.cpu": cpu or "unknown",
        "machine.isa": isa,
        "machine.cores": str(os.cpu_count() or 0),
    }


def machine_text(tags: dict[str, str]) -> str:
    """One line for a reader: ``AMD EPYC 7B13, AVX2, 2 cores, 1 torch thread, cpu``."""
    parts = [tags.get("machine.cpu", "unknown"), tags.get("machine.isa", "")]
    if tags.get("machine.cores"):
        parts.append(f"{tags['machine.cores']} cores")
    threads = tags.get("machine.torch_threads")
    if threads:
        parts.append(f"{threads} torch thread{'' if threads == '1' else 's'}")
    if tags.get("machine.device"):
        parts.append(tags["machine.device"])
    return ", ".join(p for p in parts if p)
