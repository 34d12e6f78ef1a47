"""Temporary directories named after the process that owns them, swept once it is gone.

A process ended by SIGKILL (``kill -9``, the OOM killer, a sweep's stop that ran out of grace)
runs no cleanup, so what it wrote under ``$TMPDIR`` stays there: for an inference engine, a full
float32 copy of the model.  Each directory made here carries its owner in its name,
``<prefix><pid>.<namespace>-<random>``, and making a new one first removes this user's
directories of the same prefix whose owner no longer runs.

Why the pid namespace in the name: a ``$TMPDIR`` shared between containers (a host ``/tmp``
mounted into each) holds directories whose pids mean nothing here; only directories made in this
namespace are judged.  A pid that a new process reused keeps its directory until that process
ends too: a directory is never taken from a live owner.  Names without an owner (made before
this module) are left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _namespace() -> str:
    """This process's pid namespace (its inode on Linux; ``0`` where there is none to read)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def pid_running(pid: int) -> bool:
    """True when process ``pid`` exists in this namespace (a zombie counts until reaped)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def owner_of(name: str, prefix: str) -> int | None:
    """The owner pid in ``name`` (``<prefix><pid>.<namespace>-...``) when it names one of this
    namespace, else None."""
    if not name.startswith(prefix):
        return None
    owner, sep, _ = name[len(prefix) :].partition("-")
    pid, dot, namespace = owner.partition(".")
    if not (sep and dot and pid.isdigit()) or namespace != _namespace():
        return None
    return int(pid)


def sweep_dead_owners(directory: Path, prefix: str) -> list[Path]:
    """Remove this user's entries ``<prefix><pid>.<namespace>-*`` of ``directory`` whose owner
    ``pid`` has ended; the paths removed.  Best effort: an entry that cannot be read or removed
    is left for a later sweep."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        pid = owner_of(entry.name, prefix)
        if pid is None or pid_running(pid):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def owned_temp_dir(prefix: str) -> str:
    """A new directory ``$TMPDIR/<prefix><pid>.<namespace>-<random>`` owned by this process,
    made after removing those of ``prefix`` that dead owners left (module docstring)."""
    sweep_dead_owners(Path(tempfile.gettempdir()), prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.{_namespace()}-")


__all__ = ["owned_temp_dir", "owner_of", "pid_running", "sweep_dead_owners"]
