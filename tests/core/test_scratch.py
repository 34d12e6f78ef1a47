"""Temporary directories named after their owner process (harness/core/scratch.py): what a
SIGKILLed owner left is removed by the next process that makes one of the same prefix; nothing
of a live owner, another prefix, another namespace or an older unnamed directory is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.core import scratch

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "harness-engine-"


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_owners_directory_is_swept_and_every_other_entry_kept(tmp_path):
    ns = scratch._namespace()
    dead = _dead_pid()
    stale = tmp_path / f"{PREFIX}{dead}.{ns}-abc"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.safetensors").write_bytes(b"x" * 1024)
    stale_file = tmp_path / f"{PREFIX}{dead}.{ns}-file"
    stale_file.write_text("x")
    kept = [
        tmp_path / f"{PREFIX}{os.getpid()}.{ns}-live",  # a live owner (this process)
        tmp_path / f"{PREFIX}{dead}.{int(ns) + 1}-other-namespace",  # pids of another namespace
        tmp_path / f"{PREFIX}k2j_x9qa",  # made before owners were named: no owner to judge
        tmp_path / f"{PREFIX}{dead}-nonamespace",
        tmp_path / f"harness-trl-engine-{dead}.{ns}-abc",  # another prefix
    ]
    for path in kept:
        path.mkdir()
    removed = scratch.sweep_dead_owners(tmp_path, PREFIX)
    assert sorted(removed) == sorted([stale, stale_file])
    assert not stale.exists() and not stale_file.exists()
    assert all(path.is_dir() for path in kept)


def test_owner_of_reads_only_names_of_this_namespace():
    ns = scratch._namespace()
    assert scratch.owner_of(f"{PREFIX}123.{ns}-x", PREFIX) == 123
    assert scratch.owner_of(f"{PREFIX}123.{ns}0-x", PREFIX) is None
    assert scratch.owner_of(f"{PREFIX}12a.{ns}-x", PREFIX) is None
    assert scratch.owner_of(f"other-123.{ns}-x", PREFIX) is None


def test_pid_running():
    assert scratch.pid_running(os.getpid())
    assert not scratch.pid_running(_dead_pid())
    assert not scratch.pid_running(0)


SLEEPER = """
import sys, time
sys.path.insert(0, {root!r})
from harness.core.scratch import owned_temp_dir
d = owned_temp_dir({prefix!r})
open(d + "/model.safetensors", "wb").write(b"x" * 4096)
open({marker!r}, "w").write(d)
time.sleep(600)
"""


def test_the_directory_of_a_killed_owner_is_removed_when_the_next_one_is_made(
    tmp_path, monkeypatch
):
    """``kill -9`` leaves the owner's directory (no cleanup runs); the next ``owned_temp_dir``
    of the prefix removes it and makes its own."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = tmp_path / "made"
    code = SLEEPER.format(root=str(ROOT), prefix=PREFIX, marker=str(marker))
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        end = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()):
            assert proc.poll() is None, "the owner ended before making its directory"
            assert time.monotonic() < end, "waited 120 s for the owner's directory"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = Path(marker.read_text())
    assert (left / "model.safetensors").is_file()  # what SIGKILL leaves behind

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    mine = Path(scratch.owned_temp_dir(PREFIX))
    assert not left.exists()
    assert [p.name for p in tmp.iterdir()] == [mine.name]
    assert mine.name.startswith(f"{PREFIX}{os.getpid()}.")
