"""Checks on the results directory before anything is written there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.configtools import ConfigError

MIN_FREE_BYTES = 50 * 1024 * 1024


def ensure_results_dir(path: Path | str) -> Path:
    """Create ``path`` (mode 0755, never world-writable) and check it is writable and not full."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: cannot create it ({err.strerror})") from None
    probe = p / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: not writable ({err.strerror})") from None
    mode = p.stat().st_mode
    if mode & 0o002:
        os.chmod(p, mode & ~0o002)
    free = shutil.disk_usage(p).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"results dir {str(p)!r}: only {free // (1024 * 1024)} MiB free (need at least "
            f"{MIN_FREE_BYTES // (1024 * 1024)} MiB)"
        )
    return p
