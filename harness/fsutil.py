"""Checks on the results directory before anything is written there, and the file-mode policy.

Why explicit modes: containers often run with umask 000, where every file a library creates
(the Optuna journal, MLflow's database and artifacts, reports) would be world-writable.  The CLI
therefore raises the process umask to at least 022 before it creates anything (children inherit
it), and directories the harness creates get mode 0755 explicitly.  A directory the harness did
not create is never chmod-ed: ``--results-dir /tmp`` (a shared sticky directory) must keep its
mode.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.configtools import ConfigError

MIN_FREE_BYTES = 50 * 1024 * 1024
DIR_MODE = 0o755


def restrict_umask() -> None:
    """Mask at least group/other write for every file this process (and its children) creates."""
    current = os.umask(0o022)
    os.umask(current | 0o022)


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` with mode 0755 on each directory it creates (and only on those).

    Returns the directories created, outermost first.
    """
    missing: list[Path] = []
    cur = path
    while not cur.exists() and not cur.is_symlink():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # another worker made it first: not ours to chmod
        os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask; make it exact
        created.append(d)
    return created


def ensure_results_dir(path: Path | str) -> Path:
    """Create ``path`` (mode 0755) if missing and check it is a writable directory, not full."""
    p = Path(path)
    try:
        make_dirs(p)
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: cannot create it ({err.strerror})") from None
    if not p.is_dir():
        raise ConfigError(f"results dir {str(p)!r}: exists and is not a directory")
    probe = p / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"results dir {str(p)!r}: not writable ({err.strerror})") from None
    free = shutil.disk_usage(p).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"results dir {str(p)!r}: only {free // (1024 * 1024)} MiB free (need at least "
            f"{MIN_FREE_BYTES // (1024 * 1024)} MiB)"
        )
    return p
